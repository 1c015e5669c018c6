package core

import (
	"context"
	"sync/atomic"
)

// Releaser gives back what an admitted request holds in a store until its
// response is done: an in-flight slot (LimitSet.InFlight). Stores implement
// it; callers hold it through a Hold, which calls Release at most once.
// Release must not block for long and must not depend on the request's
// context, which may be cancelled by then (a client gone, a timeout): a
// store that needs I/O bounds it with a context of its own.
type Releaser interface {
	Release()
}

// Hold is what an admitted Decision holds until the request is done: the
// in-flight slots its limits took (see LimitSet.InFlight). The zero Hold
// holds nothing. Call Release once the response is done, whatever happens
// (with defer, so a panic, a cancelled client and an upstream timeout
// release too); Release is idempotent and safe for concurrent use, and
// copies of a Hold share its state, so the second Release of any copy does
// nothing.
//
// A Hold is also where work that must wait for the response is attached:
// settling a cost known only after the response is a store call at
// Release time.
//
// A Hold is one pointer, so it adds 8 bytes to a Decision.
type Hold struct{ h *hold }

type hold struct {
	r    Releaser
	done atomic.Bool
}

// NewHold returns a Hold that calls r.Release on its first Release; the zero
// Hold when r is nil. It allocates one small object.
func NewHold(r Releaser) Hold {
	if r == nil {
		return Hold{}
	}
	return Hold{&hold{r: r}}
}

// Settler is a Releaser that can also settle a cost known only after the
// response (LimitSet.Settle): Settle(actual, landed) charges or refunds
// the difference between actual (≥ 0) and the estimate the request was
// charged, in the quota period it was charged in (never another), never
// taking a counter below zero, and ends the hold as Release does. Like
// Release it must not depend on the request's context, and must not block
// for long: a store may apply the settle after Settle returns, provided
// its later decisions of the same quota see it.
//
// landed, when not nil, is called at most once, once the settle has
// landed: with known true and the count of units its period holds after
// it, when the store learnt that count (core/redisstore, from its
// script's reply), on whatever goroutine sent the settle but before the
// store's later decisions of the quota see it, so landed must not block
// or call the store; or with known false when the store cannot tell the
// count, or whether the period it changed still counts (core/memory),
// on the caller's goroutine, so landed may read it. A store that knows
// the settle changed nothing (the actual cost was the estimate, the
// period had ended or was reset, or the settle failed and the estimate
// stands) does not call it. The engine uses it to tell a QuotaObserver
// of the thresholds a settle reaches without a store call of its own.
type Settler interface {
	Releaser
	Settle(actual int64, landed func(used int64, known bool))
}

// Settle ends h as Release does, first settling the cost of a request
// whose limits settle after the response (LimitSet.Settle) to actual
// units (≥ 0; a negative actual is taken as 0): the difference from the
// estimate charged at Decide is charged or refunded in the quota period
// that estimate went to. A request whose actual cost is unknown (the
// upstream sent none) calls Release instead and keeps the estimate. Only
// the first of Release and Settle, on h or any copy, does anything. A
// store that fails to settle keeps the estimate.
//
// When the settle lands is the store's: core/memory applies it before
// Settle returns (a compare-and-swap on the period's count, no I/O);
// core/redisstore returns at once and sends it in the background, and
// its later decisions of the same quota wait for it, so the request after
// a settle sees it either way (redisstore.Options.SyncSettle sends it
// before returning instead).
func (h Hold) Settle(actual int64) { h.settle(actual, nil) }

// settle is Settle, with Settler's landed.
func (h Hold) settle(actual int64, landed func(used int64, known bool)) {
	if h.h == nil || !h.h.done.CompareAndSwap(false, true) {
		return
	}
	if s, ok := h.h.r.(Settler); ok {
		s.Settle(max(actual, 0), landed)
		return
	}
	h.h.r.Release()
}

// Held reports whether h holds anything not yet released.
func (h Hold) Held() bool { return h.h != nil && !h.h.done.Load() }

// Release gives back what h holds. Only the first call, on h or any copy
// of it, does anything; on the zero Hold it does nothing.
func (h Hold) Release() {
	if h.h != nil && h.h.done.CompareAndSwap(false, true) {
		h.h.r.Release()
	}
}

// JoinHolds returns a Hold whose Release releases a and then b: for a
// request several limits of which hold slots (an endpoint's and its API's).
// A zero argument is left out; joining two zero Holds is the zero Hold.
func JoinHolds(a, b Hold) Hold {
	switch {
	case a.h == nil:
		return b
	case b.h == nil:
		return a
	}
	return NewHold(joined{a.h, b.h})
}

type joined [2]*hold

func (j joined) Release() {
	Hold{j[0]}.Release()
	Hold{j[1]}.Release()
}

// Settle settles both (each Settler among them is told landed; of the
// holds stores join, an in-flight slot and a settlement, one is).
func (j joined) Settle(actual int64, landed func(used int64, known bool)) {
	Hold{j[0]}.settle(actual, landed)
	Hold{j[1]}.settle(actual, landed)
}

// inFlightKey is the context key of WithoutInFlight.
type inFlightKey struct{}

// WithoutInFlight returns a context under which stores decide requests
// without their rules' in-flight limits (LimitSet.InFlight): no slot is
// taken or checked, and the Decision holds nothing. It is for callers for
// which no response exists to bound a slot's life, such as Wait (which
// uses it): such a call is limited by the rule's rate and quota alone.
func WithoutInFlight(ctx context.Context) context.Context {
	return context.WithValue(ctx, inFlightKey{}, true)
}

// InFlightSkipped reports whether ctx comes from WithoutInFlight. Stores
// call it only for rules with an in-flight limit.
func InFlightSkipped(ctx context.Context) bool {
	v, _ := ctx.Value(inFlightKey{}).(bool)
	return v
}
