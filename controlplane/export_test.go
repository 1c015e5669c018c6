package controlplane_test

import (
	"context"
	"encoding/json"
	"github.com/limitplane/limitplane/internal/pgtest"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/spec"
)

// openStore opens a new, empty store of one kind for a test, closed at
// its end.
type openStore func(t *testing.T) controlplane.Store

// importTargets are the stores a state is moved into by export and
// import: another bbolt file, and PostgreSQL (a server of its own,
// pgtest), the move from the embedded store to a highly available one.
var importTargets = []struct {
	name string
	open openStore
}{
	{"bolt", func(t *testing.T) controlplane.Store { s, _ := open(t, controlplane.BoltOptions{}); return s }},
	{"postgres", func(t *testing.T) controlplane.Store {
		return openPostgres(t, pgtest.Start(t, pgtest.Options{}).ConnString(), controlplane.PostgresOptions{})
	}},
}

// adminOver serves the admin API over s on a real HTTP server and returns
// its URL.
func adminOver(t testing.TB, s controlplane.Store, o controlplane.AdminOptions) string {
	t.Helper()
	o.Store, o.Token = s, token
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	h, err := controlplane.Admin(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// mustCall makes the admin calls in order and fails the test on the
// first that does not answer 2xx.
func mustCall(t *testing.T, base string, calls ...[3]string) {
	t.Helper()
	for _, c := range calls {
		if a := call(t, c[0], base+c[1], c[2]); a.status/100 != 2 {
			t.Fatalf("%s %s: %d %s", c[0], c[1], a.status, a.body)
		}
	}
}

// follower is a gateway that follows a control plane's sync server
// through a real dataplane.Agent over real gRPC.
type follower struct {
	gw    *gateway.Gateway
	agent *dataplane.Agent
	url   string // the gateway's HTTP server
}

const followToken = "dp-follow-secret"

// serveSync starts a sync server over s (PollInterval poll; a store that
// is not a RevisionWatcher is polled) taking followToken for group g with
// the tags eu and us, and a gRPC server for it on a loopback port; both
// stop at the test's end. It returns the server's address.
func serveSync(t *testing.T, s controlplane.Store, poll time.Duration) string {
	t.Helper()
	srv, err := controlplane.NewSyncServer(controlplane.SyncOptions{
		Store: s, PollInterval: poll, Log: slog.New(slog.DiscardHandler),
		Tokens: []controlplane.DataPlaneToken{{Hash: controlplane.HashToken(followToken), Group: "g", Tags: []string{"eu", "us"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	syncpb.RegisterSyncServiceServer(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	t.Cleanup(func() {
		srv.Shutdown()
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// follow starts a sync server over s (PollInterval poll; a store that
// is not a RevisionWatcher is polled), a gRPC server for it and a
// gateway whose agent follows it with the tags eu and us; all stop at
// the test's end.
func follow(t *testing.T, s controlplane.Store, poll time.Duration) *follower {
	t.Helper()
	addr := serveSync(t, s, poll)
	store := memory.New(memory.Options{})
	t.Cleanup(func() { store.Close() })
	gw, err := gateway.New(gateway.Options{Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	hs := httptest.NewServer(gw)
	t.Cleanup(hs.Close)
	a, err := dataplane.New(dataplane.AgentOptions{Target: gw, Address: addr, Group: "g", Tags: []string{"eu", "us"},
		Token: followToken, GatewayID: "gw-1", Logger: slog.New(slog.DiscardHandler),
		Backoff: dataplane.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run: %v", err)
		}
	})
	return &follower{gw: gw, agent: a, url: hs.URL}
}

// waitApplied waits (20 s at most) until the gateway runs revision rev.
func (f *follower) waitApplied(t *testing.T, rev uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for f.agent.Status().AppliedRevision != rev {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway runs revision %d (%+v), want %d", f.agent.Status().AppliedRevision, f.agent.Status(), rev)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// statuses sends n requests to path with the API key and returns their
// statuses, in order.
func (f *follower) statuses(t *testing.T, path, key string, n int) []int {
	t.Helper()
	var out []int
	for range n {
		req, err := http.NewRequest("GET", f.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp.StatusCode)
	}
	return out
}

func wantStatuses(t *testing.T, what string, got []int, want ...int) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: statuses %v, want %v", what, got, want)
	}
}

// objectsJSON is a snapshot's objects in spec's JSON, without its
// revision, each list in ID (hash) order: what two stores, and a gateway,
// must agree on.
func objectsJSON(t *testing.T, s *spec.Snapshot) string {
	t.Helper()
	c := *s
	c.Revision = 0
	c.Keys = slices.SortedFunc(slices.Values(c.Keys), func(a, b spec.Key) int { return strings.Compare(a.KeyHash, b.KeyHash) })
	c.Policies = slices.SortedFunc(slices.Values(c.Policies), func(a, b spec.Policy) int { return strings.Compare(a.ID, b.ID) })
	c.APIs = slices.SortedFunc(slices.Values(c.APIs), func(a, b spec.API) int { return strings.Compare(a.ID, b.ID) })
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// snapshotOf reads s's snapshot for tags.
func snapshotOf(t *testing.T, s controlplane.Store, tags []string) *spec.Snapshot {
	t.Helper()
	snap, err := s.Snapshot(context.Background(), tags)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// sourceState fills the admin API at base with a state that uses every
// kind of object: tagged and untagged APIs, a JWT API with a secret
// reference, policies with rate, quota and apis, keys with policies,
// api_limits, expiry, inactive, quota resets (key-wide and per API), a
// deleted key, and 2,500 keys of a batch (more than an export page). Its
// revision ends at 12; key "q1" (quota 3 an hour on gold) has quota epoch
// 10, and "q2" an api_limits epoch 9 for API eu.
func sourceState(t *testing.T, base string) {
	t.Helper()
	mustCall(t, base,
		[3]string{"PUT", "/api/policies/gold", `{"rate":{"requests":100,"per":"1s"},"quota":{"max":3,"renewal":"1h"}}`},
		[3]string{"PUT", "/api/apis/eu", `{"listen_path":"/eu/","target":"builtin:echo","tags":["eu"]}`},
		[3]string{"PUT", "/api/policies/free", `{"rate":{"requests":1,"per":"1s","algorithm":"sliding_window"},"apis":["eu"],"shadow":true}`},
		[3]string{"PUT", "/api/apis/us", `{"listen_path":"/us/","target":"builtin:echo","tags":["us"]}`},
		[3]string{"PUT", "/api/apis/tokens", `{"listen_path":"/tokens/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["HS256"],"keys":[{"secret_env":"LP_EXPORT_TEST_JWT"}],"default_policies":["gold"]}}`},
		[3]string{"POST", "/api/keys", `{"key":"q1","policies":["gold"],"expires":"2030-01-02T03:04:05Z"}`},
		[3]string{"POST", "/api/keys", `{"key":"q2","api_limits":{"eu":{"quota":{"max":2,"renewal":"1h"}},"us":{"rate":{"requests":2,"per":"1s"}}}}`},
		[3]string{"POST", "/api/keys", `{"key":"off","policies":["gold"],"inactive":true}`},
		[3]string{"POST", "/api/keys/" + hash("q2") + "/reset-quota?api=eu", ""},
		[3]string{"POST", "/api/keys/" + hash("q1") + "/reset-quota", ""},
	)
	var keys strings.Builder
	keys.WriteString(`{"keys":[{"key":"gone","policies":["gold"]}`)
	for i := range 2500 {
		keys.WriteString(`,{"key":"bulk-` + strconv.Itoa(i) + `","policies":["gold"]}`)
	}
	keys.WriteString(`]}`)
	mustCall(t, base, [3]string{"POST", "/api/keys:batch", keys.String()})
	mustCall(t, base, [3]string{"DELETE", "/api/keys/" + hash("gone"), ""})
}

// TestExportImportMovesState moves a state from a Bolt store A to a new
// store B of each kind, through two real admin HTTP servers: B's export
// is streamed straight into A's import. B, which a gateway follows and
// which held a state of its own, then holds A's state in every object
// (for every view), reached it in one revision with its own history, and
// the gateway enforces it: quotas continue from their epochs, and a
// reset on B renews them although B's revisions are below the imported
// epochs.
func TestExportImportMovesState(t *testing.T) {
	for _, target := range importTargets {
		t.Run(target.name, func(t *testing.T) {
			ctx := context.Background()
			a, _ := open(t, controlplane.BoltOptions{})
			baseA := adminOver(t, a, controlplane.AdminOptions{})
			sourceState(t, baseA)
			if got := revision(t, a); got != 12 {
				t.Fatalf("A's revision %d, want 12", got)
			}

			b := target.open(t)
			baseB := adminOver(t, b, controlplane.AdminOptions{})
			mustCall(t, baseB,
				[3]string{"PUT", "/api/policies/old", `{"rate":{"requests":1,"per":"1s"}}`},
				[3]string{"PUT", "/api/apis/eu", `{"listen_path":"/old-eu/","target":"builtin:echo"}`},
				[3]string{"POST", "/api/keys", `{"key":"stale","policies":["old"]}`},
				[3]string{"POST", "/api/keys", `{"key":"q1","policies":["old"]}`},
			)
			f := follow(t, b, 5*time.Millisecond)
			f.waitApplied(t, 4)
			wantStatuses(t, "B's own key before the import", f.statuses(t, "/old-eu/x", "stale", 1), 200)
			histB, err := b.History(ctx)
			if err != nil {
				t.Fatal(err)
			}

			// Stream A's export into B's import: the body is never read whole
			// by the test either.
			exp, err := http.NewRequest("GET", baseA+"/api/export", nil)
			if err != nil {
				t.Fatal(err)
			}
			exp.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(exp)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.Header.Get("Limitplane-Revision") != "12" {
				t.Fatalf("export: %d %v", resp.StatusCode, resp.Header)
			}
			imp, err := http.NewRequest("POST", baseB+"/api/import", resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			imp.Header.Set("Authorization", "Bearer "+token)
			imp.Header.Set("Content-Type", "application/json")
			ir, err := http.DefaultClient.Do(imp)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(ir.Body)
			ir.Body.Close()
			if ir.StatusCode != 200 || string(body) != `{"revision":5}`+"\n" {
				t.Fatalf("import: %d %s", ir.StatusCode, body)
			}

			// Every object, in every view, as A has it.
			for _, tags := range [][]string{nil, {"eu"}, {"us"}, {"eu", "us"}} {
				sa, sb := snapshotOf(t, a, tags), snapshotOf(t, b, tags)
				if sb.Revision != 5 || objectsJSON(t, sb) != objectsJSON(t, sa) {
					t.Fatalf("tags %v: B at %d holds\n%.2000s\nA holds\n%.2000s", tags, sb.Revision, objectsJSON(t, sb), objectsJSON(t, sa))
				}
				if len(tags) == 2 && (len(sb.Keys) != 2503 || len(sb.Policies) != 2 || len(sb.APIs) != 3) {
					t.Fatalf("B: %d keys, %d policies, %d APIs; want 2503, 2, 3", len(sb.Keys), len(sb.Policies), len(sb.APIs))
				}
			}
			expect(t, call(t, "GET", baseB+"/api/keys/"+hash("q1"), ""), 200, `{"key_hash":"`+hash("q1")+`","policies":["gold"],"expires":"2030-01-02T03:04:05Z","quota_epoch":10}`)
			expect(t, call(t, "GET", baseB+"/api/keys/"+hash("q2"), ""), 200, `{"key_hash":"`+hash("q2")+`","api_limits":{"eu":{"quota":{"max":2,"renewal":"1h0m0s"},"quota_epoch":9},"us":{"rate":{"requests":2,"per":"1s"},"quota_epoch":7}},"quota_epoch":7}`)
			// One revision, B's own history.
			changes, err := b.ChangesSince(ctx, 4)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range changes {
				if c.Revision != 5 {
					t.Fatalf("change %s %s %s at revision %d, want all at 5", c.Op, c.Object, c.ID, c.Revision)
				}
			}
			if h, err := b.History(ctx); err != nil || h != histB {
				t.Fatalf("B's history %q, %v; want its own %q", h, err, histB)
			}

			// The gateway following B enforces A's state.
			f.waitApplied(t, 5)
			if got, want := objectsJSON(t, f.gw.Snapshot()), objectsJSON(t, snapshotOf(t, a, []string{"eu", "us"})); got != want {
				t.Fatalf("the gateway runs\n%.2000s\nwant\n%.2000s", got, want)
			}
			wantStatuses(t, "q1 on gold (quota 3 an hour)", f.statuses(t, "/eu/x", "q1", 4), 200, 200, 200, 429)
			wantStatuses(t, "q2 on eu (api_limits quota 2)", f.statuses(t, "/eu/x", "q2", 3), 200, 200, 429)
			wantStatuses(t, "an inactive key", f.statuses(t, "/eu/x", "off", 1), 403)
			wantStatuses(t, "B's own key, gone with the import", f.statuses(t, "/eu/x", "stale", 1), 403)
			wantStatuses(t, "A's deleted key", f.statuses(t, "/eu/x", "gone", 1), 403)
			wantStatuses(t, "a bulk key", f.statuses(t, "/us/x", "bulk-2499", 1), 200)
			wantStatuses(t, "B's old listen path", f.statuses(t, "/old-eu/x", "q1", 1), 404)

			// A reset on B renews the quota: the epoch rises above the
			// imported 10 although B's revision is 6.
			expect(t, call(t, "POST", baseB+"/api/keys/"+hash("q1")+"/reset-quota", ""), 200, `{"key_hash":"`+hash("q1")+`","revision":6}`)
			expect(t, call(t, "POST", baseB+"/api/keys/"+hash("q2")+"/reset-quota?api=eu", ""), 200, `{"key_hash":"`+hash("q2")+`","revision":7}`)
			expect(t, call(t, "GET", baseB+"/api/keys/"+hash("q1"), ""), 200, `{"key_hash":"`+hash("q1")+`","policies":["gold"],"expires":"2030-01-02T03:04:05Z","quota_epoch":11}`)
			expect(t, call(t, "GET", baseB+"/api/keys/"+hash("q2"), ""), 200, `{"key_hash":"`+hash("q2")+`","api_limits":{"eu":{"quota":{"max":2,"renewal":"1h0m0s"},"quota_epoch":10},"us":{"rate":{"requests":2,"per":"1s"},"quota_epoch":7}},"quota_epoch":7}`)
			f.waitApplied(t, 7)
			wantStatuses(t, "q1 after the reset on B", f.statuses(t, "/eu/x", "q1", 4), 200, 200, 200, 429)
			wantStatuses(t, "q2 after the reset on B", f.statuses(t, "/eu/x", "q2", 3), 200, 200, 429)

			// Importing what B holds changes nothing: no new revision.
			again := call(t, "GET", baseB+"/api/export", "")
			expect(t, call(t, "POST", baseB+"/api/import", again.body), 200, `{"revision":7}`)
		})
	}
}

// TestImportRefusesBadDocuments: a truncated document, an unknown format
// version, objects that do not decode or leave an invalid state, a body
// above the bound and bodies that are no document are refused with their
// exact answer, and the target is left as it was.
func TestImportRefusesBadDocuments(t *testing.T) {
	for _, target := range importTargets {
		t.Run(target.name, func(t *testing.T) {
			a, _ := open(t, controlplane.BoltOptions{})
			baseA := adminOver(t, a, controlplane.AdminOptions{})
			sourceState(t, baseA)
			doc := call(t, "GET", baseA+"/api/export", "").body

			b := target.open(t)
			const bound = 64 << 10
			baseB := adminOver(t, b, controlplane.AdminOptions{})
			bounded := adminOver(t, b, controlplane.AdminOptions{MaxBulkBytes: bound})
			mustCall(t, baseB,
				[3]string{"PUT", "/api/policies/mine", `{"rate":{"requests":1,"per":"1s"}}`},
				[3]string{"POST", "/api/keys", `{"key":"mine","policies":["mine"]}`},
			)
			before := call(t, "GET", baseB+"/api/export", "").body

			// A truncated export, cut anywhere: between tokens, inside a
			// string, a number, a key.
			small := `{"format_version":1,"revision":11,"policies":[{"id":"p","rate":{"requests":1,"per":"1s"}}],"apis":[],"keys":[{"key_hash":"` + hash("x") + `","policies":["p"],"quota_epoch":3}]}`
			for _, cut := range []int{1, 2, 10, 19, 20, 34, 46, 60, 75, 95, 100, 150, len(small) - 2, len(small) - 1} {
				expect(t, call(t, "POST", baseB+"/api/import", small[:cut]), 400, `{"error":"body ends before the document does (truncated?); nothing was changed"}`)
			}
			expect(t, call(t, "POST", baseB+"/api/import", doc[:len(doc)/2]), 400, `{"error":"body ends before the document does (truncated?); nothing was changed"}`)

			for _, c := range []struct {
				name, body string
				status     int
				answer     string
			}{
				{"format version 2", `{"format_version":2,"policies":[]}`, 422,
					`{"error":"the document's format version is unknown; nothing was changed","problems":[{"path":"format_version","problem":"2: this control plane reads version 1; export with a control plane of this version or an older one"}]}`},
				{"format version as a string", `{"format_version":"1"}`, 422,
					`{"error":"the document's format version is unknown; nothing was changed","problems":[{"path":"format_version","problem":"\"1\": this control plane reads version 1; export with a control plane of this version or an older one"}]}`},
				{"format version after the objects", `{"keys":[],"format_version":0}`, 422,
					`{"error":"the document's format version is unknown; nothing was changed","problems":[{"path":"format_version","problem":"0: this control plane reads version 1; export with a control plane of this version or an older one"}]}`},
				{"objects that do not decode", `{"format_version":1,"revision":-1,"policies":[{"id":"p","rate":{"requests":1,"per":1}},{"id":"q","colour":"red"}],"apis":[{"id":"a","listen_path":7}],"keys":[{"key_hash":"` + hash("x") + `","policies":["p"],"quota_epoch":"3"}]}`, 422,
					`{"error":"the document has objects that cannot be read; nothing was changed","problems":[` +
						`{"path":"revision","problem":"-1 is not a revision (a whole number from 0)"},` +
						`{"path":"policies[0].rate.per","problem":"number 1: a duration is a string with its unit, like \"1h\" or \"500ms\""},` +
						`{"path":"policies[1]","problem":"not a policy: unknown field \"colour\""},` +
						`{"path":"apis[0]","problem":"not a API: cannot unmarshal number into Go struct field API.listen_path of type string"},` +
						`{"path":"keys[0]","problem":"not a key: cannot unmarshal string into Go struct field Key.quota_epoch of type uint64"}]}`},
				{"an invalid state", `{"format_version":1,"policies":[{"id":"p","rate":{"requests":1,"per":"1s"}},{"id":"p"}],"apis":[{"id":"a","listen_path":"/a/","target":"builtin:echo","tags":["x"]},{"id":"b","listen_path":"/a/","target":"builtin:echo","tags":["x"]}],"keys":[{"key_hash":"` + hash("x") + `","policies":["q"]},{"key_hash":"` + strings.ToUpper(hash("x")[7:]) + `"}]}`, 422,
					`{"error":"the document is not a valid configuration; nothing was changed","problems":[` +
						`{"path":"policies[1].id","problem":"duplicate policy id \"p\" (first at policies[0].id)"},` +
						`{"path":"apis[1].listen_path","problem":"\"/a/\" is the same path as apis[0].listen_path"},` +
						`{"path":"keys[0].policies[0]","problem":"unknown policy \"q\""},` +
						`{"path":"keys[1].key_hash","problem":"\"` + strings.ToUpper(hash("x")[7:]) + `\" is not sha256:\u003c64 hex digits\u003e"},` +
						`{"path":"keys[1].policies","problem":"a key needs at least one policy (or api_limits)"}]}`},
				{"a key named twice in two cases", `{"keys":[{"key_hash":"` + hash("x") + `","policies":["mine"]},{"key_hash":"` + strings.Replace(strings.ToUpper(hash("x")), "SHA256", "sha256", 1) + `","policies":["mine"]}],"policies":[{"id":"mine"}],"apis":[]}`, 422,
					`{"error":"the document is not a valid configuration; nothing was changed","problems":[{"path":"keys[1].key_hash","problem":"same key as keys[0]"}]}`},
				{"lists left out", `{"policies":[]}`, 422, `{"error":"the document leaves a list out, and an import replaces the whole state; nothing was changed","problems":[` +
					`{"path":"apis","problem":"missing: give every list (an empty list, [], deletes them all)"},{"path":"keys","problem":"missing: give every list (an empty list, [], deletes them all)"}]}`},
				{"an empty object", `{}`, 422, `{"error":"the document leaves a list out, and an import replaces the whole state; nothing was changed","problems":[` +
					`{"path":"policies","problem":"missing: give every list (an empty list, [], deletes them all)"},{"path":"apis","problem":"missing: give every list (an empty list, [], deletes them all)"},{"path":"keys","problem":"missing: give every list (an empty list, [], deletes them all)"}]}`},
				{"a member named twice", `{"policies":[],"Policies":[]}`, 400, `{"error":"body names member \"Policies\" twice"}`},
				{"a member named twice in a key", `{"keys":[{"key_hash":"` + hash("x") + `","policies":["p"],"Policies":[]}]}`, 400, `{"error":"body names member keys[0].\"Policies\" twice"}`},
				{"an unknown member", `{"format_version":1,"secrets":[]}`, 400, `{"error":"body has member secrets, which an export document does not (it has format_version, revision, policies, apis, keys)"}`},
				{"a list that is not one", `{"keys":{}}`, 422, `{"error":"the document cannot be read; nothing was changed","problems":[{"path":"keys","problem":"not a list"}]}`},
				{"data after the document", `{"policies":[]} {}`, 400, `{"error":"body has data after the JSON object"}`},
				{"not UTF-8", "{\"policies\":[{\"id\":\"p\xff\"}]}", 400, `{"error":"body is not valid UTF-8 (in policies[0])"}`},
				{"JSON null", `null`, 400, `{"error":"body is JSON null; want a JSON object"}`},
				{"an array", `[]`, 400, `{"error":"body is not a JSON object; want an export document (GET /api/export)"}`},
				{"not JSON", `{"policies":[}`, 400, `{"error":"body is not valid JSON: invalid character '}' looking for beginning of value; nothing was changed"}`},
				{"above the bound", doc, 413, `{"error":"body: larger than 65536 bytes (AdminOptions.MaxBulkBytes); nothing was changed"}`},
			} {
				if c.status == 413 && len(c.body) <= bound {
					t.Fatalf("the document is only %d bytes", len(c.body))
				}
				url := baseB
				if c.status == 413 {
					url = bounded
				}
				a := call(t, "POST", url+"/api/import", c.body)
				if a.status != c.status || a.body != c.answer {
					t.Errorf("%s: got %d %s\nwant %d %s", c.name, a.status, a.body, c.status, c.answer)
				}
			}
			expect(t, call(t, "POST", baseB+"/api/import", ""), 400, `{"error":"body is empty; want an export document (GET /api/export)"}`)
			req, _ := http.NewRequest("POST", baseB+"/api/import", strings.NewReader(small))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "text/plain")
			if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 415 {
				t.Fatalf("text/plain: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			expect(t, callWith(t, "POST", baseB+"/api/import", small, ""), 401, `{"error":"no bearer token in the Authorization header"}`)

			expect(t, call(t, "GET", baseB+"/api/export", ""), 200, before)
			if got := revision(t, b); got != 2 {
				t.Fatalf("B's revision %d after refused imports, want 2", got)
			}
			// A document without format_version is read as version 1 (the
			// shape before the field); this one is valid and replaces all.
			expect(t, call(t, "POST", baseB+"/api/import", strings.Replace(small, `"format_version":1,`, "", 1)), 200, `{"revision":3}`)
			expect(t, call(t, "GET", baseB+"/api/export", ""), 200, strings.Replace(small, `"revision":11`, `"revision":3`, 1))
		})
	}
}

// BenchmarkExportImport moves a state of n keys (100,000 and 1,000,000)
// from one Bolt store to another through two admin HTTP servers, the export streamed
// into the import as TestExportImportMovesState does. Reported: doc-MB,
// the document's size; export-s, the export alone (read by a client that
// discards it); export-heap-MB, the process's peak Go heap above the
// start during it (both the server and the client are in this process);
// move-s and move-heap-MB, the same for export streamed into import (the
// import decodes every key, then writes them in one Update). Peak heap is
// sampled every 10 ms (runtime/metrics' live heap goal is not kept, so
// HeapAlloc after a forced GC at the start, max HeapAlloc while it runs).
// Run with -benchtime=1x; 1,000,000 keys take about 2 GB of memory and
// a few GB of disk.
func BenchmarkExportImport(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) { benchExportImport(b, n) })
	}
}

func benchExportImport(b *testing.B, n int) {
	ctx := context.Background()
	a, _ := open(b, controlplane.BoltOptions{})
	keys := bulkKeys(n)
	if _, err := a.Update(ctx, func(tx controlplane.Tx) error {
		if err := tx.PutPolicy(policy("gold", 10)); err != nil {
			return err
		}
		for _, k := range keys {
			if err := tx.PutKey(k); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	keys = nil
	serve := func(s controlplane.Store) string {
		h, err := controlplane.Admin(controlplane.AdminOptions{Store: s, Token: token, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		return srv.URL
	}
	baseA := serve(a)
	get := func() *http.Response {
		req, _ := http.NewRequest("GET", baseA+"/api/export", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("export: %v %v", resp, err)
		}
		return resp
	}
	var exportS, moveS, docMB, exportHeap, moveHeap float64
	b.ResetTimer()
	for range b.N {
		peak := peakHeap()
		t0 := time.Now()
		resp := get()
		size, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		exportS += time.Since(t0).Seconds()
		exportHeap += peak() / 1e6
		docMB = float64(size) / 1e6

		b.StopTimer()
		target, _ := open(b, controlplane.BoltOptions{})
		baseB := serve(target)
		b.StartTimer()
		peak = peakHeap()
		t0 = time.Now()
		resp = get()
		req, _ := http.NewRequest("POST", baseB+"/api/import", resp.Body)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		ir, err := http.DefaultClient.Do(req)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(ir.Body)
		ir.Body.Close()
		if ir.StatusCode != 200 {
			b.Fatalf("import: %d %s", ir.StatusCode, body)
		}
		moveS += time.Since(t0).Seconds()
		moveHeap += peak() / 1e6
		b.StopTimer()
		var got uint64
		if err := target.View(ctx, func(r controlplane.Reader) error { got = r.Revision(); return nil }); err != nil || got != 1 {
			b.Fatalf("target revision %d, %v", got, err)
		}
		target.Close()
		b.StartTimer()
	}
	b.StopTimer()
	nb := float64(b.N)
	b.ReportMetric(docMB, "doc-MB")
	b.ReportMetric(exportS/nb, "export-s")
	b.ReportMetric(exportHeap/nb, "export-heap-MB")
	b.ReportMetric(moveS/nb, "move-s")
	b.ReportMetric(moveHeap/nb, "move-heap-MB")
}

// peakHeap starts sampling the Go heap every 10 ms, after a GC; the
// function it returns stops and answers the highest HeapAlloc seen above
// the start, in bytes.
func peakHeap() func() float64 {
	base := liveHeap()
	var mu sync.Mutex
	var top int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			mu.Lock()
			top = max(top, int64(m.HeapAlloc))
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return float64(top - base)
	}
}

// slowStore is a Bolt store whose reads and writes start delay late, as
// a large state's take long.
type slowStore struct {
	*controlplane.Bolt
	delay time.Duration
}

func (s slowStore) Update(ctx context.Context, fn func(tx controlplane.Tx) error) (uint64, error) {
	time.Sleep(s.delay)
	return s.Bolt.Update(ctx, fn)
}

func (s slowStore) View(ctx context.Context, fn func(r controlplane.Reader) error) error {
	time.Sleep(s.delay)
	return s.Bolt.View(ctx, fn)
}

// TestExportImportOutlastServerTimeouts: an export and an import that
// take longer than the HTTP server's ReadTimeout and WriteTimeout (as
// cmd/limitplane-controlplane sets them: a million keys outlast them)
// complete: the handlers move their deadlines, and the server's read of
// the idle connection does not cancel them.
func TestExportImportOutlastServerTimeouts(t *testing.T) {
	b, _ := open(t, controlplane.BoltOptions{})
	s := slowStore{Bolt: b, delay: 1500 * time.Millisecond}
	h, err := controlplane.Admin(controlplane.AdminOptions{Store: s, Token: token, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	doc := `{"format_version":1,"revision":7,"policies":[{"id":"p","rate":{"requests":1,"per":"1s"}}],"apis":[],"keys":[{"key_hash":"` + hash("x") + `","policies":["p"],"quota_epoch":3}]}`
	expect(t, call(t, "POST", srv.URL+"/api/import", doc), 200, `{"revision":1}`)
	expect(t, call(t, "GET", srv.URL+"/api/export", ""), 200, strings.Replace(doc, `"revision":7`, `"revision":1`, 1))
}
