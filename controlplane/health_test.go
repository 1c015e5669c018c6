package controlplane_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/spec"
)

// /healthz answers while the process runs; /readyz answers 200 with the
// revision while the Bolt store takes writes (the check leaves the
// revision alone), and 503 with the reason once the store is closed.
func TestHealth(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	h, err := controlplane.Health(controlplane.HealthOptions{Store: s, CacheFor: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	expect(t, callWith(t, "GET", srv.URL+"/healthz", "", ""), 200, `{"ok":true}`)
	expect(t, callWith(t, "GET", srv.URL+"/readyz", "", ""), 200, `{"ready":true,"revision":0}`)
	if _, err := s.Update(t.Context(), func(tx controlplane.Tx) error {
		return tx.PutPolicy(spec.Policy{ID: "gold"})
	}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		expect(t, callWith(t, "GET", srv.URL+"/readyz", "", ""), 200, `{"ready":true,"revision":1}`)
	}
	s.Close()
	expect(t, callWith(t, "GET", srv.URL+"/readyz", "", ""), 503, `{"ready":false,"error":"controlplane: the store does not take writes: store closed"}`)
	expect(t, callWith(t, "GET", srv.URL+"/healthz", "", ""), 200, `{"ok":true}`)
	if _, err := controlplane.Health(controlplane.HealthOptions{}); err == nil {
		t.Fatal("Health without a store: no error")
	}
}
