package twoatomic

import (
	"testing"
	"time"
)

// TestSingleGoroutine checks the bucket's arithmetic on a stepped clock,
// where no race can occur.
func TestSingleGoroutine(t *testing.T) {
	now := int64(1_000_000)
	b := New(10, 3, func() int64 { return now }) // a token per 100ms
	for i := range 3 {
		if !b.Allow() {
			t.Fatalf("request %d of a full bucket denied", i)
		}
	}
	if b.Allow() {
		t.Fatal("empty bucket admitted")
	}
	now += int64(99 * time.Millisecond)
	if b.Allow() {
		t.Fatal("admitted before a whole token was earned")
	}
	now += int64(time.Millisecond)
	if !b.Allow() || b.Allow() {
		t.Fatal("want exactly one admission after 100ms")
	}
	// Idle for an hour: the bucket holds capacity, not more.
	now += int64(time.Hour)
	n := 0
	for b.Allow() {
		n++
	}
	if n != 3 {
		t.Fatalf("admitted %d after a long idle time, want capacity 3", n)
	}
	// The fraction earned before a refill is dropped: 150ms, then 50ms,
	// earns one token, not two.
	now += int64(150 * time.Millisecond)
	if !b.Allow() {
		t.Fatal("denied after 150ms")
	}
	now += int64(50 * time.Millisecond)
	if b.Allow() {
		t.Fatal("admitted on a dropped fraction (the published design drops it)")
	}
}

// TestRefillRace replays, step by step on one goroutine, the interleaving
// the package comment describes: A reads the refill time and computes one
// earned token, B runs a whole Allow (refilling that token and taking it),
// then A adds the same token again. One token earned, two admitted.
func TestRefillRace(t *testing.T) {
	now := int64(1_000_000)
	b := New(10, 1, func() int64 { return now })
	if !b.Allow() || b.Allow() {
		t.Fatal("setup: want one admission, then empty")
	}
	now += int64(100 * time.Millisecond) // one token earned
	earnedA := b.earned(now)             // A: reads the old refill time
	if earnedA != 1 {
		t.Fatalf("earned = %d, want 1", earnedA)
	}
	if !b.Allow() { // B: refills the token and takes it
		t.Fatal("B denied")
	}
	if !b.refill(now, earnedA) { // A: refills the same token again
		t.Fatal("A's stale refill failed; the race did not happen")
	}
	// Two admissions for one token: the overshoot the accuracy run counts.
}
