package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/limitplane/limitplane/internal/redistest"
)

// TestMarkerWritesAndStops: the marker adds marked slots to the active
// set with their marks (a later mark of a slot replaces the earlier),
// Close stops its goroutine, and a mark after Close is dropped without
// starting another.
func TestMarkerWritesAndStops(t *testing.T) {
	c := redistest.Start(t).Client(t, nil)
	s, err := New(c, Options{FollowsControlPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.marks.add("slot-a", 5)
	s.marks.add("slot-b", 7)
	s.marks.add("slot-a", 9)
	want := map[string]float64{"slot-a": 9, "slot-b": 7}
	for deadline := time.Now().Add(10 * time.Second); ; {
		zs, err := c.ZRangeWithScores(ctx, s.activeKey, 0, -1).Result()
		got := map[string]float64{}
		for _, z := range zs {
			got[z.Member.(string)] = z.Score
		}
		if err == nil && fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("active set %v, %v; want %v", got, err, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.marks.done:
	default:
		t.Fatal("the marker's goroutine still runs after Close")
	}
	s.marks.add("slot-c", 11) // dropped: no panic, nothing pending
	if s.marks.pending != nil {
		t.Fatalf("pending after Close: %v", s.marks.pending)
	}
	if err := s.Close(); err != nil { // a second Close is harmless
		t.Fatal(err)
	}
}

// TestMarkerBounded: marks waiting for a write are bounded by
// maxPendingMarks; a slot already waiting still gets its later mark.
func TestMarkerBounded(t *testing.T) {
	var m marker
	m.init(nil)
	m.start.Do(func() {}) // no goroutine: nothing is written, so the marks pile up
	for i := range maxPendingMarks + 10 {
		m.add(fmt.Sprint("slot-", i), int64(i+1))
	}
	if len(m.pending) != maxPendingMarks {
		t.Fatalf("%d marks pending, want the bound %d", len(m.pending), maxPendingMarks)
	}
	m.add("slot-0", 99)
	if m.pending["slot-0"] != 99 || len(m.pending) != maxPendingMarks {
		t.Fatalf("slot-0's mark %d, %d pending; want 99 and %d", m.pending["slot-0"], len(m.pending), maxPendingMarks)
	}
	// A store that never marked: Close has no goroutine to wait for.
	var n marker
	n.init(nil)
	n.close()
}
