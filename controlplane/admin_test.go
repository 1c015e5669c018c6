package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/limitplane/limitplane/internal/pgtest"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
)

const token = "s3cret-admin-token-0123456789abcd"

// server serves the admin API over a Bolt store on a real HTTP server.
func server(t testing.TB, o controlplane.BoltOptions, dps *controlplane.DataPlanes) (*controlplane.Bolt, string) {
	t.Helper()
	s, _ := open(t, o)
	h, err := controlplane.Admin(controlplane.AdminOptions{
		Store: s, Token: token, DataPlanes: dps,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

type answer struct {
	status int
	body   string
	header http.Header
}

// call makes a request with the admin token and returns the answer.
func call(t testing.TB, method, url, body string) answer {
	t.Helper()
	return callWith(t, method, url, body, "Bearer "+token)
}

func callWith(t testing.TB, method, url, body, auth string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" || method == "PUT" || method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, strings.TrimSuffix(string(b), "\n"), resp.Header}
}

// expect checks an answer's status and exact body.
func expect(t *testing.T, a answer, status int, body string) {
	t.Helper()
	if a.status != status || a.body != body {
		t.Fatalf("got %d %s\nwant %d %s", a.status, a.body, status, body)
	}
}

func TestAdminRefusesWithoutToken(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	const (
		missing   = `{"error":"no bearer token in the Authorization header"}`
		notBearer = `{"error":"Authorization scheme is not Bearer"}`
		wrong     = `{"error":"wrong bearer token"}`
	)
	for _, c := range []struct{ auth, body string }{
		{"", missing}, {"Bearer", missing}, {"Bearer ", missing},
		{"Bearer wrong", wrong}, {"Bearer " + token + "x", wrong},
		{"Basic " + token, notBearer}, {"Bearer" + token, notBearer}, {token, notBearer},
	} {
		for _, r := range [][2]string{{"GET", "/api/revision"}, {"PUT", "/api/policies/p"}, {"GET", "/api/dataplanes"}, {"GET", "/nowhere"}} {
			a := callWith(t, r[0], base+r[1], `{"rate":{"requests":1,"per":"1s"}}`, c.auth)
			expect(t, a, 401, c.body)
			if got := a.header.Get("WWW-Authenticate"); got != `Bearer realm="limitplane control plane"` {
				t.Fatalf("WWW-Authenticate %q", got)
			}
		}
	}
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":0}`)
	if _, err := controlplane.Admin(controlplane.AdminOptions{Store: &controlplane.Bolt{}}); err == nil {
		t.Fatal("Admin without a token: no error")
	}
}

// The Authorization field is read as the gateway reads it
// (identity.BearerToken): the scheme's name in any case, white space
// around the token trimmed; two Authorization fields are refused even
// when both carry the token. A token under MinTokenBytes is refused by
// Admin.
func TestAdminAuthorizationParsing(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	for _, auth := range []string{"bearer " + token, "BEARER " + token, "Bearer  " + token + " ", "bEaReR\t" + token} {
		expect(t, callWith(t, "GET", base+"/api/revision", "", auth), 200, `{"revision":0}`)
	}
	req, err := http.NewRequest("GET", base+"/api/revision", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Add("Authorization", "Bearer "+token)
	req.Header.Add("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || string(b) != `{"error":"ambiguous credentials: more than one Authorization header"}`+"\n" {
		t.Fatalf("two Authorization fields: %d %s, want 401", resp.StatusCode, b)
	}

	short := strings.Repeat("x", controlplane.MinTokenBytes-1)
	_, err = controlplane.Admin(controlplane.AdminOptions{Store: &controlplane.Bolt{}, Token: short})
	if want := "controlplane: admin: the token is 31 bytes, want at least 32 (e.g. openssl rand -hex 32)"; err == nil || err.Error() != want {
		t.Fatalf("a 31-byte token: %v, want %q", err, want)
	}
	if _, err := controlplane.Admin(controlplane.AdminOptions{Store: &controlplane.Bolt{}, Token: short + "x"}); err != nil {
		t.Fatalf("a 32-byte token: %v", err)
	}
}

// Every admin write leaves one audit line with the token's TokenID, the
// method, the path and the new revision (or the error); reads leave none.
func TestAdminAuditLines(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	var log lockedBuffer
	h, err := controlplane.Admin(controlplane.AdminOptions{Store: s, Token: token,
		Log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	expect(t, call(t, "PUT", srv.URL+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`), 200, `{"revision":1}`)
	call(t, "GET", srv.URL+"/api/policies/gold", "")
	expect(t, call(t, "DELETE", srv.URL+"/api/policies/gold", ""), 200, `{"revision":2}`)
	if a := call(t, "DELETE", srv.URL+"/api/policies/gold", ""); a.status != 404 {
		t.Fatalf("deleting it again: %d %s", a.status, a.body)
	}
	// Bulk writes are writes too: audited and counted like the others.
	expect(t, call(t, "POST", srv.URL+"/api/import", `{"policies":[{"id":"p"}],"apis":[],"keys":[]}`), 200, `{"revision":3}`)
	expect(t, call(t, "POST", srv.URL+"/api/keys:batch", `{"keys":[{"key_hash":"`+hash("k1")+`","policies":["p"]}]}`), 200, `{"revision":4,"key_hashes":["`+hash("k1")+`"]}`)
	id := controlplane.TokenID(token)
	if len(id) != len("sha256:")+12 || !strings.HasPrefix(controlplane.HashToken(token), id) {
		t.Fatalf("TokenID %q", id)
	}
	want := `level=INFO msg="controlplane: admin write" token=` + id + ` method=PUT path=/api/policies/gold revision=1` + "\n" +
		`level=INFO msg="controlplane: admin write" token=` + id + ` method=DELETE path=/api/policies/gold revision=2` + "\n" +
		`level=INFO msg="controlplane: admin write" token=` + id + ` method=DELETE path=/api/policies/gold error="no policy \"gold\""` + "\n" +
		`level=INFO msg="controlplane: admin write" token=` + id + ` method=POST path=/api/import revision=3` + "\n" +
		`level=INFO msg="controlplane: admin write" token=` + id + ` method=POST path=/api/keys:batch revision=4` + "\n"
	if got := log.String(); got != want {
		t.Fatalf("log:\n%s\nwant\n%s", got, want)
	}
}

// TestAdminObjects walks policies, APIs and keys through the API with the
// exact revision of each write, and refuses invalid writes with paths,
// leaving the state alone.
func TestAdminObjects(t *testing.T) {
	s, base := server(t, controlplane.BoltOptions{}, nil)
	h1 := hash("demo-key-1")
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"},"quota":{"max":1000,"renewal":"24h"}}`), 200, `{"revision":1}`)
	a := call(t, "GET", base+"/api/policies/gold", "")
	expect(t, a, 200, `{"id":"gold","rate":{"requests":5,"per":"1m0s"},"quota":{"max":1000,"renewal":"24h0m0s"}}`)
	if got := a.header.Get("Limitplane-Revision"); got != "1" {
		t.Fatalf("Limitplane-Revision %q, want 1", got)
	}
	expect(t, call(t, "PUT", base+"/api/apis/echo", `{"listen_path":"/echo/","target":"builtin:echo","tags":["eu"]}`), 200, `{"revision":2}`)
	expect(t, call(t, "GET", base+"/api/apis/echo", ""), 200, `{"id":"echo","listen_path":"/echo/","target":"builtin:echo","tags":["eu"]}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"demo-key-1","policies":["gold"]}`), 201, `{"key_hash":"`+h1+`","revision":3}`)
	expect(t, call(t, "GET", base+"/api/keys/"+strings.ToUpper(h1[7:])+"x", ""), 400, `{"error":"key hash \"`+strings.ToUpper(h1[7:])+`x\" is not sha256:\u003c64 hex digits\u003e"}`)
	expect(t, call(t, "GET", base+"/api/keys/sha256:"+strings.ToUpper(h1[7:]), ""), 200, `{"key_hash":"`+h1+`","policies":["gold"],"quota_epoch":3}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key_hash":"`+h1+`","policies":["gold"]}`), 409, `{"error":"key `+h1+` exists; PUT /api/keys/`+h1+` replaces it"}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"x","key_hash":"`+h1+`","policies":["gold"]}`), 400, `{"error":"give the key in plaintext (key) or by hash (key_hash), not both"}`)

	// Invalid writes: refused with paths, nothing changed.
	h2 := hash("k2")
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"k2","policies":["gold","nope"]}`), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[{"path":"keys[\"`+h2+`\"].policies[1]","problem":"unknown policy \"nope\""}]}`)
	expect(t, call(t, "DELETE", base+"/api/policies/gold", ""), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[{"path":"keys[\"`+h1+`\"].policies[0]","problem":"unknown policy \"gold\""}]}`)
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"},"colour":"red"}`), 400,
		`{"error":"body is not valid JSON for this object: json: unknown field \"colour\""}`)
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"id":"silver","rate":{"requests":5,"per":"1m"}}`), 400,
		`{"error":"id \"silver\" in the body differs from \"gold\" in the path"}`)
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":3}`)
	expect(t, call(t, "GET", base+"/api/keys/"+h2, ""), 404, `{"error":"no key `+h2+`"}`)
	expect(t, call(t, "GET", base+"/api/policies/gold", ""), 200, `{"id":"gold","rate":{"requests":5,"per":"1m0s"},"quota":{"max":1000,"renewal":"24h0m0s"}}`)

	expect(t, call(t, "DELETE", base+"/api/keys/"+h1, ""), 200, `{"key_hash":"`+h1+`","revision":4}`)
	expect(t, call(t, "DELETE", base+"/api/keys/"+h1, ""), 404, `{"error":"no key `+h1+`"}`)
	expect(t, call(t, "DELETE", base+"/api/policies/gold", ""), 200, `{"revision":5}`)
	expect(t, call(t, "DELETE", base+"/api/apis/echo", ""), 200, `{"revision":6}`)
	expect(t, call(t, "GET", base+"/api/apis/echo", ""), 404, `{"error":"no API \"echo\""}`)
	expect(t, call(t, "GET", base+"/api/nothing", ""), 404, `{"error":"no such endpoint"}`)
	if got := revision(t, s); got != 6 {
		t.Fatalf("store at %d, want 6", got)
	}
}

// TestAdminQuotaEpochs: a key's quota epoch is the revision of its last
// reset. A PUT of an existing key resets unless ?suppress_reset=1; a
// reset-quota raises the key's epochs, or with ?api= one entry's.
func TestAdminQuotaEpochs(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	h := hash("k")
	key := func(rev int, epoch, eu, us int) string {
		return fmt.Sprintf(`{"key_hash":"%s","policies":["gold"],"api_limits":{"eu":{"quota":{"max":600,"renewal":"24h0m0s"},"quota_epoch":%d},"us":{"quota":{"max":400,"renewal":"24h0m0s"},"quota_epoch":%d}},"quota_epoch":%d}`, h, eu, us, epoch)
	}
	body := `{"policies":["gold"],"api_limits":{"eu":{"quota":{"max":600,"renewal":"24h"}},"us":{"quota":{"max":400,"renewal":"24h"}}},"quota_epoch":999}`
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`), 200, `{"revision":1}`)
	expect(t, call(t, "PUT", base+"/api/apis/eu", `{"listen_path":"/eu/","target":"builtin:echo","tags":["eu"]}`), 200, `{"revision":2}`)
	expect(t, call(t, "PUT", base+"/api/apis/us", `{"listen_path":"/us/","target":"builtin:echo","tags":["us"]}`), 200, `{"revision":3}`)
	steps := []struct {
		method, path, body string
		status             int
		answer, key        string
	}{
		// New key: every epoch is its revision (999 in the body is ignored).
		{"PUT", "/api/keys/" + h, body, 200, `{"key_hash":"` + h + `","revision":4}`, key(4, 4, 4, 4)},
		// Update with suppress_reset: epochs kept.
		{"PUT", "/api/keys/" + h + "?suppress_reset=1", body, 200, `{"key_hash":"` + h + `","revision":5}`, key(5, 4, 4, 4)},
		// Update without: every epoch raised to the revision.
		{"PUT", "/api/keys/" + h, body, 200, `{"key_hash":"` + h + `","revision":6}`, key(6, 6, 6, 6)},
		{"PUT", "/api/keys/" + h + "?suppress_reset=0", body, 200, `{"key_hash":"` + h + `","revision":7}`, key(7, 7, 7, 7)},
		// Reset one API's quota.
		{"POST", "/api/keys/" + h + "/reset-quota?api=eu", "", 200, `{"key_hash":"` + h + `","revision":8}`, key(8, 7, 8, 7)},
		// Reset the key's quotas.
		{"POST", "/api/keys/" + h + "/reset-quota", "", 200, `{"key_hash":"` + h + `","revision":9}`, key(9, 9, 9, 9)},
		{"POST", "/api/keys/" + h + "/reset-quota?api=asia", "", 409, `{"error":"key ` + h + ` has no api_limits entry for API \"asia\"; reset its quotas without ?api="}`, key(9, 9, 9, 9)},
		{"POST", "/api/keys/" + hash("other") + "/reset-quota", "", 404, `{"error":"no key ` + hash("other") + `"}`, key(9, 9, 9, 9)},
		{"PUT", "/api/keys/" + h + "?suppress_reset=yes", body, 400, `{"error":"?suppress_reset=\"yes\": want 1 or 0"}`, key(9, 9, 9, 9)},
	}
	for i, st := range steps {
		a := call(t, st.method, base+st.path, st.body)
		if a.status != st.status || a.body != st.answer {
			t.Fatalf("step %d: %s %s: %d %s\nwant %d %s", i, st.method, st.path, a.status, a.body, st.status, st.answer)
		}
		if got := call(t, "GET", base+"/api/keys/"+h, ""); got.body != st.key {
			t.Fatalf("step %d: key\n%s\nwant\n%s", i, got.body, st.key)
		}
	}
}

// GET /api/dataplanes lists one entry per stream: two open streams with
// one gateway_id are both listed and flagged duplicate (and the flag goes
// when one ends, with its entry, the gateway having another); a reconnect
// replaces the ended stream's entry; ended entries expire after
// DataPlanes.Expiry; DELETE /api/dataplanes/{id}
// forgets a gateway's ended streams (409 while it has only an open one,
// 404 when unknown).
func TestAdminDataPlanes(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	dps := &controlplane.DataPlanes{Expiry: time.Hour, Now: func() time.Time { return now }}
	_, base := server(t, controlplane.BoltOptions{}, dps)
	expect(t, call(t, "GET", base+"/api/dataplanes", ""), 200, `{"dataplanes":[]}`)
	if o := dps.Connect(controlplane.DataPlane{GatewayID: "gw-1", Stream: 1, Peer: "10.0.0.1:5000", Group: "eu", Tags: []string{"eu"}, AppliedRevision: 6, LastSeen: now}); len(o) != 0 {
		t.Fatalf("first stream: others %v", o)
	}
	o := dps.Connect(controlplane.DataPlane{GatewayID: "gw-1", Stream: 2, Peer: "10.0.0.2:5000", Group: "eu", LastSeen: now})
	if len(o) != 1 || o[0].Stream != 1 || !o[0].Duplicate {
		t.Fatalf("second stream with gw-1: others %+v, want stream 1 flagged", o)
	}
	dps.Connect(controlplane.DataPlane{GatewayID: "gw-0", Stream: 3, Group: "us", LastSeen: now})
	dps.Update("gw-1", 1, func(dp *controlplane.DataPlane) {
		dp.LastRejection = &controlplane.Rejection{Revision: 7, Problem: "spec: keys[0].key_hash: missing", At: now}
	})
	dps.Update("gw-9", 9, func(dp *controlplane.DataPlane) { t.Fatal("Update of an unknown stream called fn") })
	expect(t, call(t, "GET", base+"/api/dataplanes", ""), 200, `{"dataplanes":[`+
		`{"gateway_id":"gw-1","stream":1,"peer":"10.0.0.1:5000","group":"eu","tags":["eu"],"connected":true,"duplicate":true,"applied_revision":6,"last_seen":"2026-01-02T03:04:05Z","last_rejection":{"revision":7,"problem":"spec: keys[0].key_hash: missing","at":"2026-01-02T03:04:05Z"}},`+
		`{"gateway_id":"gw-1","stream":2,"peer":"10.0.0.2:5000","group":"eu","connected":true,"duplicate":true,"applied_revision":0,"last_seen":"2026-01-02T03:04:05Z"},`+
		`{"gateway_id":"gw-0","stream":3,"group":"us","connected":true,"applied_revision":0,"last_seen":"2026-01-02T03:04:05Z"}]}`)

	// The second gw-1 stream ends: its entry goes (gw-1 has an open
	// stream), and so does the duplicate flag.
	now = now.Add(time.Minute)
	dps.Disconnect("gw-1", 2)
	expect(t, call(t, "GET", base+"/api/dataplanes", ""), 200, `{"dataplanes":[`+
		`{"gateway_id":"gw-1","stream":1,"peer":"10.0.0.1:5000","group":"eu","tags":["eu"],"connected":true,"applied_revision":6,"last_seen":"2026-01-02T03:04:05Z","last_rejection":{"revision":7,"problem":"spec: keys[0].key_hash: missing","at":"2026-01-02T03:04:05Z"}},`+
		`{"gateway_id":"gw-0","stream":3,"group":"us","connected":true,"applied_revision":0,"last_seen":"2026-01-02T03:04:05Z"}]}`)
	expect(t, call(t, "DELETE", base+"/api/dataplanes/gw-1", ""), 409, `{"error":"gateway \"gw-1\" has an open sync stream; its entry stays until the stream ends"}`)
	expect(t, call(t, "DELETE", base+"/api/dataplanes/nobody", ""), 404, `{"error":"no gateway \"nobody\""}`)
	dps.Disconnect("gw-1", 1)
	expect(t, call(t, "GET", base+"/api/dataplanes", ""), 200, `{"dataplanes":[`+
		`{"gateway_id":"gw-1","stream":1,"peer":"10.0.0.1:5000","group":"eu","tags":["eu"],"connected":false,"applied_revision":6,"last_seen":"2026-01-02T03:04:05Z","disconnected_at":"2026-01-02T03:05:05Z","last_rejection":{"revision":7,"problem":"spec: keys[0].key_hash: missing","at":"2026-01-02T03:04:05Z"}},`+
		`{"gateway_id":"gw-0","stream":3,"group":"us","connected":true,"applied_revision":0,"last_seen":"2026-01-02T03:04:05Z"}]}`)
	expect(t, call(t, "DELETE", base+"/api/dataplanes/gw-1", ""), 200, `{"removed":1,"connected":false}`)
	expect(t, call(t, "DELETE", base+"/api/dataplanes/gw-1", ""), 404, `{"error":"no gateway \"gw-1\""}`)

	// gw-0 ends; it reconnects (one entry, the new stream's); it ends
	// again and expires an hour later.
	dps.Disconnect("gw-0", 3)
	dps.Connect(controlplane.DataPlane{GatewayID: "gw-0", Stream: 4, Group: "us", LastSeen: now})
	dps.Disconnect("gw-0", 4)
	if got := dps.List(); len(got) != 1 || got[0].Stream != 4 || got[0].Connected {
		t.Fatalf("after the reconnect and its end: %+v, want gw-0's stream 4 only, ended", got)
	}
	now = now.Add(time.Hour - time.Second)
	if got := len(dps.List()); got != 1 {
		t.Fatalf("%d entries just before the expiry, want 1", got)
	}
	now = now.Add(time.Second)
	expect(t, call(t, "GET", base+"/api/dataplanes", ""), 200, `{"dataplanes":[]}`)
}

// BenchmarkAdminWrites16Clients measures durable key writes per second
// through the admin API over real HTTP from 16 concurrent clients (each
// write is fsynced before its 200).
func BenchmarkAdminWrites16Clients(b *testing.B) {
	_, base := server(b, controlplane.BoltOptions{}, nil)
	adminWrites16(b, base)
}

// BenchmarkAdminWrites16ClientsPostgres3 is BenchmarkAdminWrites16Clients
// spread over three replicas: three admin servers, each over a Postgres
// store of its own on one PostgreSQL (pgtest, durable: fsync on), the
// clients' writes sent to the replicas in turn.
func BenchmarkAdminWrites16ClientsPostgres3(b *testing.B) {
	srv := pgtest.Start(b, pgtest.Options{Durable: true})
	var bases []string
	for range 3 {
		bases = append(bases, adminOver(b, openPostgres(b, srv.ConnString(), controlplane.PostgresOptions{}), controlplane.AdminOptions{}))
	}
	adminWrites16(b, bases...)
}

// adminWrites16 puts policy gold through bases[0], then b.N keys from 16
// concurrent clients, write i through bases[i%len(bases)], and reports
// writes/s.
func adminWrites16(b *testing.B, bases ...string) {
	if a := call(b, "PUT", bases[0]+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`); a.status != 200 {
		b.Fatal(a.body)
	}
	const clients = 16
	var next atomic.Int64
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				body := fmt.Sprintf(`{"key":"bench-%d","policies":["gold"]}`, i)
				req, _ := http.NewRequest("POST", bases[int(i)%len(bases)]+"/api/keys", bytes.NewReader([]byte(body)))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 201 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
}

// TestAdminRefusesNumberDurations: "per": 3600 once stored 3.6 µs (a
// number read as nanoseconds: no limit at all). Durations are strings;
// a number is 422 naming the field, and nothing is written. So is any
// other value of the wrong type.
func TestAdminRefusesNumberDurations(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	const problem = `: a duration is a string with its unit, like \"1h\" or \"500ms\"`
	const refused = `{"error":"body has a duration that is not a string; nothing was changed","problems":[{"path":"`
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":10,"per":3600}}`), 422, refused+`rate.per","problem":"number 3600`+problem+`"}]}`)
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"quota":{"max":10,"renewal":86400000000000}}`), 422, refused+`quota.renewal","problem":"number 86400000000000`+problem+`"}]}`)
	expect(t, call(t, "PUT", base+"/api/apis/a", `{"listen_path":"/a/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["HS256"],"keys":[{"secret_env":"S"}],"default_policies":["p"],"leeway":30}}`), 422, refused+`jwt.leeway","problem":"number 30`+problem+`"}]}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"k","api_limits":{"a":{"rate":{"requests":1,"per":1}}}}`), 422, refused+`api_limits.a.rate.per","problem":"number 1`+problem+`"}]}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"k","api_limits":{"Orders-1":{"rate":{"requests":1,"per":"1s"}},"b":{"quota":{"max":1,"renewal":"1h"}},"c":{"quota":{"max":1,"renewal":2}}}}`), 422, refused+`api_limits.c.quota.renewal","problem":"number 2`+problem+`"}]}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"k","api_limits":{"Orders-1":{"rate":{"requests":1,"per":[1]}}}}`), 422, refused+`api_limits.\"Orders-1\".rate.per","problem":"array`+problem+`"}]}`)
	// A string that is no duration, or one out of range: 422 naming the
	// field, with the file's words.
	const notDuration = `{"error":"body has a string that is not a duration; nothing was changed","problems":[{"path":"`
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":10,"per":"100000000h"}}`), 422, notDuration+`rate.per","problem":"\"100000000h\" is out of range (durations go up to 2562047h47m16.854775807s, about 292 years)"}]}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"k","api_limits":{"a":{"quota":{"max":1,"renewal":"1h"}},"Orders-1":{"quota":{"max":1,"renewal":"1d"}}}}`), 422, notDuration+`api_limits.\"Orders-1\".quota.renewal","problem":"\"1d\" is not a duration"}]}`)
	// A key's expires that is no time: 422 naming it.
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"k","expires":"1d"}`), 422,
		`{"error":"body has a string that is not a time; nothing was changed","problems":[{"path":"expires","problem":"\"1d\" is not a time: want RFC 3339, like \"2027-01-31T00:00:00Z\""}]}`)
	// Any other value of the wrong type: 422 naming the field too.
	const wrongType = `{"error":"body has a value of the wrong type; nothing was changed","problems":[{"path":"`
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"in_flight":1e18}`), 422, wrongType+`in_flight","problem":"number 1e18: want an integer"}]}`)
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":"10","per":"1h"}}`), 422, wrongType+`rate.requests","problem":"string: want an integer"}]}`)
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":10,"per":"1h"},"shadow":"yes"}`), 422, wrongType+`shadow","problem":"string: want true or false"}]}`)
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":0}`)
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":10,"per":"1h"}}`), 200, `{"revision":1}`)
	expect(t, call(t, "GET", base+"/api/policies/p", ""), 200, `{"id":"p","rate":{"requests":10,"per":"1h0m0s"}}`)
}

// TestAdminAsStrictAsTheFile: what a gateway's file refuses, the admin
// API refuses, with the file's words: an explicit burst 0, a plaintext
// key no gateway would accept (too long, CR, LF, NUL, surrounding white
// space), the ids "." and ".."; and a member named twice is 400 (not
// "last wins"). Nothing is written.
func TestAdminAsStrictAsTheFile(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	const invalid = `{"error":"the change would leave an invalid configuration; nothing was changed","problems":[`
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":5,"per":"1m","burst":0}}`), 422,
		invalid+`{"path":"policies[\"p\"].rate.burst","problem":"0 must be \u003e 0 (leave it out to use requests)"}]}`)
	// "." and ".." in a path are 400 (TestAdminPathsAndContentTypes);
	// as ids they are invalid wherever they come from.
	for body, dup := range map[string]string{
		`{"rate":{"requests":5,"per":"1m"},"rate":{"requests":500,"per":"1m"}}`: "rate",
		`{"rate":{"requests":5,"per":"1m","requests":7}}`:                       "rate.requests",
		`{"apis":["a","b"],"shadow":true,"apis":[]}`:                            "apis",
	} {
		expect(t, call(t, "PUT", base+"/api/policies/p", body), 400, `{"error":"body names member `+dup+` twice"}`)
	}
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"k","policies":["p"],"api_limits":{"Orders":{"quota":{"max":1,"renewal":"1h"}},"Orders":{}}}`), 400,
		`{"error":"body names member api_limits.\"Orders\" twice"}`)
	const refusedKey = `{"error":"no gateway would accept this key; nothing was changed","problems":[{"path":"key","problem":`
	for key, problem := range map[string]string{
		strings.Repeat("k", 513): `"longer than 512 bytes; the gateway refuses such keys"`,
		`a\r\nb`:                 `"holds the control character '\\r' at byte 1; no request header can carry it"`,
		`ab\n`:                   `"starts or ends with white space, which the gateway trims from a presented key"`,
		`a\u0000b`:               `"holds the control character '\\x00' at byte 1; no request header can carry it"`,
		` k`:                     `"starts or ends with white space, which the gateway trims from a presented key"`,
	} {
		expect(t, call(t, "POST", base+"/api/keys", `{"key":"`+key+`","policies":["p"]}`), 422, refusedKey+problem+`}]}`)
	}
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":0}`)
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":5,"per":"1m","burst":7}}`), 200, `{"revision":1}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"`+strings.Repeat("k", 512)+`","policies":["p"]}`), 201,
		`{"key_hash":"`+hash(strings.Repeat("k", 512))+`","revision":2}`)
}

// TestAdminPathsAndContentTypes: writes take application/json only
// (415 otherwise, with or without a charset=utf-8 parameter it is fine),
// and a path with "." or ".." segments (escaped or not) or "//" is 400,
// never a redirect that a client follows with its PUT or DELETE to
// another object. Nothing is written.
func TestAdminPathsAndContentTypes(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	send := func(method, url, ctype, body string) answer {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req) // follows redirects
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return answer{resp.StatusCode, strings.TrimSuffix(string(b), "\n"), resp.Header}
	}
	const policy = `{"rate":{"requests":5,"per":"1m"}}`
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/json; charset=latin1", "application/jsonx", "application/json; v=2"} {
		a := send("PUT", base+"/api/policies/p", ct, policy)
		expect(t, a, 415, `{"error":"Content-Type `+strconvQuote(ct)+`: writes take application/json"}`)
		if a.header.Get("Accept") != "application/json" {
			t.Fatalf("Accept %q", a.header.Get("Accept"))
		}
	}
	expect(t, send("POST", base+"/api/keys", "text/plain", `{"key":"k","policies":["p"]}`), 415, `{"error":"Content-Type \"text/plain\": writes take application/json"}`)
	expect(t, send("DELETE", base+"/api/policies/p", "application/x-www-form-urlencoded", "a=b"), 415, `{"error":"Content-Type \"application/x-www-form-urlencoded\": writes take application/json"}`)
	for _, p := range []string{"/api/keys/../policies/x", "/api/policies/a/../x", "/api/policies/./x", "/api//policies/x", "/api/policies/%2e%2e", "/api/policies/%2E", "/api/policies/x/.."} {
		for _, m := range []string{"PUT", "DELETE", "GET"} {
			a := send(m, base+p, "application/json", policy)
			if a.status != 400 || !strings.Contains(a.body, "is not clean") {
				t.Fatalf("%s %s: %d %s", m, p, a.status, a.body)
			}
		}
	}
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":0}`)
	expect(t, send("PUT", base+"/api/policies/x", "application/json; charset=utf-8", policy), 200, `{"revision":1}`)
	expect(t, send("PUT", base+"/api/policies/x", "Application/JSON; Charset=UTF-8", policy), 200, `{"revision":2}`)
	expect(t, send("DELETE", base+"/api/policies/x", "", ""), 200, `{"revision":3}`)
}

// strconvQuote is s as %q writes it, as it appears inside a JSON string.
func strconvQuote(s string) string {
	b, _ := json.Marshal(strconv.Quote(s))
	return string(b[1 : len(b)-1])
}

// TestAdminHostileBodies: what a new user's hostile input found. Bytes
// that are not UTF-8 are refused (encoding/json would have stored U+FFFD
// for them: a key other than the one sent), and so is a key holding
// U+FFFD (a lone surrogate escape decodes to it); a member named twice in
// two cases is a duplicate (encoding/json would keep the last); a path
// that is not clean is 400 before the token is looked at.
func TestAdminHostileBodies(t *testing.T) {
	s, base := server(t, controlplane.BoltOptions{}, nil)
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`), 200, `{"revision":1}`)
	expect(t, call(t, "POST", base+"/api/keys", "{\"key\":\"y\xff\xfe\",\"policies\":[\"gold\"]}"), 400, `{"error":"body is not valid UTF-8"}`)
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"y\ud800z","policies":["gold"]}`), 422,
		`{"error":"no gateway would accept this key; nothing was changed","problems":[{"path":"key","problem":"holds U+FFFD, which a JSON or YAML decoder puts for bytes that are not UTF-8 or a lone surrogate: the key meant is another"}]}`)
	expect(t, call(t, "PUT", base+"/api/policies/e", `{"rate":{"requests":5,"per":"1m","Requests":99}}`), 400, `{"error":"body names member rate.\"Requests\" twice"}`)
	expect(t, call(t, "POST", base+"/api/import", `{"policies":[{"id":"a"}],"Policies":[{"id":"b"}]}`), 400, `{"error":"body names member \"Policies\" twice"}`)
	for _, p := range []string{"/api/../metrics", "/api/policies/./gold"} {
		expect(t, callWith(t, "GET", base+p, "", ""), 400, `{"error":"path \"`+p+`\" is not clean (no \".\" or \"..\" segments, no \"//\")"}`)
	}
	var rev uint64
	if err := s.View(context.Background(), func(r controlplane.Reader) error { rev = r.Revision(); return nil }); err != nil || rev != 1 {
		t.Fatalf("revision %d, %v; want 1 (nothing written)", rev, err)
	}
}

// TestAdminRefusesDeepBody: a 200 KB body nested 100,000 deep ran the
// control plane out of memory (found by a fresh user); it is 400 at once,
// and nothing is written.
func TestAdminRefusesDeepBody(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	deep := `{"rate":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	expect(t, call(t, "PUT", base+"/api/policies/deep", deep), 400, `{"error":"body is JSON nested more than 64 deep; nothing was changed"}`)
	expect(t, call(t, "GET", base+"/api/policies/deep", ""), 404, `{"error":"no policy \"deep\""}`)
}
