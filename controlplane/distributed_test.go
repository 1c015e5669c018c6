package controlplane_test

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// TestDistributedTravels: a policy's distributed flag (the Distributed
// Rate Limiter's switch) goes in through the admin API, is stored, and
// reaches data planes both ways a policy travels: as Changes to a view
// that holds every API, and in a snapshot to one that leaves APIs out
// (Select keeps it). The digest covers it: the same policy without the
// flag digests otherwise, so a data plane that lost it is repaired.
func TestDistributedTravels(t *testing.T) {
	f := newSyncFixture(t, 0)
	h, err := controlplane.Admin(controlplane.AdminOptions{Store: f.store, Token: token, DataPlanes: f.dps, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	eu := f.open(t, goodHello())
	recvSnapshot(t, eu)
	all := f.open(t, &syncpb.Hello{Group: "all-1", Tags: []string{"us", "eu"}, Token: syncTokenAll, GatewayId: "gw-all"})
	allRuns, _, _, _ := recvSnapshot(t, all)

	const body = `{"id":"shared","rate":{"requests":1000,"per":"1s","burst":100},"apis":["eu","us"],"distributed":true}`
	if a := call(t, "PUT", srv.URL+"/api/policies/shared", body); a.status != 200 {
		t.Fatalf("PUT: %d %s", a.status, a.body)
	}
	expect(t, call(t, "GET", srv.URL+"/api/policies/shared", ""), 200, body)

	ch := recvChanges(t, all)
	if got, want := changeStrings(ch), []string{`put policy shared ` + body}; !reflect.DeepEqual(got, want) {
		t.Fatalf("identity view: changes %q, want %q", got, want)
	}
	allRuns = applyChecked(t, f, allRuns, ch, []string{"eu", "us"})
	if p := findPolicy(allRuns, "shared"); p == nil || !p.Distributed || !p.Core().Distributed {
		t.Fatalf("identity view after Changes: policy %+v, want distributed", p)
	}

	euRuns, _, digest, _ := recvSnapshot(t, eu)
	p := findPolicy(euRuns, "shared")
	if p == nil || !p.Distributed || !reflect.DeepEqual(p.APIs, []string{"eu"}) {
		t.Fatalf("filtered view's snapshot: policy %+v, want distributed with apis [eu]", p)
	}
	if digest != protocol.Digest(euRuns) {
		t.Fatalf("snapshot digest %s, want %s", digest, protocol.Digest(euRuns))
	}
	p.Distributed = false
	if protocol.Digest(euRuns) == digest {
		t.Fatal("the digest does not change when distributed does: a data plane that lost the flag would not be repaired")
	}
	closeAndWait(t, eu)
	closeAndWait(t, all)
}

func findPolicy(s *spec.Snapshot, id string) *spec.Policy {
	for i := range s.Policies {
		if s.Policies[i].ID == id {
			return &s.Policies[i]
		}
	}
	return nil
}
