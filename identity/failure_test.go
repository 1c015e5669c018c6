package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// peekFail returns the remaining failure budget of a client key.
func peekFail(t testing.TB, eng *core.Engine, key string) int64 {
	t.Helper()
	d, err := eng.Decide(context.Background(), &core.Consumer{ID: FailureIDPrefix + key, Policies: []string{"authfail"}}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

func TestFailureLimited(t *testing.T) {
	k := keys(t)
	eng, store, clock := engine(t) // authfail: 3 per minute, T = 20s
	j := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)}, DefaultPolicies: []string{"basic"}})
	fl := &FailureLimited{Auth: j, Limiter: eng, Policy: "authfail"}
	good := sign(t, jwt.SigningMethodHS256, k.secret, "", claims("alice", nil))
	bad := sign(t, jwt.SigningMethodHS256, k.secret, "", claims("alice", jwt.MapClaims{"exp": testNow.Add(-time.Hour).Unix()}))
	const attacker, other = "198.51.100.7:5555", "198.51.100.8:5555"
	req := func(peer, tok string) *testReq { return newReq(peer).with("Authorization", "Bearer "+tok) }
	ctx := context.Background()

	// Successful authentications cost nothing.
	for range 5 {
		if c, err := fl.Authenticate(ctx, req(attacker, good)); err != nil || c.ID != "jwt:alice" {
			t.Fatalf("%v %+v", err, c)
		}
	}
	if store.Len() != 0 {
		t.Fatalf("store len %d after successes", store.Len())
	}
	// Three failures are answered 401 and charged to the address only.
	for i := range 3 {
		_, err := fl.Authenticate(ctx, req(attacker, bad))
		authErr(t, err, 401, ErrInvalidCredentials, reasonExpired)
		if got := peekFail(t, eng, "198.51.100.7"); got != int64(2-i) {
			t.Fatalf("after failure %d: remaining %d", i+1, got)
		}
	}
	if store.Len() != 1 {
		t.Fatalf("store len %d, want 1 (the address's failure counter)", store.Len())
	}
	// Over budget: LimitError before the credentials are even looked at,
	// for bad and good tokens alike.
	for _, tok := range []string{bad, good, ""} {
		_, err := fl.Authenticate(ctx, req(attacker, tok))
		var le *LimitError
		if !errors.As(err, &le) || !errors.Is(err, ErrTooManyFailures) {
			t.Fatalf("over budget: %v", err)
		}
		d := le.Decision
		if d.Allowed || d.DecidedBy != core.KindRate || d.Policy != "authfail" || d.RetryAfter != 20*time.Second || d.Limit != 3 || d.Remaining != 0 {
			t.Fatalf("decision %+v", d)
		}
		if le.Error() != "too many failed authentication attempts; retry after 20000ms" {
			t.Fatalf("Error() = %q", le.Error())
		}
	}
	// Another address is unaffected, and the claimed identity never got a
	// counter.
	if c, err := fl.Authenticate(ctx, req(other, good)); err != nil || c.ID != "jwt:alice" {
		t.Fatalf("other client: %v", err)
	}
	if store.Len() != 1 {
		t.Fatalf("store len %d, want 1", store.Len())
	}
	// After T one attempt is allowed again.
	clock.Advance(20 * time.Second)
	_, err := fl.Authenticate(ctx, req(attacker, ""))
	authErr(t, err, 401, ErrMissingCredentials, "no token")
	if _, err := fl.Authenticate(ctx, req(attacker, good)); !errors.Is(err, ErrTooManyFailures) {
		t.Fatalf("budget spent again: %v", err)
	}
	clock.Advance(20 * time.Second)
	if c, err := fl.Authenticate(ctx, req(attacker, good)); err != nil || c.ID != "jwt:alice" {
		t.Fatalf("after refill: %v", err)
	}
}

// TestFailureLimitedAPIKeys: the same protection over API keys, and a
// failed key never creates state under the key it claimed.
func TestFailureLimitedAPIKeys(t *testing.T) {
	eng, store, _ := engine(t)
	ks, err := NewKeys([]KeyRecord{{Hash: HashKey("right"), Policies: []string{"basic"}}})
	if err != nil {
		t.Fatal(err)
	}
	cip := mustClientIP(t, ClientIPOptions{IPv4PrefixLen: 24})
	fl := &FailureLimited{Auth: NewAPIKey(ks, APIKeyOptions{}), Limiter: eng, Policy: "authfail", ClientIP: cip}
	var got []string
	for i, key := range []string{"guess1", "guess2", "guess3", "right", "guess4"} {
		r := newReq("203.0.113."+string(rune('1'+i))+":1").with("X-API-Key", key) // one /24
		_, err := fl.Authenticate(context.Background(), r)
		switch {
		case err == nil:
			got = append(got, "ok")
		case errors.Is(err, ErrTooManyFailures):
			got = append(got, "429")
		default:
			var e *Error
			errors.As(err, &e)
			got = append(got, e.Reason)
		}
	}
	want := []string{"unknown API key", "unknown API key", "unknown API key", "429", "429"}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	if store.Len() != 1 || peekFail(t, eng, "203.0.113.0/24") != 0 {
		t.Fatalf("store len %d", store.Len())
	}
	guess := &core.Consumer{ID: HashKey("guess1").ConsumerID(), Policies: []string{"basic"}}
	if d, _ := eng.Decide(context.Background(), guess, "", 0); d.Remaining != 2 {
		t.Fatalf("claimed key has state: %+v", d)
	}
}

// stubLimiter returns fixed answers.
type stubLimiter struct {
	peek, take core.Decision
	err        error
	calls      []int64
}

func (s *stubLimiter) Decide(_ context.Context, c *core.Consumer, api string, cost int64) (core.Decision, error) {
	s.calls = append(s.calls, cost)
	if cost == 0 {
		return s.peek, s.err
	}
	return s.take, s.err
}

func TestFailureLimitedEdges(t *testing.T) {
	k := keys(t)
	j := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)}})
	good := bearer(sign(t, jwt.SigningMethodHS256, k.secret, "", claims("alice", nil)))
	ctx := context.Background()

	// Engine errors pass through (e.g. fail-closed store).
	s := &stubLimiter{err: core.ErrStoreUnavailable}
	if _, err := (&FailureLimited{Auth: j, Limiter: s, Policy: "p"}).Authenticate(ctx, good); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Fatalf("err = %v", err)
	}
	// The budget refilled between peek and charge: the request paid its
	// unit and is authenticated, with no second charge.
	spentPeek := core.Decision{Allowed: true, Rate: core.Status{Limit: 3, Remaining: 0}}
	s = &stubLimiter{peek: spentPeek, take: core.Decision{Allowed: true}}
	if _, err := (&FailureLimited{Auth: j, Limiter: s, Policy: "p"}).Authenticate(ctx, bearer("junk")); !errors.Is(err, ErrInvalidCredentials) {
		t.Fatalf("err = %v", err)
	}
	if len(s.calls) != 2 || s.calls[0] != 0 || s.calls[1] != 1 {
		t.Fatalf("calls %v", s.calls)
	}
	// A spent quota blocks as well.
	s = &stubLimiter{peek: core.Decision{Allowed: true, Quota: core.Status{Limit: 10}}, take: core.Decision{DecidedBy: core.KindQuota, RetryAfter: time.Hour}}
	if _, err := (&FailureLimited{Auth: j, Limiter: s, Policy: "p"}).Authenticate(ctx, good); !errors.Is(err, ErrTooManyFailures) {
		t.Fatalf("err = %v", err)
	}
	// Unparseable peer: Auth alone decides; nothing is charged.
	s = &stubLimiter{}
	r := newReq("@unix").with("Authorization", "Bearer junk")
	if _, err := (&FailureLimited{Auth: j, Limiter: s, Policy: "p"}).Authenticate(ctx, r); !errors.Is(err, ErrInvalidCredentials) || len(s.calls) != 0 {
		t.Fatalf("err = %v, calls %v", err, s.calls)
	}
	// Errors that are not *Error are not charged.
	s = &stubLimiter{}
	boom := errors.New("boom")
	fl := &FailureLimited{Auth: authFunc(func() (*core.Consumer, error) { return nil, boom }), Limiter: s, Policy: "p"}
	if _, err := fl.Authenticate(ctx, newReq("192.0.2.1:1")); err != boom || len(s.calls) != 1 {
		t.Fatalf("err = %v, calls %v", err, s.calls)
	}
}

type authFunc func() (*core.Consumer, error)

func (f authFunc) Authenticate(context.Context, Request) (*core.Consumer, error) { return f() }

// observed records what an engine's Observer is told.
type observed struct {
	mu  sync.Mutex
	got []string
}

func (o *observed) ObserveDecision(api string, d core.Decision, err error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, fmt.Sprintf("%s/%s/%v/%v", api, d.Policy, d.Allowed, err))
}

// TestFailureLimitedObserved: an Observer on the engine sees each failed
// attempt's charge, under FailureLimited.API, and not the peek every
// request makes: 3 good keys and 1 bad one are 1 decision of authfail on
// "echo" (the adapter's own decisions are not made here), and the budget
// is the client's whatever the API (2 left after the charge on "echo",
// read on "other").
func TestFailureLimitedObserved(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	o := &observed{}
	eng, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{
		{ID: "basic", Rate: core.PerMinute(2)},
		{ID: "authfail", Rate: core.PerMinute(3)},
	}}, core.Options{Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := NewKeys([]KeyRecord{{Hash: HashKey("right"), Policies: []string{"basic"}}})
	if err != nil {
		t.Fatal(err)
	}
	fl := &FailureLimited{Auth: NewAPIKey(ks, APIKeyOptions{}), Limiter: eng, Policy: "authfail", API: "echo"}
	ctx := context.Background()
	for range 3 {
		if _, err := fl.Authenticate(ctx, newReq("198.51.100.7:5555").with("X-API-Key", "right")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fl.Authenticate(ctx, newReq("198.51.100.7:5555").with("X-API-Key", "wrong")); !errors.Is(err, ErrInvalidCredentials) {
		t.Fatalf("wrong key: %v", err)
	}
	if want := []string{"echo/authfail/true/<nil>"}; !slices.Equal(o.got, want) {
		t.Fatalf("observed %q, want %q", o.got, want)
	}
	other := &FailureLimited{Auth: fl.Auth, Limiter: eng, Policy: "authfail", API: "other"}
	if got := peekFail(t, eng, "198.51.100.7"); got != 2 {
		t.Fatalf("budget after one failure: %d left, want 2", got)
	}
	if _, err := other.Authenticate(ctx, newReq("198.51.100.7:5555").with("X-API-Key", "wrong")); !errors.Is(err, ErrInvalidCredentials) {
		t.Fatalf("wrong key on other: %v", err)
	}
	if got := peekFail(t, eng, "198.51.100.7"); got != 1 {
		t.Fatalf("budget after a failure on each API: %d left, want 1", got)
	}
	if len(o.got) != 2 || o.got[1] != "other/authfail/true/<nil>" {
		t.Fatalf("observed %q, want the second charge under other", o.got)
	}
}
