package controlplane_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
)

// TestAdminKeysBatch: POST /api/keys:batch writes up to 10,000 keys in
// one revision, or none: an invalid batch is 422 listing every problem
// with its index.
func TestAdminKeysBatch(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`), 200, `{"revision":1}`)
	expect(t, call(t, "PUT", base+"/api/apis/eu", `{"listen_path":"/eu/","target":"builtin:echo"}`), 200, `{"revision":2}`)

	bad := `{"keys":[` +
		`{"key":"a","policies":["gold"]},` +
		`{"key":"b","policies":["nope"]},` +
		`{"key":"a","policies":["gold"]},` +
		`{"key_hash":"sha256:abc","policies":["gold"]},` +
		`{"key":"c\r\n","policies":["gold"]},` +
		`{"key":"d","api_limits":{"eu":{"rate":{"requests":1,"per":60}}}},` +
		`{"key":"e","polices":["gold"]},` +
		`{"policies":["gold"]},` +
		`{"key":"f","api_limits":{"us":{"quota":{"max":1,"renewal":"1h"}}}},` +
		`{"key":"g","policies":["gold"],"expires":"tomorrow"}` +
		`]}`
	// Problems the body alone shows come first; the ones against the
	// state (unknown policies and APIs) once those are gone.
	expect(t, call(t, "POST", base+"/api/keys:batch", bad), 422, `{"error":"the batch has invalid keys; nothing was changed","problems":[`+
		`{"path":"keys[2].key_hash","problem":"same key as keys[0]"},`+
		`{"path":"keys[3].key_hash","problem":"\"sha256:abc\" is not sha256:\u003c64 hex digits\u003e"},`+
		`{"path":"keys[4].key","problem":"starts or ends with white space, which the gateway trims from a presented key"},`+
		`{"path":"keys[5].api_limits.eu.rate.per","problem":"number 60: a duration is a string with its unit, like \"1h\" or \"500ms\""},`+
		`{"path":"keys[6]","problem":"not a key: unknown field \"polices\""},`+
		`{"path":"keys[7]","problem":"missing key (plaintext) or key_hash"},`+
		`{"path":"keys[9].expires","problem":"\"tomorrow\" is not a time: want RFC 3339, like \"2027-01-31T00:00:00Z\""}]}`)
	bad = `{"keys":[{"key":"a","policies":["gold"]},{"key":"b","policies":["nope"]},{"key":"f","api_limits":{"us":{"quota":{"max":1,"renewal":"1h"}}}}]}`
	expect(t, call(t, "POST", base+"/api/keys:batch", bad), 422, `{"error":"the change would leave an invalid configuration; nothing was changed","problems":[`+
		`{"path":"keys[1].policies[0]","problem":"unknown policy \"nope\""},`+
		`{"path":"keys[2].api_limits.us","problem":"unknown API \"us\""}]}`)
	expect(t, call(t, "POST", base+"/api/keys:batch", `{"keys":[]}`), 400, `{"error":"no keys (want {\"keys\": [...]}, 1 to 10000 of them)"}`)
	expect(t, call(t, "POST", base+"/api/keys:batch", `{"keys":[{"key":"a","policies":["gold"]}],"keys":[]}`), 400, `{"error":"body names member keys twice"}`)
	var over strings.Builder
	over.WriteString(`{"keys":[`)
	for i := range controlplane.MaxBatchKeys + 1 {
		if i > 0 {
			over.WriteByte(',')
		}
		fmt.Fprintf(&over, `{"key":"k%d","policies":["gold"]}`, i)
	}
	over.WriteString(`]}`)
	expect(t, call(t, "POST", base+"/api/keys:batch", over.String()), 422, `{"error":"too many keys; nothing was changed","problems":[{"path":"keys","problem":"10001 keys; a batch takes at most 10000"}]}`)
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":2}`)

	// A valid batch: one revision; replaced keys reset unless suppressed.
	expect(t, call(t, "POST", base+"/api/keys", `{"key":"a","policies":["gold"]}`), 201, `{"key_hash":"`+hash("a")+`","revision":3}`)
	good := `{"keys":[{"key":"a","policies":["gold"],"inactive":true},{"key_hash":"` + strings.ToUpper(hash("b")) + `","policies":["gold"]},{"key":"c","api_limits":{"eu":{"quota":{"max":1,"renewal":"1h"}}}}]}`
	good = strings.Replace(good, "SHA256:", "sha256:", 1)
	expect(t, call(t, "POST", base+"/api/keys:batch?suppress_reset=1", good), 200,
		`{"revision":4,"key_hashes":["`+hash("a")+`","`+hash("b")+`","`+hash("c")+`"]}`)
	expect(t, call(t, "GET", base+"/api/keys/"+hash("a"), ""), 200, `{"key_hash":"`+hash("a")+`","policies":["gold"],"inactive":true,"quota_epoch":3}`)
	expect(t, call(t, "GET", base+"/api/keys/"+hash("c"), ""), 200, `{"key_hash":"`+hash("c")+`","api_limits":{"eu":{"quota":{"max":1,"renewal":"1h0m0s"},"quota_epoch":4}},"quota_epoch":4}`)
	expect(t, call(t, "POST", base+"/api/keys:batch", good), 200,
		`{"revision":5,"key_hashes":["`+hash("a")+`","`+hash("b")+`","`+hash("c")+`"]}`)
	expect(t, call(t, "GET", base+"/api/keys/"+hash("a"), ""), 200, `{"key_hash":"`+hash("a")+`","policies":["gold"],"inactive":true,"quota_epoch":5}`)

	// 10,000 keys in one call, one revision.
	var full strings.Builder
	full.WriteString(`{"keys":[`)
	for i := range controlplane.MaxBatchKeys {
		if i > 0 {
			full.WriteByte(',')
		}
		fmt.Fprintf(&full, `{"key":"k%d","policies":["gold"]}`, i)
	}
	full.WriteString(`]}`)
	a := call(t, "POST", base+"/api/keys:batch", full.String())
	if a.status != 200 || !strings.HasPrefix(a.body, `{"revision":6,"key_hashes":["`+hash("k0")+`",`) {
		t.Fatalf("10,000 keys: %d %.200s", a.status, a.body)
	}
	expect(t, call(t, "GET", base+"/api/keys/"+hash("k9999"), ""), 200, `{"key_hash":"`+hash("k9999")+`","policies":["gold"],"quota_epoch":6}`)
}

// TestAdminExportImportRoundTrip: export A, import into an empty B,
// export B: the same document but for its revision (A's, then B's 1).
// Keys keep their fields and quota epochs; secrets stay references. An
// import replaces the whole state in one revision, and an invalid one
// changes nothing.
func TestAdminExportImportRoundTrip(t *testing.T) {
	_, baseA := server(t, controlplane.BoltOptions{}, nil)
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/api/policies/gold", `{"rate":{"requests":5,"per":"1m","burst":8},"quota":{"max":1000,"renewal":"24h"}}`},
		{"PUT", "/api/apis/eu", `{"listen_path":"/eu/","target":"https://eu.example/","tags":["eu"],"strip_listen_path":false}`},
		{"PUT", "/api/policies/free", `{"rate":{"requests":1,"per":"1s","algorithm":"sliding_window"},"apis":["eu"],"shadow":true,"distributed":true}`},
		{"PUT", "/api/apis/us", `{"listen_path":"/eu/","target":"builtin:echo","tags":["us"]}`},
		{"PUT", "/api/apis/tokens", `{"listen_path":"/tokens/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["HS256"],"keys":[{"secret_env":"LP_JWT"}],"default_policies":["gold"],"leeway":"30s"}}`},
		{"POST", "/api/keys", `{"key":"k1","policies":["gold","free"],"expires":"2030-01-02T03:04:05Z"}`},
		{"POST", "/api/keys", `{"key":"k2","api_limits":{"eu":{"quota":{"max":10,"renewal":"1h"}},"us":{"rate":{"requests":2,"per":"1s"}}}}`},
		{"POST", "/api/keys/" + hash("k2") + "/reset-quota?api=eu", ""},
		{"POST", "/api/keys/" + hash("k1") + "/reset-quota", ""},
	} {
		if a := call(t, c.method, baseA+c.path, c.body); a.status/100 != 2 {
			t.Fatalf("%s %s: %d %s", c.method, c.path, a.status, a.body)
		}
	}
	var keys strings.Builder
	keys.WriteString(`{"keys":[`)
	for i := range 2500 { // more than one export page
		if i > 0 {
			keys.WriteByte(',')
		}
		fmt.Fprintf(&keys, `{"key":"bulk-%d","policies":["gold"]}`, i)
	}
	keys.WriteString(`]}`)
	if a := call(t, "POST", baseA+"/api/keys:batch", keys.String()); a.status != 200 {
		t.Fatalf("batch: %d %.300s", a.status, a.body)
	}
	exportA := call(t, "GET", baseA+"/api/export", "")
	if exportA.status != 200 || exportA.header.Get("Limitplane-Revision") != "10" || exportA.header.Get("Content-Type") != "application/json" {
		t.Fatalf("export A: %d %v %.300s", exportA.status, exportA.header, exportA.body)
	}
	var doc struct {
		Revision uint64            `json:"revision"`
		Policies []json.RawMessage `json:"policies"`
		APIs     []json.RawMessage `json:"apis"`
		Keys     []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal([]byte(exportA.body), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Revision != 10 || len(doc.Policies) != 2 || len(doc.APIs) != 3 || len(doc.Keys) != 2502 {
		t.Fatalf("export A: revision %d, %d policies, %d APIs, %d keys", doc.Revision, len(doc.Policies), len(doc.APIs), len(doc.Keys))
	}
	for _, k := range doc.Keys {
		switch {
		case strings.Contains(string(k), hash("k1")):
			if want := `{"key_hash":"` + hash("k1") + `","policies":["gold","free"],"expires":"2030-01-02T03:04:05Z","quota_epoch":9}`; string(k) != want {
				t.Fatalf("k1 %s\nwant %s", k, want)
			}
		case strings.Contains(string(k), hash("k2")):
			if want := `{"key_hash":"` + hash("k2") + `","api_limits":{"eu":{"quota":{"max":10,"renewal":"1h0m0s"},"quota_epoch":8},"us":{"rate":{"requests":2,"per":"1s"},"quota_epoch":7}},"quota_epoch":7}`; string(k) != want {
				t.Fatalf("k2 %s\nwant %s", k, want)
			}
		}
	}
	if !strings.Contains(exportA.body, `"keys":[{"secret_env":"LP_JWT"}]`) {
		t.Fatalf("the JWT key is not the reference: %.600s", exportA.body)
	}

	_, baseB := server(t, controlplane.BoltOptions{}, nil)
	expect(t, call(t, "POST", baseB+"/api/import", exportA.body), 200, `{"revision":1}`)
	exportB := call(t, "GET", baseB+"/api/export", "")
	if want := strings.Replace(exportA.body, `{"format_version":1,"revision":10,`, `{"format_version":1,"revision":1,`, 1); exportB.body != want {
		t.Fatalf("export B differs from export A but for the revision:\n%.600s\nwant\n%.600s", exportB.body, want)
	}

	// An import replaces everything: what the document lacks is deleted.
	small := `{"format_version":1,"revision":77,"policies":[{"id":"p","rate":{"requests":1,"per":"1s"}}],"apis":[],"keys":[{"key_hash":"` + hash("x") + `","policies":["p"],"quota_epoch":3}]}`
	expect(t, call(t, "POST", baseB+"/api/import", small), 200, `{"revision":2}`)
	expect(t, call(t, "GET", baseB+"/api/export", ""), 200, strings.Replace(small, `"revision":77`, `"revision":2`, 1))
	// An invalid document changes nothing, and says where, by position.
	expect(t, call(t, "POST", baseB+"/api/import", `{"policies":[{"id":"p","rate":{"requests":1,"per":"1s"}},{"id":"p"}],"apis":[],"keys":[{"key_hash":"`+hash("x")+`","policies":["q"]}]}`), 422,
		`{"error":"the document is not a valid configuration; nothing was changed","problems":[`+
			`{"path":"policies[1].id","problem":"duplicate policy id \"p\" (first at policies[0].id)"},`+
			`{"path":"keys[0].policies[0]","problem":"unknown policy \"q\""}]}`)
	expect(t, call(t, "POST", baseB+"/api/import", `{"policies":[{"id":"p","rate":{"requests":1,"per":"1s"}},{"id":"q","quota":{"max":1,"renewal":"1h"},"rate":{"requests":1,"per":1}}],"apis":[],"keys":[]}`), 422,
		`{"error":"the document has objects that cannot be read; nothing was changed","problems":[{"path":"policies[1].rate.per","problem":"number 1: a duration is a string with its unit, like \"1h\" or \"500ms\""}]}`)
	expect(t, call(t, "GET", baseB+"/api/revision", ""), 200, `{"revision":2}`)
	// A document that leaves a list out is refused (an import replaces
	// the whole state: a partial document would delete the rest);
	// empty lists empty the state.
	expect(t, call(t, "POST", baseB+"/api/import", `{}`), 422, `{"error":"the document leaves a list out, and an import replaces the whole state; nothing was changed","problems":[`+
		`{"path":"policies","problem":"missing: give every list (an empty list, [], deletes them all)"},{"path":"apis","problem":"missing: give every list (an empty list, [], deletes them all)"},{"path":"keys","problem":"missing: give every list (an empty list, [], deletes them all)"}]}`)
	expect(t, call(t, "POST", baseB+"/api/import", `{"policies":[],"apis":[],"keys":[]}`), 200, `{"revision":3}`)
	expect(t, call(t, "GET", baseB+"/api/export", ""), 200, `{"format_version":1,"revision":3,"policies":[],"apis":[],"keys":[]}`)
}

// BenchmarkAdminKeys100k measures 100,000 keys into a new store through
// the admin API on a real HTTP server: "batch", 10 calls of POST
// /api/keys:batch of 10,000; "posts", POST /api/keys from 16 parallel
// clients, one key a call. Reported as seconds per 100,000 keys (s/100k);
// run with -benchtime=1x.
func BenchmarkAdminKeys100k(b *testing.B) {
	const n = 100_000
	newStore := func(b *testing.B) string {
		b.StopTimer()
		defer b.StartTimer()
		_, base := server(b, controlplane.BoltOptions{}, nil)
		if a := call(b, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`); a.status != 200 {
			b.Fatal(a.body)
		}
		return base
	}
	b.Run("batch", func(b *testing.B) {
		const per = controlplane.MaxBatchKeys
		bodies := make([]string, n/per)
		for c := range bodies {
			var sb strings.Builder
			sb.WriteString(`{"keys":[`)
			for i := range per {
				if i > 0 {
					sb.WriteByte(',')
				}
				fmt.Fprintf(&sb, `{"key":"key-%d","policies":["gold"]}`, c*per+i)
			}
			sb.WriteString(`]}`)
			bodies[c] = sb.String()
		}
		b.ResetTimer()
		for range b.N {
			base := newStore(b)
			for c, body := range bodies {
				if a := call(b, "POST", base+"/api/keys:batch", body); a.status != 200 {
					b.Fatalf("batch %d: %d %.200s", c, a.status, a.body)
				}
			}
		}
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/100k")
	})
	b.Run("posts", func(b *testing.B) {
		const clients = 16
		for range b.N {
			base := newStore(b)
			var wg sync.WaitGroup
			errs := make(chan string, clients)
			for c := range clients {
				wg.Go(func() {
					for i := c; i < n; i += clients {
						if a := call(b, "POST", base+"/api/keys", fmt.Sprintf(`{"key":"key-%d","policies":["gold"]}`, i)); a.status != 201 {
							errs <- a.body
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				b.Fatal(e)
			}
		}
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/100k")
	})
}
