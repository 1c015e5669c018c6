package gateway_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// discard is a ResponseWriter that keeps nothing but its header map,
// cleared before each request, so a benchmark measures the handler.
type discard struct {
	h      http.Header
	status int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(status int)      { d.status = status }

// benchPool is an httputil.BufferPool of 32 KiB buffers.
type benchPool struct{ p sync.Pool }

func (b *benchPool) Get() []byte {
	if v, ok := b.p.Get().(*[32 << 10]byte); ok {
		return v[:]
	}
	return new([32 << 10]byte)[:]
}

func (b *benchPool) Put(buf []byte) { b.p.Put((*[32 << 10]byte)(buf)) }

// BenchmarkServeHTTP compares the gateway's request path (route, API key,
// rate limit and quota through the engine and the memory store, RateLimit
// fields, credential stripping, reverse proxy) with a bare
// httputil.ReverseProxy with the same transport settings (bare; and
// bare-pooled, with a pool of copy buffers as the gateway has), all in front of
// the same upstream answering 1 KiB, as proxybench does over the network.
// ns/op includes the upstream round trip over loopback; B/op and
// allocs/op are what each path costs on the gateway's side of it, plus
// the transport's.
func BenchmarkServeHTTP(b *testing.B) {
	body := strings.Repeat("x", 1023) + "\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, body)
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)

	store := memory.New(memory.Options{})
	defer store.Close()
	gw, err := gateway.New(gateway.Options{Store: store})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	err = gw.Apply(context.Background(), &spec.Snapshot{
		Policies: []spec.Policy{{ID: "bench",
			Rate:  &spec.Rate{Requests: 1_000_000_000, Per: spec.Duration(time.Second)},
			Quota: &spec.Quota{Max: 1_000_000_000_000_000, Renewal: spec.Duration(24 * time.Hour)}}},
		Keys: []spec.Key{{KeyHash: keyHash("bench-key"), Policies: []string{"bench"}}},
		APIs: []spec.API{{ID: "bench", ListenPath: "/bench/", Target: up.URL}},
	})
	if err != nil {
		b.Fatal(err)
	}

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 256
	defer tr.CloseIdleConnections()
	bare := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.SetXForwarded() },
		Transport: tr,
	}

	// bare-pooled is bare with a pool of copy buffers like the gateway's:
	// what the gateway adds to a ReverseProxy tuned the same way.
	pooled := *bare
	pooled.BufferPool = &benchPool{}

	for _, bc := range []struct {
		name string
		h    http.Handler
		path string
	}{
		{"bare", bare, "/bench/x"},
		{"bare-pooled", &pooled, "/bench/x"},
		{"gateway", gw, "/bench/x"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", bc.path, nil)
			req.RemoteAddr = "127.0.0.1:40000"
			req.Header.Set("X-API-Key", "bench-key")
			req.Header.Set("User-Agent", "bench")
			req.Header.Set("Accept", "*/*")
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := &discard{h: http.Header{}}
				for pb.Next() {
					clear(w.h)
					w.status = 0
					bc.h.ServeHTTP(w, req)
					if w.status != 0 && w.status != 200 {
						b.Errorf("status %d", w.status)
						return
					}
				}
			})
		})
	}

	// The fasthttp engine's path: the same gateway's ServeFastHTTP, a
	// RequestCtx per goroutine reused as fasthttp's server reuses it.
	b.Run("gateway-fasthttp", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var ctx fasthttp.RequestCtx
			var tmpl fasthttp.Request
			tmpl.SetRequestURI("/bench/x")
			tmpl.Header.SetHost("gw.test")
			tmpl.Header.Set("X-API-Key", "bench-key")
			tmpl.Header.Set("User-Agent", "bench")
			tmpl.Header.Set("Accept", "*/*")
			peer := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
			for pb.Next() {
				var req fasthttp.Request
				tmpl.CopyTo(&req)
				ctx.Init(&req, peer, nil)
				gw.ServeFastHTTP(&ctx)
				if st := ctx.Response.StatusCode(); st != 200 {
					b.Errorf("status %d", st)
					return
				}
			}
		})
	})
}

// BenchmarkApplyKeys measures Apply of a snapshot of n keys that differs
// from the running one in one key: today Apply validates the whole
// snapshot and rebuilds the key registry, so its cost grows with n. The
// data-plane agent needs this to be proportional to the change instead.
func BenchmarkApplyKeys(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			m := memory.New(memory.Options{})
			defer m.Close()
			g, err := gateway.New(gateway.Options{Store: m})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			snap := func(rev uint64) *spec.Snapshot {
				s := &spec.Snapshot{
					Revision: rev,
					Policies: []spec.Policy{{ID: "p", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Second)}}},
					APIs:     []spec.API{{ID: "a", ListenPath: "/a/", Target: spec.BuiltinEcho}},
					Keys:     make([]spec.Key, n),
				}
				for i := range s.Keys {
					s.Keys[i] = spec.Key{KeyHash: identity.HashKey(strconv.Itoa(i)).String(), Policies: []string{"p"}}
				}
				s.Keys[int(rev)%n].Inactive = true // the one change
				return s
			}
			snaps := []*spec.Snapshot{snap(1), snap(2)}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				s := *snaps[i%2]
				s.Revision = 0
				if err := g.Apply(context.Background(), &s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUpdateKeys measures UpdateKeys of one key (made inactive, then
// active again) on a gateway holding n keys: its cost is one key's
// validation and the copy of one registry shard, whatever n. It also
// reports heap-B/key: the heap the gateway holds for its configuration
// once the caller has dropped the applied snapshot (the key registry, and
// the snapshot's policies and APIs), after a garbage collection, divided
// by n.
func BenchmarkUpdateKeys(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			m := memory.New(memory.Options{})
			defer m.Close()
			g, err := gateway.New(gateway.Options{Store: m})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s := &spec.Snapshot{
				Revision: 1,
				Policies: []spec.Policy{{ID: "p", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Second)}}},
				APIs:     []spec.API{{ID: "a", ListenPath: "/a/", Target: spec.BuiltinEcho}},
				Keys:     make([]spec.Key, n),
			}
			policies := []string{"p"}
			for i := range s.Keys {
				s.Keys[i] = spec.Key{KeyHash: identity.HashKey(strconv.Itoa(i)).String(), Policies: policies}
			}
			if err := g.Apply(context.Background(), s); err != nil {
				b.Fatal(err)
			}
			s = nil
			runtime.GC()
			runtime.ReadMemStats(&after)
			heapPerKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)

			changed := identity.HashKey(strconv.Itoa(n / 2)).String()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				k := spec.Key{KeyHash: changed, Policies: policies, Inactive: i%2 == 0}
				if err := g.UpdateKeys(context.Background(), uint64(i+2), []spec.Key{k}, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(heapPerKey, "heap-B/key")
		})
	}
}
