package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// WaitSettles waits up to 10 s for s to have no settle pending (queued or
// on its way to Redis), for tests that read the quota hash straight from
// Redis after Hold.Settle.
func WaitSettles(t testing.TB, s *Store) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.settles.pending.Load() != 0; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d settles still pending after 10 s", s.settles.pending.Load())
		}
	}
}

// PendingSettles returns how many settles s has pending.
func PendingSettles(s *Store) int64 { return s.settles.pending.Load() }

// CancelNextSlot cancels, as a failed take's cancel does, the slot of
// (consumer, scope) that s's next in-flight take will ask for, and waits
// until Redis has it: a cancel that reaches Redis before its take.
func CancelNextSlot(t testing.TB, s *Store, consumer, scope string) {
	t.Helper()
	f := &s.flights
	key := s.key(consumer, inFlightKind, scope)
	member := f.prefix + ":" + strconv.FormatUint(f.seq.Load()+1, 10)
	err := inFlightCancelScript.Run(context.Background(), s.client, []string{key, canceledKey(key)}, member, int64(canceledMark/time.Millisecond)).Err()
	if err != nil {
		t.Fatal(err)
	}
}

// SlowCancelRetries makes s wait up to its lease/3 before it sends a
// failed cancel again (50 ms at first otherwise), so that a test sees
// what a request does while cancels wait. Call it before s's first
// in-flight take.
func SlowCancelRetries(s *Store) { s.flights.retry = time.Hour }
