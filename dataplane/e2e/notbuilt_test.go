package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/spec"
)

// hmacJWTAPI is a jwt API at /<id>/ on the echo upstream whose one HS256
// key is k, charging the q100 policy.
func hmacJWTAPI(id string, k spec.JWTKey) spec.API {
	return spec.API{ID: id, ListenPath: "/" + id + "/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT,
		JWT: &spec.JWT{Algorithms: []string{"HS256"}, Keys: []spec.JWTKey{k}, DefaultPolicies: []string{"q100"}}}
}

// sendBearer sends GET path to the gateway with a bearer token.
func sendBearer(t *testing.T, g *gateway, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", g.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := quick.Do(req)
	if err != nil {
		t.Fatalf("gateway %s: GET %s: %v", g.id, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("gateway %s: GET %s: %v", g.id, path, err)
	}
	return resp.StatusCode, string(b)
}

// dataPlaneNotBuilt is one entry of GET /api/dataplanes as this test
// reads it, with its list of APIs not built.
type dataPlaneNotBuilt struct {
	GatewayID       string                  `json:"gateway_id"`
	AppliedRevision uint64                  `json:"applied_revision"`
	LastRejection   *controlplane.Rejection `json:"last_rejection"`
	NotBuilt        []notBuilt              `json:"not_built"`
}

func sortedNotBuilt(nb []notBuilt) []notBuilt {
	nb = slices.Clone(nb)
	slices.SortFunc(nb, func(a, b notBuilt) int { return cmp.Or(cmp.Compare(a.API, b.API), cmp.Compare(a.Policy, b.Policy)) })
	return nb
}

// waitNotBuilt waits until GET /api/dataplanes shows each of gws at
// revision rev, with no rejection and want(g)'s list of objects not
// built (in any order).
func waitNotBuilt(t *testing.T, cp *controlPlane, gws []*gateway, rev uint64, what string, want func(*gateway) []notBuilt) {
	t.Helper()
	waitFor(t, what+" in /api/dataplanes", syncTimeout, func() (bool, string) {
		var out struct {
			DataPlanes []dataPlaneNotBuilt `json:"dataplanes"`
		}
		if err := json.Unmarshal(cp.mustAdmin(t, "GET", "/api/dataplanes", nil, 200), &out); err != nil {
			t.Fatal(err)
		}
		list := out.DataPlanes
		for _, g := range gws {
			i := slices.IndexFunc(list, func(d dataPlaneNotBuilt) bool { return d.GatewayID == g.id })
			if i < 0 || list[i].AppliedRevision != rev || list[i].LastRejection != nil ||
				!reflect.DeepEqual(sortedNotBuilt(list[i].NotBuilt), sortedNotBuilt(want(g))) {
				return false, fmt.Sprintf("%+v", list)
			}
		}
		return true, ""
	})
}

// TestBadAPIFreezesNothing is issue 18's first row with the real
// processes: two data planes of two gateways each, and two JWT APIs that
// no gateway can build, one whose HMAC secret is $HOME (too short), one
// whose secret_file (relative to each gateway's file) does not exist.
// The control plane accepts them (only a gateway's host can tell), and
// refuses with 422 what it can tell (an inline secret too short). Then a
// key delete and a key create reach all four gateways within 1 s: the
// deleted key gets 403, the new one 200. Each gateway lists both APIs as
// not built, in /readyz (ready, degraded) and in /api/dataplanes, and each
// API answers 503 naming itself. Writing the secret file beside dp1's
// gateways' files fixes it there: their own retry builds it without a new
// revision (a signed token passes), while dp2 still lists both.
func TestBadAPIFreezesNothing(t *testing.T) {
	t.Parallel()
	home := os.Getenv("HOME")
	if len(home) >= 32 {
		t.Fatalf("this test needs $HOME shorter than an HMAC secret (32 bytes), not %q", home)
	}
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	gws := all(dp1, dp2)
	cp.putPolicy(t, quotaPolicy("q100", 100))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	oldHash, _ := cp.postKey(t, "old-key", spec.Key{Policies: []string{"q100"}})
	waitSynced(t, cp, gws...)

	// What the control plane can check it refuses, with the field path.
	short := hmacJWTAPI("jwt-inline", spec.JWTKey{Secret: "short"})
	if status, body, err := cp.admin(t.Context(), "PUT", "/api/apis/jwt-inline", short); err != nil || status != 422 ||
		!strings.Contains(string(body), "jwt.keys[0].secret") || !strings.Contains(string(body), "the inline secret holds 5 bytes; an HMAC secret needs at least 32") {
		t.Errorf("PUT of an API with a 5-byte inline secret: %d %s (%v), want 422 naming jwt.keys[0].secret", status, body, err)
	}

	cp.putAPI(t, hmacJWTAPI("jwt-home", spec.JWTKey{SecretEnv: "HOME"}))
	badRev := cp.putAPI(t, hmacJWTAPI("jwt-file", spec.JWTKey{SecretFile: "hmac.secret"}))
	// No wait for the bad revisions to be applied: the delete follows them
	// on every stream, as it would in production.

	start := time.Now()
	delRev := decodeWritten(t, cp.mustAdmin(t, "DELETE", "/api/keys/"+oldHash, nil, 200)).Revision
	_, newRev := cp.postKey(t, "new-key", spec.Key{Policies: []string{"q100"}})
	if newRev <= delRev || delRev <= badRev {
		t.Fatalf("revisions: bad APIs %d, delete %d, new key %d", badRev, delRev, newRev)
	}
	waitKeySwap(t, gws, start)

	homeProblem := fmt.Sprintf("spec: keys[0].secret_env: environment variable HOME holds %d bytes; an HMAC secret needs at least 32", len(home))
	fileProblem := func(g *gateway) string {
		return "spec: keys[0].secret_file: cannot read " + filepath.Join(filepath.Dir(g.file), "hmac.secret") + ": no such file or directory"
	}
	both := func(g *gateway) []notBuilt {
		return []notBuilt{{API: "jwt-file", Problem: fileProblem(g)}, {API: "jwt-home", Problem: homeProblem}}
	}
	for _, g := range gws {
		r := waitReadyz(t, g, "revision "+fmt.Sprint(newRev), syncTimeout, func(r readiness) bool { return r.Revision >= newRev })
		if !r.Ready || !r.Degraded || r.Error != "" || !reflect.DeepEqual(sortedNotBuilt(r.NotBuilt), both(g)) {
			t.Errorf("gateway %s /readyz: %+v, want ready, degraded, not_built %+v", g.id, r, both(g))
		}
		for _, nb := range both(g) {
			status, body := sendOne(t, g, "/"+nb.API+"/x", "")
			want := fmt.Sprintf(`{"error":%q}`+"\n", fmt.Sprintf("API %q is not built on this gateway; its operators see why in the gateway's /readyz", nb.API))
			if status != 503 || body != want {
				t.Errorf("gateway %s /%s/x: %d %q, want 503 %q", g.id, nb.API, status, body, want)
			}
		}
	}
	waitNotBuilt(t, cp, gws, newRev, "both APIs not built on every gateway", both)

	// Fix jwt-file on dp1's hosts only.
	secret := strings.Repeat("k", 40)
	for _, g := range dp1.gws {
		if err := os.WriteFile(filepath.Join(filepath.Dir(g.file), "hmac.secret"), []byte(secret), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	onlyHome := []notBuilt{{API: "jwt-home", Problem: homeProblem}}
	for _, g := range dp1.gws {
		r := waitReadyz(t, g, "jwt-file built", syncTimeout, func(r readiness) bool { return len(r.NotBuilt) == 1 })
		if !r.Degraded || r.Revision != newRev || !reflect.DeepEqual(r.NotBuilt, onlyHome) {
			t.Errorf("gateway %s /readyz after the fix: %+v, want revision %d, not_built %+v", g.id, r, newRev, onlyHome)
		}
		if status, body := sendBearer(t, g, "/jwt-file/x", token); status != 200 {
			t.Errorf("gateway %s: a signed token on the fixed API: %d %s", g.id, status, body)
		}
	}
	waitNotBuilt(t, cp, gws, newRev, "jwt-file built on dp1 only", func(g *gateway) []notBuilt {
		if g.dp == dp1 {
			return onlyHome
		}
		return both(g)
	})
	for _, g := range dp2.gws {
		if status, _ := sendBearer(t, g, "/jwt-file/x", token); status != 503 {
			t.Errorf("gateway %s (not fixed): the API answered %d, want 503", g.id, status)
		}
	}
	if rev := cp.revision(t); rev != newRev {
		t.Errorf("control plane revision %d, want %d: the fix took no new revision", rev, newRev)
	}
}

// TestBadPolicyFreezesNothing is issue 18's first row for a policy that
// only some data planes can enforce: a sliding_window policy, which dp2's
// Redis counts but dp1's gateways, counting in their own process, cannot.
// The control plane accepts it; dp1's gateways apply the revision
// without it, so a key delete and a key create that follow are in force
// on all four gateways within 1 s (the deleted key 403, the new one 200).
// A key under the policy answers 503 naming it on dp1 and passes on dp2;
// dp1's gateways list the policy as not built in /readyz (ready,
// degraded) and /api/dataplanes, dp2's list nothing. A revision that
// makes it GCRA builds it on dp1.
func TestBadPolicyFreezesNothing(t *testing.T) {
	t.Parallel()
	cp, tk1, tk2 := twoTokens(t, cpOptions{})
	dp1, dp2 := startMemoryDataPlane(t, cp, tk1, 2), startDataPlane(t, cp, tk2, 2, nil)
	gws := all(dp1, dp2)
	cp.putPolicy(t, quotaPolicy("q100", 100))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	oldHash, _ := cp.postKey(t, "old-key", spec.Key{Policies: []string{"q100"}})
	waitSynced(t, cp, gws...)

	sw := spec.Policy{ID: "sw", Rate: &spec.Rate{Requests: 50, Per: spec.Duration(time.Minute), Algorithm: "sliding_window"}}
	cp.putPolicy(t, sw)
	_, swRev := cp.postKey(t, "sw-key", spec.Key{Policies: []string{"sw"}})
	// No wait for the policy's revision to be applied: the delete follows
	// it on every stream, as it would in production.
	start := time.Now()
	delRev := decodeWritten(t, cp.mustAdmin(t, "DELETE", "/api/keys/"+oldHash, nil, 200)).Revision
	_, newRev := cp.postKey(t, "new-key", spec.Key{Policies: []string{"q100"}})
	if newRev <= delRev || delRev <= swRev {
		t.Fatalf("revisions: policy and its key %d, delete %d, new key %d", swRev, delRev, newRev)
	}
	waitKeySwap(t, gws, start)

	problem := "algorithm not supported by this store: sliding_window"
	want := func(g *gateway) []notBuilt {
		if g.dp == dp1 {
			return []notBuilt{{Policy: "sw", Problem: problem}}
		}
		return nil
	}
	body503 := fmt.Sprintf(`{"error":%q}`+"\n", fmt.Sprintf("policy %q is not built on this gateway: %s", "sw", problem))
	for _, g := range gws {
		r := waitReadyz(t, g, "revision "+fmt.Sprint(newRev), syncTimeout, func(r readiness) bool { return r.Revision >= newRev })
		if !r.Ready || r.Degraded != (g.dp == dp1) || r.Error != "" || !reflect.DeepEqual(r.NotBuilt, want(g)) {
			t.Errorf("gateway %s /readyz: %+v, want ready, degraded %v, not_built %+v", g.id, r, g.dp == dp1, want(g))
		}
		status, body := sendOne(t, g, "/echo/x", "sw-key")
		if g.dp == dp1 && (status != 503 || body != body503) {
			t.Errorf("gateway %s: sw-key %d %q, want 503 %q", g.id, status, body, body503)
		}
		if g.dp == dp2 && status != 200 {
			t.Errorf("gateway %s (Redis): sw-key %d %s, want 200", g.id, status, body)
		}
	}
	waitNotBuilt(t, cp, gws, newRev, "sw not built on dp1", want)

	sw.Rate.Algorithm = "gcra"
	fixRev := cp.putPolicy(t, sw)
	waitApplied(t, fixRev, gws...)
	for _, g := range gws {
		if r, err := g.readyz(); err != nil || r.Degraded || r.NotBuilt != nil {
			t.Errorf("gateway %s /readyz after sw became GCRA: %+v (%v), want not degraded", g.id, r, err)
		}
		if status, body := sendOne(t, g, "/echo/x", "sw-key"); status != 200 {
			t.Errorf("gateway %s: sw-key after sw became GCRA: %d %s, want 200", g.id, status, body)
		}
	}
	waitNotBuilt(t, cp, gws, fixRev, "nothing not built", func(*gateway) []notBuilt { return nil })
}

// waitKeySwap waits, at most 1 s on each gateway, until old-key (deleted)
// is refused (403) and new-key (created) passes (200) on /echo/x, and logs
// how long after start that held on all of them.
func waitKeySwap(t *testing.T, gws []*gateway, start time.Time) {
	t.Helper()
	for _, g := range gws {
		waitFor(t, "gateway "+g.id+" refusing the deleted key and passing the new one", time.Second, func() (bool, string) {
			oldStatus, oldBody := sendOne(t, g, "/echo/x", "old-key")
			newStatus, newBody := sendOne(t, g, "/echo/x", "new-key")
			return oldStatus == 403 && newStatus == 200, fmt.Sprintf("old-key %d %s, new-key %d %s", oldStatus, oldBody, newStatus, newBody)
		})
	}
	t.Logf("key delete and create in force on all %d gateways %v after the DELETE was sent", len(gws), time.Since(start).Round(time.Millisecond))
}
