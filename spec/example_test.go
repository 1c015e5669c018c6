package spec_test

import (
	"encoding/json"
	"fmt"

	"github.com/limitplane/limitplane/spec"
)

// A snapshot as a control plane would send it, checked and turned into the
// engine's policies.
func Example() {
	var s spec.Snapshot
	err := json.Unmarshal([]byte(`{
		"revision": 3,
		"policies": [{"id": "default", "rate": {"requests": 5, "per": "1m"}, "quota": {"max": 100, "renewal": "24h"}}],
		"keys": [{"key_hash": "sha256:fb26de5bd8d2479f8dff2c28ddb73a4617bd9d89d91800a592c056bff6f6cdb2", "policies": ["default"]}],
		"apis": [{"id": "echo", "listen_path": "/echo/", "target": "builtin:echo", "tags": ["eu"]}]
	}`), &s)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := s.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	p := s.CorePolicies()[0]
	fmt.Printf("revision %d: policy %s allows %d per %v, quota %d per %v\n", s.Revision, p.ID, p.Rate.Rate, p.Rate.Period, p.Quota.Max, p.Quota.Renewal)

	s.Policies[0].Rate.Per = 0
	s.APIs[0].ListenPath = "echo"
	fmt.Println(s.Validate())
	// Output:
	// revision 3: policy default allows 5 per 1m0s, quota 100 per 24h0m0s
	// spec: policies[0].rate.per: missing (the period, like 1s, 1m or 24h)
	// spec: apis[0].listen_path: "echo" must start with "/"
}
