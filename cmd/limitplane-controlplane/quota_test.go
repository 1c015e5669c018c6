package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/limitplane/limitplane/dataplane/lease"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
)

// leaseAt sends one grant request of group with tok to the control plane
// at addr and returns its answer.
func leaseAt(t *testing.T, addr, group, tok string, req lease.GrantRequest) lease.BatchAnswer {
	t.Helper()
	body, err := json.Marshal(lease.Batch{Grants: []lease.GrantRequest{req}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := syncpb.NewQuotaServiceClient(dial(t, addr, insecure.NewCredentials())).Lease(context.Background(),
		&syncpb.LeaseRequest{Token: tok, Group: group, Body: body})
	if err != nil {
		t.Fatalf("Lease: %v", err)
	}
	var a lease.BatchAnswer
	if err := json.Unmarshal(resp.GetBody(), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestQuotaLeaseSurvivesKill9: the program serves QuotaService on the
// sync port; a grant answered before the process is killed with SIGKILL
// is answered again, the same, by the restarted process, which grants
// only what is left and keeps the period's anchor.
func TestQuotaLeaseSurvivesKill9(t *testing.T) {
	dir := t.TempDir()
	args := []string{"-data", filepath.Join(dir, "cp.db"), "-dataplanes", dataPlanesFile(t, dir), "-sync-listen", "127.0.0.1:0"}
	env := []string{"LP_TEST_DP1_TOKEN=" + dp1Token}
	p := startEnv(t, env, args...)
	if st, b := do(t, "PUT", p.base+"/api/policies/g", `{"quota":{"max":1000,"renewal":"1h","global":{"mode":"strict"}}}`); st != 200 {
		t.Fatal(st, b)
	}
	h := identity.HashKey("alice")
	if st, b := do(t, "PUT", p.base+"/api/keys/"+h.String(), `{"policies":["g"]}`); st != 200 {
		t.Fatal(st, b)
	}
	// The key's epoch is the control plane's: read it.
	st, b := do(t, "GET", p.base+"/api/keys/"+h.String(), "")
	var k struct {
		QuotaEpoch uint64 `json:"quota_epoch"`
	}
	if st != 200 || json.Unmarshal([]byte(b), &k) != nil {
		t.Fatal(st, b)
	}
	key := lease.EntryKey{Consumer: h.ConsumerID(), Policy: "g", Epoch: k.QuotaEpoch}
	id := lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}
	a1 := leaseAt(t, p.sync, "dp1", dp1Token, lease.GrantRequest{Entry: key, ID: id, Want: 600})
	if len(a1.Grants) != 1 || a1.Grants[0].Amount != 600 {
		t.Fatalf("first answer %+v", a1)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()

	p = startEnv(t, env, args...)
	a2 := leaseAt(t, p.sync, "dp1", dp1Token, lease.GrantRequest{Entry: key, ID: id, Want: 600})
	g1, g2 := a1.Grants[0], a2.Grants[0]
	// The same lease: the repeat counts its times from its own answer, so
	// the lease and the period end where they ended at first.
	if len(a2.Grants) != 1 || !g2.Entry.PeriodStart.Equal(g1.Entry.PeriodStart) || g2.Amount != g1.Amount ||
		g2.Duration > g1.Duration || g1.PeriodLeft-g2.PeriodLeft != g1.Duration-g2.Duration || g2.Remaining != g1.Remaining {
		t.Fatalf("repeated after SIGKILL: %+v, want the lease of %+v with the same ends", a2, a1)
	}
	a3 := leaseAt(t, p.sync, "dp2", dp2Token, lease.GrantRequest{Entry: key, ID: lease.RequestID{DataPlane: "dp2", Token: 1, Seq: 1}, Want: 600})
	if len(a3.Grants) != 1 || a3.Grants[0].Amount != 400 || !a3.Grants[0].Entry.PeriodStart.Equal(g1.Entry.PeriodStart) {
		t.Fatalf("dp2 after the restart: %+v, want the 400 left of the same period", a3)
	}
	st, b = do(t, "GET", p.base+"/api/usage/dataplanes", "")
	want := `{"dataplanes":[{"data_plane":"dp1","leases":1,"granted":600,"reports":0,"spent":0,"floor_spent":0,"admitted":0,"refused":0},` +
		`{"data_plane":"dp2","leases":1,"granted":400,"reports":0,"spent":0,"floor_spent":0,"admitted":0,"refused":0}]}`
	if st != 200 || b != want {
		t.Fatalf("usage: %d %s\nwant %s", st, b, want)
	}
	if st, b := do(t, "GET", p.base+"/api/usage/keys/"+h.String(), ""); st != 200 || !strings.Contains(b, fmt.Sprintf(`"committed":%d`, 1000)) {
		t.Fatalf("key usage: %d %s", st, b)
	}
}
