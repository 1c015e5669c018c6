package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/spec"
)

// Phases of a failover test, as the writers see them.
const (
	phasePrimary  = iota // the primary runs
	phaseDown            // the primary is stopped, the standby not yet promoted
	phasePromoted        // the standby is being or has been promoted
)

// failoverWrite is one Update of the failover test: two keys, both
// written or neither.
type failoverWrite struct {
	keys          [2]string // key hashes
	rev           uint64
	err           error
	before, after int // phases when it started and returned
}

// waitUntil fails the test unless cond holds within d, checking every
// 20 ms.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPostgresFollowsPromotedStandby: two Postgres stores (two
// control-plane replicas) open one multi-host connection string
// (primary, synchronous standby; target_session_attrs=read-write). 8
// writers write two keys per Update through both while the primary is
// stopped at once (pg_ctl stop -m immediate) and the standby promoted.
// Every write that started and ended with the primary down fails with
// ErrStoreUnavailable and left nothing; every error is
// ErrStoreUnavailable; writes succeed again through both stores without
// reopening them; every acknowledged write is on the new primary with
// both keys at its revision; no write is half there; the change log's
// revisions run 1..R without a gap, one write each; and the LISTEN
// connection of the store that polls only hourly reconnects to the new
// primary, so its RevisionChanged fires for a write through the other.
func TestPostgresFollowsPromotedStandby(t *testing.T) {
	primary := pgtest.Start(t, pgtest.Options{})
	standby := primary.StartStandby(t, pgtest.StandbyOptions{Synchronous: true})
	multi := pgtest.MultiHostConnString(primary, standby)
	ctx := context.Background()
	// a learns of b's writes by polling (its own are announced by
	// itself); b only by LISTEN: a poll an hour apart never fires here.
	a := openPostgres(t, multi, controlplane.PostgresOptions{DisableListen: true})
	b := openPostgres(t, multi, controlplane.PostgresOptions{PollInterval: time.Hour})
	update(t, a, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })

	const writers = 8
	var phase atomic.Int32
	var acked, downFailed, ackedPromoted atomic.Int64
	stop := make(chan struct{})
	results := make([][]failoverWrite, writers)
	var wg sync.WaitGroup
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopWriters)
	for w := range writers {
		s := []controlplane.Store{a, b}[w%2]
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				fw := failoverWrite{keys: [2]string{hash(fmt.Sprint("fo-", w, "-", i, "-a")), hash(fmt.Sprint("fo-", w, "-", i, "-b"))}}
				fw.before = int(phase.Load())
				fw.rev, fw.err = s.Update(ctx, func(tx controlplane.Tx) error {
					for _, h := range fw.keys {
						if err := tx.PutKey(spec.Key{KeyHash: h, Policies: []string{"gold"}}); err != nil {
							return err
						}
					}
					return nil
				})
				fw.after = int(phase.Load())
				results[w] = append(results[w], fw)
				switch {
				case fw.err == nil:
					acked.Add(1)
					if fw.before == phasePromoted {
						ackedPromoted.Add(1)
					}
				case fw.before == phaseDown && fw.after == phaseDown:
					downFailed.Add(1)
				}
				if fw.err != nil {
					time.Sleep(10 * time.Millisecond) // no busy loop while the database is away
				}
			}
		})
	}
	waitUntil(t, 60*time.Second, "200 writes acknowledged by the primary", func() bool { return acked.Load() >= 200 })
	primary.StopImmediate()
	phase.Store(phaseDown)
	waitUntil(t, 60*time.Second, "16 writes failed with the primary down", func() bool { return downFailed.Load() >= 16 })
	phase.Store(phasePromoted)
	standby.Promote()
	waitUntil(t, 60*time.Second, "200 writes acknowledged after the promotion", func() bool { return ackedPromoted.Load() >= 200 })
	stopWriters()

	snap, err := a.Snapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for _, k := range snap.Keys {
		present[k.KeyHash] = true
	}
	byKeys := map[[2]string]failoverWrite{}
	var nAcked, nPresent, nDownFailed int
	ackedRevs := map[uint64]bool{}
	for w, rs := range results {
		for i, fw := range rs {
			byKeys[fw.keys] = fw
			inA, inB := present[fw.keys[0]], present[fw.keys[1]]
			if inA != inB {
				t.Errorf("writer %d write %d (err %v) half there: key a %v, key b %v", w, i, fw.err, inA, inB)
			}
			if inA {
				nPresent++
			}
			if fw.err != nil && !errors.Is(fw.err, controlplane.ErrStoreUnavailable) {
				t.Errorf("writer %d write %d (phases %d→%d): %v, want ErrStoreUnavailable", w, i, fw.before, fw.after, fw.err)
			}
			switch {
			case fw.err == nil:
				nAcked++
				if !inA || !inB {
					t.Errorf("writer %d write %d acknowledged at revision %d (phases %d→%d) is lost", w, i, fw.rev, fw.before, fw.after)
				}
				if ackedRevs[fw.rev] {
					t.Errorf("revision %d acknowledged twice", fw.rev)
				}
				ackedRevs[fw.rev] = true
			case fw.before == phaseDown && fw.after == phaseDown:
				nDownFailed++
				if inA || inB {
					t.Errorf("writer %d write %d failed with the primary down (%v) but is there", w, i, fw.err)
				}
			}
		}
	}
	t.Logf("%d writes acknowledged, %d failed with the primary down, %d on the new primary at revision %d", nAcked, nDownFailed, nPresent, snap.Revision)
	if nDownFailed < 16 || nAcked < 400 {
		t.Fatalf("%d writes acknowledged, %d failed with the primary down: want at least 400 and 16", nAcked, nDownFailed)
	}
	if len(snap.Keys) != 2*nPresent {
		t.Fatalf("%d keys on the new primary, want %d (2 for each of %d writes there)", len(snap.Keys), 2*nPresent, nPresent)
	}

	// The change log: revision 1 the policy, then one write (its two
	// keys) per revision, 2..R with no gap, R the store's revision.
	cs, err := a.ChangesSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantRev := uint64(1 + nPresent)
	if snap.Revision != wantRev || len(cs) != 1+2*nPresent {
		t.Fatalf("revision %d with %d changes, want revision %d (1 + %d writes there) with %d changes", snap.Revision, len(cs), wantRev, nPresent, 1+2*nPresent)
	}
	if cs[0].Revision != 1 || cs[0].Object != controlplane.ObjectPolicy {
		t.Fatalf("change 0: revision %d %s, want revision 1, the policy", cs[0].Revision, cs[0].Object)
	}
	for r := uint64(2); r <= wantRev; r++ {
		c0, c1 := cs[2*r-3], cs[2*r-2]
		if c0.Revision != r || c1.Revision != r || c0.Op != controlplane.OpPut || c1.Op != controlplane.OpPut {
			t.Fatalf("changes %d and %d: revisions %d and %d, ops %s and %s; want two puts at revision %d", 2*r-3, 2*r-2, c0.Revision, c1.Revision, c0.Op, c1.Op, r)
		}
		fw, ok := byKeys[[2]string{c0.ID, c1.ID}]
		if !ok {
			fw, ok = byKeys[[2]string{c1.ID, c0.ID}]
		}
		if !ok {
			t.Fatalf("revision %d puts keys %s and %s, not one write's", r, c0.ID, c1.ID)
		}
		if fw.err == nil && fw.rev != r {
			t.Fatalf("a write acknowledged at revision %d is in the change log at %d", fw.rev, r)
		}
	}
	if got := revision(t, b); got != wantRev {
		t.Fatalf("store b at revision %d, want %d", got, wantRev)
	}

	// b's LISTEN connection is back, on the new primary: wait until it
	// listens there and its reconnection's own announcement has passed,
	// then a write through a must close b's RevisionChanged.
	waitUntil(t, 60*time.Second, "b's LISTEN connection on the promoted standby", func() bool {
		return pgInt(t, standby.ConnString(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'limitplane-controlplane-listen' AND query = 'LISTEN limitplane_revision'") == 1
	})
	var ch <-chan struct{}
	for quiet := false; !quiet; {
		ch = b.RevisionChanged()
		select {
		case <-ch:
		case <-time.After(500 * time.Millisecond):
			quiet = true
		}
	}
	rev := update(t, a, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 20)) })
	if rev != wantRev+1 {
		t.Fatalf("write after the failover at revision %d, want %d", rev, wantRev+1)
	}
	waitClosed(t, ch, "store b after a write through a on the new primary")
	if got := revision(t, b); got != wantRev+1 {
		t.Fatalf("store b at revision %d after the notification, want %d", got, wantRev+1)
	}
}

// TestPostgresWritesOnStandbyUnavailable: a store whose connection string
// lacks target_session_attrs (or whose one address has moved to a
// standby) reaches the standby once the primary is stopped: its writes
// there fail with ErrStoreUnavailable (SQLSTATE 25006, a read-only
// transaction) and leave nothing, its reads go on and see every
// acknowledged write, and once the standby is promoted its writes
// succeed at the next revision, without reopening the store.
func TestPostgresWritesOnStandbyUnavailable(t *testing.T) {
	primary := pgtest.Start(t, pgtest.Options{})
	standby := primary.StartStandby(t, pgtest.StandbyOptions{Synchronous: true})
	ctx := context.Background()
	both := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable", primary.Port, standby.Port, pgtest.Database)
	s := openPostgres(t, both, controlplane.PostgresOptions{})
	update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
	for i := range 20 {
		update(t, s, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash(fmt.Sprint("ro-", i)), Policies: []string{"gold"}})
		})
	}
	primary.StopImmediate()
	// The pool's connections to the primary are dead: the first calls may
	// fail on them; then reads reach the standby.
	waitUntil(t, 30*time.Second, "a read on the standby", func() bool {
		var n int
		err := s.View(ctx, func(r controlplane.Reader) error {
			ks, err := r.Keys("", 100)
			n = len(ks)
			return err
		})
		if err != nil && !errors.Is(err, controlplane.ErrStoreUnavailable) {
			t.Fatalf("read with the primary down: %v, want ErrStoreUnavailable or success", err)
		}
		return err == nil && n == 20
	})
	if got := revision(t, s); got != 21 {
		t.Fatalf("revision %d on the standby, want 21", got)
	}
	// Until five writes have reached the standby (a write may still
	// meet a dead connection to the primary first): each fails.
	readOnly := 0
	for i := 0; readOnly < 5; i++ {
		if i == 100 {
			t.Fatalf("%d of 100 writes refused as read-only by the standby, want 5", readOnly)
		}
		_, err := s.Update(ctx, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash(fmt.Sprint("ro-lost-", i)), Policies: []string{"gold"}})
		})
		if !errors.Is(err, controlplane.ErrStoreUnavailable) {
			t.Fatalf("write %d on the standby: %v, want ErrStoreUnavailable", i, err)
		}
		if strings.Contains(err.Error(), "SQLSTATE 25006") {
			readOnly++
		}
	}
	standby.Promote()
	var rev uint64
	waitUntil(t, 30*time.Second, "a write on the promoted standby", func() bool {
		var err error
		rev, err = s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 20)) })
		if err != nil && !errors.Is(err, controlplane.ErrStoreUnavailable) {
			t.Fatalf("write after the promotion: %v, want ErrStoreUnavailable or success", err)
		}
		return err == nil
	})
	if rev != 22 {
		t.Fatalf("first write after the promotion at revision %d, want 22", rev)
	}
	cs, err := s.ChangesSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 22 {
		t.Fatalf("%d changes since 0, want 22 (the 5 writes refused on the standby absent)", len(cs))
	}
	for i, c := range cs {
		if c.Revision != uint64(i+1) {
			t.Fatalf("change %d at revision %d, want %d", i, c.Revision, i+1)
		}
	}
}
