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
	slices.SortFunc(nb, func(a, b notBuilt) int { return cmp.Compare(a.API, b.API) })
	return nb
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
	for _, g := range gws {
		waitFor(t, "gateway "+g.id+" refusing the deleted key and passing the new one", time.Second, func() (bool, string) {
			oldStatus, oldBody := sendOne(t, g, "/echo/x", "old-key")
			newStatus, newBody := sendOne(t, g, "/echo/x", "new-key")
			return oldStatus == 403 && newStatus == 200, fmt.Sprintf("old-key %d %s, new-key %d %s", oldStatus, oldBody, newStatus, newBody)
		})
	}
	t.Logf("key delete and create in force on all four gateways %v after the DELETE was sent", time.Since(start).Round(time.Millisecond))

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
			want := fmt.Sprintf(`{"error":%q}`+"\n", fmt.Sprintf("API %q is not built on this gateway: %s", nb.API, nb.Problem))
			if status != 503 || body != want {
				t.Errorf("gateway %s /%s/x: %d %q, want 503 %q", g.id, nb.API, status, body, want)
			}
		}
	}
	waitNotBuilt := func(what string, want func(*gateway) []notBuilt) {
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
				if i < 0 || list[i].AppliedRevision != newRev || list[i].LastRejection != nil ||
					!reflect.DeepEqual(sortedNotBuilt(list[i].NotBuilt), want(g)) {
					return false, fmt.Sprintf("%+v", list)
				}
			}
			return true, ""
		})
	}
	waitNotBuilt("both APIs not built on every gateway", both)

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
	waitNotBuilt("jwt-file built on dp1 only", func(g *gateway) []notBuilt {
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
