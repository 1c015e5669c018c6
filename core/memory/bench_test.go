package memory_test

// Benchmarks for the in-process limiters. Run them with
//
//	go test -run '^$' -bench . -benchmem -count 6 ./core/memory/
//
// Two workloads recur: "Admit", a limit so generous that every call is
// admitted (the expensive path: each call stores a new TAT with a CAS), and
// "Deny", an exhausted limit that denies every call (a load and no write).
// ClockRead is the bare monotonic clock read (time.Since of a fixed origin)
// that the precise-clock numbers are compared with, measured in the same run.

import (
	"context"
	"encoding/hex"
	"hash/maphash"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// admitAll admits every call at any realistic call rate: T = 1ns and
// τ = 1s, so a call would have to come more often than once a nanosecond,
// sustained for a second, to be denied.
var admitAll = core.Limit{Rate: 1_000_000_000, Period: time.Second}

// denyAll is exhausted by its first call and then denies for an hour.
var denyAll = core.Limit{Rate: 1, Period: time.Hour}

// sink keeps results alive so the compiler cannot drop the measured calls.
var sink int64

func BenchmarkClockRead(b *testing.B) {
	origin := time.Now()
	b.Run("serial", func(b *testing.B) {
		var s time.Duration
		for range b.N {
			s += time.Since(origin)
		}
		sink = int64(s)
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			var s time.Duration
			for pb.Next() {
				s += time.Since(origin)
			}
			sinkMu.Lock()
			sink += int64(s)
			sinkMu.Unlock()
		})
	})
}

// BenchmarkCoarseClockRead is the cost of reading a *core.CoarseClock
// through the core.Clock interface, for reference.
func BenchmarkCoarseClockRead(b *testing.B) {
	c := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	defer c.Stop()
	var clock core.Clock = c
	var s int64
	for range b.N {
		s += clock.Nanotime()
	}
	sink = s
}

var sinkMu sync.Mutex

// clocks returns the two production clocks by name. The coarse clock's
// ticker is stopped when b ends.
func clocks(b *testing.B) []struct {
	name  string
	clock core.Clock
} {
	coarse := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	b.Cleanup(coarse.Stop)
	return []struct {
		name  string
		clock core.Clock
	}{
		{"precise", core.NewSystemClock()},
		{"coarse", coarse},
	}
}

var workloads = []struct {
	name  string
	limit core.Limit
}{
	{"Admit", admitAll},
	{"Deny", denyAll},
}

func BenchmarkBucket(b *testing.B) {
	for _, w := range workloads {
		for _, c := range clocks(b) {
			newBucket := func(b *testing.B) *memory.Bucket {
				bk, err := memory.NewBucket(w.limit, c.clock)
				if err != nil {
					b.Fatal(err)
				}
				bk.Allow() // exhausts denyAll
				return bk
			}
			b.Run(w.name+"/"+c.name+"/serial", func(b *testing.B) {
				bk := newBucket(b)
				b.ResetTimer()
				n := int64(0)
				for range b.N {
					if bk.Allow() {
						n++
					}
				}
				sink = n
			})
			b.Run(w.name+"/"+c.name+"/parallel", func(b *testing.B) {
				bk := newBucket(b)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					n := int64(0)
					for pb.Next() {
						if bk.Allow() {
							n++
						}
					}
					sinkMu.Lock()
					sink += n
					sinkMu.Unlock()
				})
			})
		}
	}
}

// hotKey is a typical consumer id: a hex SHA-256 prefix, as identity makes.
const hotKey = "9f86d081884c7d659a2feaa0c55ad015"

func BenchmarkStoreHotKey(b *testing.B) {
	ctx := context.Background()
	for _, w := range workloads {
		for _, c := range clocks(b) {
			newStore := func(b *testing.B) (*memory.Store, core.Request) {
				s := memory.New(memory.Options{Clock: c.clock})
				b.Cleanup(func() { s.Close() })
				// Scope "" as for the engine's key-wide counters; the
				// limit prepared once, as a caller reuses its rule.
				req := core.Request{Consumer: hotKey, Rule: prepare(b, s, core.LimitSet{Rate: w.limit}), Cost: 1}
				if _, err := s.Take(ctx, req); err != nil {
					b.Fatal(err)
				}
				return s, req
			}
			b.Run(w.name+"/"+c.name+"/serial", func(b *testing.B) {
				s, req := newStore(b)
				b.ResetTimer()
				n := int64(0)
				for range b.N {
					d, _ := s.Take(ctx, req)
					if d.Allowed {
						n++
					}
				}
				sink = n
			})
			b.Run(w.name+"/"+c.name+"/parallel", func(b *testing.B) {
				s, req := newStore(b)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					n := int64(0)
					for pb.Next() {
						d, _ := s.Take(ctx, req)
						if d.Allowed {
							n++
						}
					}
					sinkMu.Lock()
					sink += n
					sinkMu.Unlock()
				})
			})
		}
	}
}

// manyKeys is the number of distinct keys in BenchmarkStoreRandomKeys.
const manyKeys = 1_000_000

// manyLimit keeps every key limited (and so unsweepable) for the whole
// benchmark while admitting each of its visits: T = 3.6s, τ = 1000×T. A
// key's first request costs firstCost units, which puts its TAT 30
// minutes ahead: a key stays limited however long filling the store
// takes on a loaded machine (at one unit, the first keys' TATs could pass
// before the last were inserted, and an insert's amortised sweep drop
// them), and 500 more visits are still admitted.
var manyLimit = core.Limit{Rate: 1000, Period: time.Hour}

const firstCost = 500

// keyFixture is two stores, one per clock, pre-filled with manyKeys random
// keys, built once per process (it takes a few seconds) and shared by the
// serial and parallel benchmarks.
type keyFixture struct {
	store  *memory.Store // precise clock
	coarse *memory.Store // coarse clock
	// keys are copies of the stored keys (as a server's request carries a
	// fresh string), allocated in the order the benchmark sends them, which
	// is a different random order from the one they were inserted in: the
	// table slots are visited in no particular order.
	keys        []string
	bytesPerKey float64 // Go heap growth of the precise store per key
	rssPerKey   float64 // RSS growth of the precise store per key; 0 if unknown
}

var (
	fixtureOnce sync.Once
	fixture     keyFixture
)

func randomKeys(b *testing.B) *keyFixture {
	fixtureOnce.Do(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		keys := make([]string, manyKeys)
		var raw [16]byte
		for i := range keys {
			for j := 0; j < len(raw); j += 8 {
				v := rng.Uint64()
				for k := range 8 {
					raw[j+k] = byte(v >> (8 * k))
				}
			}
			keys[i] = hex.EncodeToString(raw[:]) // 32 bytes, like a hashed consumer id
		}

		var before, after runtime.MemStats
		settle()
		rss0 := rssBytes()
		runtime.ReadMemStats(&before)
		fill := func(s *memory.Store) {
			ctx := context.Background()
			rule := prepare(b, s, core.LimitSet{Rate: manyLimit})
			for _, k := range keys {
				d, err := s.Take(ctx, core.Request{Consumer: k, Rule: rule, Cost: firstCost})
				if err != nil || !d.Allowed {
					panic("fixture: first request of a key not admitted")
				}
			}
			if n := s.Len(); n != manyKeys {
				panic("fixture: store lost keys while filling")
			}
		}
		s := memory.New(memory.Options{})
		fill(s)
		settle()
		rss1 := rssBytes()
		runtime.ReadMemStats(&after)
		cs := memory.New(memory.Options{Clock: core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)})
		fill(cs)
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for i, k := range keys {
			keys[i] = string([]byte(k))
		}
		fixture = keyFixture{
			store:       s,
			coarse:      cs,
			keys:        keys,
			bytesPerKey: float64(after.HeapAlloc-before.HeapAlloc) / manyKeys,
		}
		if rss0 > 0 && rss1 > 0 {
			fixture.rssPerKey = float64(rss1-rss0) / manyKeys
		}
	})
	return &fixture
}

// settle collects garbage, lets the cleanups that unmap replaced tables
// run, and returns freed memory to the OS, so RSS readings count what is
// held.
func settle() {
	last := int64(-1)
	for range 40 {
		runtime.GC()
		time.Sleep(50 * time.Millisecond) // cleanups run on their own goroutine
		debug.FreeOSMemory()
		rss := rssBytes()
		if last >= 0 && last-rss < 1<<20 {
			return // less than 1 MiB freed since the last round
		}
		last = rss
	}
}

// rssBytes returns the process's resident set (VmRSS of
// /proc/self/status) in bytes, or 0 where there is no such file.
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kib, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kib << 10
		}
	}
	return 0
}

// BenchmarkStoreRandomKeys sends requests for 1,000,000 distinct keys, already
// present, in random order, with the precise and the coarse clock.
// What the filled store holds per key is reported twice: "heap-B/key", the
// Go heap growth from inserting the keys (runtime.ReadMemStats after a GC,
// before and after), and "rss-B/key", the growth of the process's resident
// set (VmRSS, after a GC and debug.FreeOSMemory), which also counts the
// tables the store maps outside the Go heap. Both are divided by the
// number of keys. The store keeps no copy of a key (it holds a
// fingerprint), so nothing is subtracted; the benchmark's strings are
// allocated before the first reading.
func BenchmarkStoreRandomKeys(b *testing.B) {
	f := randomKeys(b)
	for _, c := range []struct {
		name  string
		store *memory.Store
	}{{"precise", f.store}, {"coarse", f.coarse}} {
		b.Run(c.name, func(b *testing.B) { benchmarkRandomKeys(b, f, c.store) })
	}
}

func benchmarkRandomKeys(b *testing.B, f *keyFixture, store *memory.Store) {
	ctx := context.Background()
	// serial-into is serial through TakeInto, which
	// writes the Decision in place instead of returning it; serial is
	// through Take. serial-into-copied is serial-into on a copy of the
	// request made after its Consumer was set, as passing it to Take by
	// value makes: the store's work is serial-into's, the copy is Take's
	// (see serialRandomKeys).
	b.Run("serial-into", func(b *testing.B) { serialRandomKeys(b, f, store, viaTakeInto) })
	b.Run("serial-into-copied", func(b *testing.B) { serialRandomKeys(b, f, store, viaTakeIntoCopied) })
	b.Run("serial", func(b *testing.B) {
		serialRandomKeys(b, f, store, viaTake)
		reportBytes(b, f)
	})
	b.Run("parallel", func(b *testing.B) {
		rule := prepare(b, store, core.LimitSet{Rate: manyLimit})
		var next sync.Mutex
		start := 0
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			next.Lock()
			i := start
			start += manyKeys / 7 // goroutines start far apart in the key list
			next.Unlock()
			req := core.Request{Rule: rule, Cost: 1}
			n := int64(0)
			for pb.Next() {
				req.Consumer = f.keys[i]
				if i++; i == manyKeys {
					i = 0
				}
				d, _ := store.Take(ctx, req)
				if d.Allowed {
					n++
				}
			}
			sinkMu.Lock()
			sink += n
			sinkMu.Unlock()
		})
		reportBytes(b, f)
	})
}

func reportBytes(b *testing.B, f *keyFixture) {
	b.ReportMetric(f.bytesPerKey, "heap-B/key")
	if f.rssPerKey > 0 {
		b.ReportMetric(f.rssPerKey, "rss-B/key")
	}
}

// How serialRandomKeys calls the store.
const (
	viaTake = iota
	viaTakeInto
	viaTakeIntoCopied
)

// serialRandomKeys sends the keys in order from one goroutine, through
// Take, TakeInto, or TakeInto on a fresh copy of the request.
//
// One goroutine in a tight loop overlaps one call's cache miss with the
// next calls' work, which is what makes the coarse-clock floor so low.
// Copying a Request whose Consumer was just written (16-byte loads over
// two 8-byte stores) cannot take the data from the store buffer: the copy
// waits until those stores are written to the cache, after the previous
// call's miss, so the calls no longer overlap. Take by value pays that copy
// (in the caller, or where it inlines); TakeInto on a request kept by the
// caller does not.
func serialRandomKeys(b *testing.B, f *keyFixture, store *memory.Store, via int) {
	ctx := context.Background()
	req := core.Request{Rule: prepare(b, store, core.LimitSet{Rate: manyLimit}), Cost: 1}
	var d core.Decision
	b.ResetTimer()
	n, i := int64(0), 0
	for range b.N {
		req.Consumer = f.keys[i]
		if i++; i == manyKeys {
			i = 0
		}
		switch via {
		case viaTakeInto:
			store.TakeInto(ctx, &req, &d)
		case viaTakeIntoCopied:
			r := req
			store.TakeInto(ctx, &r, &d)
		default:
			d, _ = store.Take(ctx, req)
		}
		if d.Allowed {
			n++
		}
	}
	sink = n
}

// BenchmarkBareMapRandomKeys looks the same 1,000,000 keys, sent in the
// same order, up in a plain Go map and bumps each with one atomic add: no
// clock, no GCRA, no concurrency safety for inserts. It is not a floor for
// the store: the map's keys and counters were allocated in the order the
// benchmark sends them, so of its three memory reads only the map group is
// a random one (see BenchmarkRandomAccessFloor).
func BenchmarkBareMapRandomKeys(b *testing.B) {
	f := randomKeys(b)
	m := make(map[string]*atomic.Int64, manyKeys)
	for _, k := range f.keys {
		m[string([]byte(k))] = new(atomic.Int64)
	}
	b.ResetTimer()
	i := 0
	for range b.N {
		m[f.keys[i]].Add(1)
		if i++; i == manyKeys {
			i = 0
		}
	}
}

// BenchmarkShardedMapRandomKeys is the naive keyed store, a peer measured
// over the same 1,000,000 keys in the same order: 256 shards, each a
// sync.RWMutex over a map[string]*atomic.Int64 holding each key's TAT;
// per request, hash the key (hash/maphash) to pick the shard, look the key
// up under the read lock, read the clock and apply GCRA with one CAS
// (core.GCRAParams.Conform, no Remaining or Decision). Its keys and TATs
// were allocated in an order unrelated to the one they are sent in, as
// the store's slots are.
func BenchmarkShardedMapRandomKeys(b *testing.B) {
	f := randomKeys(b)
	type shard struct {
		mu sync.RWMutex
		m  map[string]*atomic.Int64
		_  [64]byte
	}
	shards := make([]shard, 256)
	for i := range shards {
		shards[i].m = make(map[string]*atomic.Int64)
	}
	seed := maphash.MakeSeed()
	order := rand.New(rand.NewPCG(3, 4)).Perm(len(f.keys))
	for _, i := range order {
		k := string([]byte(f.keys[i]))
		sh := &shards[maphash.String(seed, k)>>56]
		sh.m[k] = new(atomic.Int64)
	}
	p := manyLimit.GCRA()
	run := func(b *testing.B, now func() int64) {
		i, n := 0, int64(0)
		for range b.N {
			k := f.keys[i]
			sh := &shards[maphash.String(seed, k)>>56]
			sh.mu.RLock()
			tat := sh.m[k]
			sh.mu.RUnlock()
			for {
				t := tat.Load()
				next, ok := p.Conform(t, now(), 1)
				if !ok || tat.CompareAndSwap(t, next) {
					if ok {
						n++
					}
					break
				}
			}
			if i++; i == manyKeys {
				i = 0
			}
		}
		sink = n
	}
	precise := core.NewSystemClock()
	coarse := core.NewCoarseClock(precise, time.Millisecond)
	b.Cleanup(coarse.Stop)
	b.Run("precise/serial", func(b *testing.B) { run(b, precise.Nanotime) })
	b.Run("coarse/serial", func(b *testing.B) { run(b, coarse.Nanotime) })
}

// BenchmarkRandomAccessFloor is the machine's floor for
// BenchmarkStoreRandomKeys: per request, hash the key (hash/maphash), read
// the clock (precise: a monotonic read; coarse: an atomic load), and CAS
// one int64 at a random place in 64 MiB, the size of the store's tables
// for 1,000,000 keys. The store does this plus the fingerprint check, the
// GCRA arithmetic and filling the Decision; the difference between the two
// is what the store adds.
func BenchmarkRandomAccessFloor(b *testing.B) {
	f := randomKeys(b)
	cells := make([]atomic.Int64, 64<<20/8)
	mask := uint64(len(cells) - 1)
	seed := maphash.MakeSeed()
	run := func(b *testing.B, now func() int64) {
		i := 0
		for range b.N {
			cell := &cells[maphash.String(seed, f.keys[i])&mask]
			cell.CompareAndSwap(cell.Load(), now())
			if i++; i == manyKeys {
				i = 0
			}
		}
	}
	precise := core.NewSystemClock()
	coarse := core.NewCoarseClock(precise, time.Millisecond)
	b.Cleanup(coarse.Stop)
	// The clocks are called directly (the closures inline into run's
	// caller only if run does; either way both variants pay the same call).
	b.Run("precise/serial", func(b *testing.B) { run(b, precise.Nanotime) })
	b.Run("coarse/serial", func(b *testing.B) { run(b, coarse.Nanotime) })
}

// BenchmarkStoreHotKeyInto is BenchmarkStoreHotKey's serial case through
// TakeInto, which writes the Decision in place.
func BenchmarkStoreHotKeyInto(b *testing.B) {
	ctx := context.Background()
	for _, w := range workloads {
		for _, c := range clocks(b) {
			b.Run(w.name+"/"+c.name+"/serial", func(b *testing.B) {
				s := memory.New(memory.Options{Clock: c.clock})
				b.Cleanup(func() { s.Close() })
				req := core.Request{Consumer: hotKey, Rule: prepare(b, s, core.LimitSet{Rate: w.limit}), Cost: 1}
				var d core.Decision
				if err := s.TakeInto(ctx, &req, &d); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				n := int64(0)
				for range b.N {
					s.TakeInto(ctx, &req, &d)
					if d.Allowed {
						n++
					}
				}
				sink = n
			})
		}
	}
}

// BenchmarkEngineRandomKeys is core.Engine.Decide over the coarse-clock
// store of BenchmarkStoreRandomKeys: one policy with the same limit, the
// same 1,000,000 keys as consumers, sent in the same order (the consumers
// lie in a slice in that order, as the keys do, and share one policy list,
// as identity.Keys's records with the same policies do, so only the
// store's slot is a random memory access). The engine calls the store's Take.
func BenchmarkEngineRandomKeys(b *testing.B) {
	f := randomKeys(b)
	consumers := make([]core.Consumer, manyKeys)
	policies := []string{"p"} // shared, as identity's registry shares a list among its keys
	for i, k := range f.keys {
		consumers[i] = core.Consumer{ID: k, Policies: policies}
	}
	e, err := core.NewEngine(f.coarse, core.Config{Policies: []core.Policy{{ID: "p", Rate: manyLimit}}}, core.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// The consumers (56 MB) were just allocated: collect now, so that the
	// collection they start is not running beside the timed loop (with
	// its write barriers on) as none is beside the store's own benchmark.
	runtime.GC()
	b.ResetTimer()
	n, i := int64(0), 0
	for range b.N {
		if d, _ := e.Decide(ctx, &consumers[i], "api", 1); d.Allowed {
			n++
		}
		if i++; i == manyKeys {
			i = 0
		}
	}
	sink = n
}

// BenchmarkEngineHotKey is core.Engine.Decide for one consumer over a store
// on the coarse clock: one policy with the limit of BenchmarkStoreHotKey's
// workloads, so it pairs with BenchmarkStoreHotKeyInto's coarse rows (the
// engine's cost over the store's bare TakeInto).
func BenchmarkEngineHotKey(b *testing.B) {
	ctx := context.Background()
	coarse := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	b.Cleanup(coarse.Stop)
	for _, w := range workloads {
		b.Run(w.name+"/coarse/serial", func(b *testing.B) {
			s := memory.New(memory.Options{Clock: coarse})
			b.Cleanup(func() { s.Close() })
			e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "p", Rate: w.limit}}}, core.Options{})
			if err != nil {
				b.Fatal(err)
			}
			c := &core.Consumer{ID: hotKey, Policies: []string{"p"}}
			if _, err := e.Decide(ctx, c, "api", 1); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			n := int64(0)
			for range b.N {
				if d, _ := e.Decide(ctx, c, "api", 1); d.Allowed {
					n++
				}
			}
			sink = n
		})
	}
}

// BenchmarkStoreAlternatingRules is the cost of a key whose requests
// alternate between two rules of different emission intervals (two
// policies of different rates on one key-wide counter, or a limit change
// with requests of both in flight): every request converts the key's TAT
// to its own rule's units (see the package comment, "Limit changes").
// "same" sends the same two rules' worth of requests under one rule, for
// comparison. Coarse clock, TakeInto, one goroutine.
func BenchmarkStoreAlternatingRules(b *testing.B) {
	ctx := context.Background()
	coarse := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	b.Cleanup(coarse.Stop)
	for _, alternate := range []bool{false, true} {
		name := "same"
		if alternate {
			name = "alternating"
		}
		b.Run(name, func(b *testing.B) {
			s := memory.New(memory.Options{Clock: coarse})
			b.Cleanup(func() { s.Close() })
			reqs := [2]core.Request{
				{Consumer: hotKey, Rule: prepare(b, s, core.LimitSet{Rate: admitAll}), Cost: 1},
				{Consumer: hotKey, Rule: prepare(b, s, core.LimitSet{Rate: core.Limit{Rate: 500_000_000, Period: time.Second}}), Cost: 1},
			}
			if !alternate {
				reqs[1] = reqs[0]
			}
			var d core.Decision
			b.ReportAllocs()
			b.ResetTimer()
			n := int64(0)
			for i := range b.N {
				s.TakeInto(ctx, &reqs[i&1], &d)
				if d.Allowed {
					n++
				}
			}
			sink = n
		})
	}
}
