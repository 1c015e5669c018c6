package response

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

func rate(rem int64, reset time.Duration) core.Status {
	return core.Status{Limit: 5, Remaining: rem, ResetAfter: reset, Window: time.Second, Policy: "default"}
}

func quota(rem int64, reset time.Duration) core.Status {
	return core.Status{Limit: 100, Remaining: rem, ResetAfter: reset, Window: 24 * time.Hour, Policy: "default"}
}

func TestRender(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := NewRenderer(Options{XRateLimit: true, Now: func() time.Time { return now }})
	cases := []struct {
		name    string
		d       core.Decision
		pass    bool
		status  int
		body    string
		headers []Header
	}{
		{
			name: "allowed",
			d:    core.Decision{Allowed: true, DecidedBy: core.KindRate, Limit: 5, Remaining: 4, ResetAfter: 200 * time.Millisecond, Rate: rate(4, 200*time.Millisecond), Quota: quota(99, 24*time.Hour)},
			pass: true,
			headers: []Header{
				{HeaderPolicy, `"default";q=5;w=1, "default/quota";q=100;w=86400`},
				{HeaderRateLimit, `"default";r=4;t=1, "default/quota";r=99;t=86400`},
				{HeaderXLimit, "5"}, {HeaderXRemaining, "4"}, {HeaderXReset, "1800000001"},
			},
		},
		{
			name:   "rate denied",
			d:      core.Decision{DecidedBy: core.KindRate, Limit: 5, ResetAfter: time.Second, RetryAfter: 1200 * time.Millisecond, Rate: rate(0, time.Second), Quota: quota(10, time.Hour)},
			status: 429,
			body:   `{"error":"rate limit exceeded","retry_after_ms":1200}` + "\n",
			headers: []Header{
				{HeaderPolicy, `"default";q=5;w=1, "default/quota";q=100;w=86400`},
				{HeaderRateLimit, `"default";r=0;t=2, "default/quota";r=10;t=3600`},
				{HeaderXLimit, "5"}, {HeaderXRemaining, "0"}, {HeaderXReset, "1800000002"},
				{HeaderRetryAfter, "2"},
			},
		},
		{
			name:   "quota denied",
			d:      core.Decision{DecidedBy: core.KindQuota, Limit: 100, ResetAfter: 90 * time.Second, RetryAfter: 90 * time.Second, Quota: quota(0, 90*time.Second)},
			status: 429,
			body:   `{"error":"quota exceeded","retry_after_ms":90000}` + "\n",
			headers: []Header{
				{HeaderPolicy, `"default/quota";q=100;w=86400`},
				{HeaderRateLimit, `"default/quota";r=0;t=90`},
				{HeaderXLimit, "100"}, {HeaderXRemaining, "0"}, {HeaderXReset, "1800000090"},
				{HeaderRetryAfter, "90"},
			},
		},
		{
			name:   "cost exceeds quota",
			d:      core.Decision{DecidedBy: core.KindQuota, Limit: 100, Remaining: 100, ResetAfter: 90 * time.Second, RetryAfter: -1, Quota: quota(100, 90*time.Second)},
			status: 429,
			body:   `{"error":"request cost exceeds the quota and can never be allowed"}` + "\n",
			headers: []Header{
				{HeaderPolicy, `"default/quota";q=100;w=86400`},
				{HeaderRateLimit, `"default/quota";r=100;t=90`},
				{HeaderXLimit, "100"}, {HeaderXRemaining, "100"}, {HeaderXReset, "1800000090"},
			},
		},
		{
			name:   "cost exceeds burst",
			d:      core.Decision{DecidedBy: core.KindRate, Limit: 5, Remaining: 5, RetryAfter: -1, Rate: rate(5, 0)},
			status: 429,
			body:   `{"error":"request cost exceeds the burst and can never be allowed"}` + "\n",
			headers: []Header{
				{HeaderPolicy, `"default";q=5;w=1`},
				{HeaderRateLimit, `"default";r=5;t=0`},
				{HeaderXLimit, "5"}, {HeaderXRemaining, "5"}, {HeaderXReset, "1800000000"},
			},
		},
		{
			name: "no limit configured",
			d:    core.Decision{Allowed: true, DecidedBy: core.KindRate},
			pass: true,
			headers: []Header{
				{HeaderPolicy, ""}, {HeaderRateLimit, ""},
				{HeaderXLimit, "0"}, {HeaderXRemaining, "0"}, {HeaderXReset, "1800000000"},
			},
		},
		{name: "fail open", d: core.Decision{Allowed: true}, pass: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := r.Render(nil, c.d, nil)
			if res.Pass != c.pass || res.Status != c.status || string(res.Body) != c.body {
				t.Fatalf("got pass=%v status=%d body=%q", res.Pass, res.Status, res.Body)
			}
			if (c.pass && res.Message != "") || (!c.pass && !strings.Contains(c.body, `{"error":"`+res.Message+`"`)) {
				t.Fatalf("message %q does not match body %q", res.Message, c.body)
			}
			if fmt.Sprint(res.Headers) != fmt.Sprint(c.headers) {
				t.Fatalf("headers\n got %v\nwant %v", res.Headers, c.headers)
			}
		})
	}
}

func TestRenderOptions(t *testing.T) {
	d := core.Decision{DecidedBy: core.KindQuota, Limit: 100, ResetAfter: 90 * time.Second, RetryAfter: 90 * time.Second, Quota: quota(0, 90*time.Second)}
	r := NewRenderer(Options{XRateLimit: true, XRateLimitReset: ResetSeconds, NoRateLimitFields: true, QuotaExceededStatus: 403})
	res := r.Render(nil, d, nil)
	want := []Header{{HeaderXLimit, "100"}, {HeaderXRemaining, "0"}, {HeaderXReset, "90"}, {HeaderRetryAfter, "90"}}
	if res.Status != 403 || fmt.Sprint(res.Headers) != fmt.Sprint(want) {
		t.Fatalf("status %d headers %v", res.Status, res.Headers)
	}
	// A hostile policy name cannot break the structured field.
	d = core.Decision{Allowed: true, DecidedBy: core.KindRate, Rate: core.Status{Limit: 1, Remaining: 1, Window: 500 * time.Millisecond, Policy: "a\"b\\c\nd"}}
	res = NewRenderer(Options{}).Render(nil, d, nil)
	if got := res.Headers[0].Value; got != `"a\"b\\c_d";q=1;w=1` {
		t.Fatalf("policy field %s", got)
	}
}

func TestRenderErrors(t *testing.T) {
	r := NewRenderer(Options{StoreFailureStatus: 429}) // 429 is refused for failures
	cases := []struct {
		err    error
		status int
		body   string
	}{
		{&identity.Error{Status: 401, Kind: identity.ErrMissingCredentials, Reason: "no API key"}, 401, `{"error":"no API key"}`},
		{fmt.Errorf("wrapped: %w", &identity.Error{Status: 403, Kind: identity.ErrInvalidCredentials, Reason: `bad "key"`}), 403, `{"error":"bad \"key\""}`},
		{core.ErrNoPolicy, 403, `{"error":"access to this API is not allowed"}`},
		{fmt.Errorf("%w: %w", core.ErrStoreUnavailable, errors.New("dial tcp: refused")), 503, `{"error":"rate limit store unavailable"}`},
		{core.ErrInvalidCost, 400, `{"error":"invalid request cost"}`},
		{fmt.Errorf("%w (the store's error: %w)", context.Canceled, errors.New("i/o timeout")), 499, `{"error":"client closed request"}`},
		{errors.New("boom"), 500, `{"error":"internal error"}`},
	}
	for _, c := range cases {
		res := r.Render(nil, core.Decision{}, c.err)
		if res.Pass || res.Status != c.status || string(res.Body) != c.body+"\n" || len(res.Headers) != 0 {
			t.Errorf("%v: got %+v body %s", c.err, res, res.Body)
		}
		if string(errorBody(nil, res.Message, -1)) != string(res.Body) {
			t.Errorf("%v: message %q does not match body %s", c.err, res.Message, res.Body)
		}
	}
}

// Long policy names overflow the stack buffers, and the policy cache keeps
// every policy's own value, whichever shared its slot last — also under
// concurrent rendering.
func TestRenderPolicyCache(t *testing.T) {
	r := NewRenderer(Options{})
	want := func(i int) (core.Decision, string, string) {
		name := fmt.Sprintf("policy-%03d-%s", i, strings.Repeat("x", i%90))
		d := core.Decision{Allowed: true, DecidedBy: core.KindRate,
			Rate:  core.Status{Limit: int64(i + 1), Remaining: int64(i), ResetAfter: time.Second, Window: time.Duration(i+1) * time.Second, Policy: name},
			Quota: core.Status{Limit: 1000, Remaining: 999, ResetAfter: time.Hour, Window: time.Hour, Policy: name}}
		pol := fmt.Sprintf(`"%s";q=%d;w=%d, "%s/quota";q=1000;w=3600`, name, i+1, i+1, name)
		cur := fmt.Sprintf(`"%s";r=%d;t=1, "%s/quota";r=999;t=3600`, name, i, name)
		return d, pol, cur
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 3; round++ {
				for i := 0; i < 200; i++ {
					d, pol, cur := want((i + g*25) % 200)
					res := r.Render(nil, d, nil)
					if res.Headers[0].Value != pol || res.Headers[1].Value != cur {
						t.Errorf("policy %d:\n got %s | %s\nwant %s | %s", i, res.Headers[0].Value, res.Headers[1].Value, pol, cur)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// RenderScratch renders every answer as Render does, byte for byte:
// allowed and denied (rate, quota, a cost over the burst, a failed-auth
// limit), errors, the X-RateLimit fields, and names too long for the
// scratch buffers; and a Scratch rendered into again gives the new answer.
// RenderMessage gives the same answers without their bodies.
func TestRenderScratchSameAsRender(t *testing.T) {
	long := strings.Repeat("p", 150)
	rate := core.Status{Policy: "basic", Limit: 5, Remaining: 3, ResetAfter: 1500 * time.Millisecond, Window: time.Second}
	quota := core.Status{Policy: "basic", Limit: 100, Remaining: 0, ResetAfter: time.Hour, Window: 24 * time.Hour}
	decisions := []core.Decision{
		{},
		{Allowed: true, DecidedBy: core.KindRate, Limit: 5, Remaining: 3, ResetAfter: 1500 * time.Millisecond, Rate: rate},
		{Allowed: true, DecidedBy: core.KindQuota, Limit: 100, Remaining: 0, ResetAfter: time.Hour, Rate: rate, Quota: quota},
		{DecidedBy: core.KindRate, Limit: 5, ResetAfter: 2 * time.Second, RetryAfter: 1200 * time.Millisecond, Rate: rate},
		{DecidedBy: core.KindQuota, Limit: 100, ResetAfter: time.Hour, RetryAfter: 5000 * time.Second, Rate: rate, Quota: quota},
		{DecidedBy: core.KindRate, Limit: 5, RetryAfter: -1, Rate: rate},
		{Allowed: true, DecidedBy: core.KindRate, Limit: 5, Remaining: 3, Rate: core.Status{Policy: long, Limit: 5, Remaining: 3, Window: time.Second},
			Quota: core.Status{Policy: long, Limit: 7, Remaining: 6, Window: time.Hour}},
	}
	errs := []error{
		nil,
		&identity.Error{Status: 401, Kind: identity.ErrMissingCredentials, Reason: "no API key"},
		&identity.Error{Status: 403, Kind: identity.ErrInvalidCredentials, Reason: strings.Repeat("r", 200)},
		core.ErrNoPolicy,
		core.ErrStoreUnavailable,
		&identity.LimitError{Decision: core.Decision{DecidedBy: core.KindRate, Limit: 5, RetryAfter: 3 * time.Second, Rate: rate}},
	}
	now := func() time.Time { return time.Unix(1_700_000_000, 0) }
	var s Scratch
	for _, o := range []Options{{}, {XRateLimit: true, Now: now}, {XRateLimit: true, XRateLimitReset: ResetSeconds, NoRateLimitFields: true}, {QuotaExceededStatus: 403}} {
		r := NewRenderer(o)
		for _, d := range decisions {
			for _, err := range errs {
				want := r.Render(nil, d, err)
				got := r.RenderScratch(&s, d, err)
				if got.Pass != want.Pass || got.Status != want.Status || got.Message != want.Message ||
					string(got.Body) != string(want.Body) || fmt.Sprint(got.Headers) != fmt.Sprint(want.Headers) {
					t.Errorf("options %+v, decision %+v, error %v:\n got %+v %s\nwant %+v %s", o, d, err, got, got.Body, want, want.Body)
				}
				// RenderMessage: the same answer without its body.
				got = r.RenderMessage(&s, d, err)
				if got.Pass != want.Pass || got.Status != want.Status || got.Message != want.Message ||
					got.Body != nil || fmt.Sprint(got.Headers) != fmt.Sprint(want.Headers) {
					t.Errorf("RenderMessage: options %+v, decision %+v, error %v:\n got %+v %s\nwant %+v and no body", o, d, err, got, got.Body, want)
				}
			}
		}
	}
}

// RenderScratch allocates nothing for an admitted or a denied answer that
// fits, once the policy's RateLimit-Policy value is cached.
func TestRenderScratchAllocations(t *testing.T) {
	r := NewRenderer(Options{XRateLimit: true})
	rate := core.Status{Policy: "basic", Limit: 5, Remaining: 3, ResetAfter: time.Second, Window: time.Second}
	allowed := core.Decision{Allowed: true, DecidedBy: core.KindRate, Limit: 5, Remaining: 3, ResetAfter: time.Second, Rate: rate}
	denied := core.Decision{DecidedBy: core.KindRate, Limit: 5, ResetAfter: time.Second, RetryAfter: time.Second, Rate: rate}
	s := new(Scratch)
	for _, d := range []core.Decision{allowed, denied} {
		r.RenderScratch(s, d, nil)
		if n := testing.AllocsPerRun(100, func() { r.RenderScratch(s, d, nil) }); n != 0 {
			t.Errorf("allowed %v: %v allocations, want 0", d.Allowed, n)
		}
	}
}

// TestConstBodies: each denial body written from its constant is
// errorBody's, byte for byte, with and without retry_after_ms.
func TestConstBodies(t *testing.T) {
	for open, msg := range map[string]string{
		bodyRateLimited:       "rate limit exceeded",
		bodyQuotaExceeded:     "quota exceeded",
		bodyNeverAllowed:      "request cost exceeds the burst and can never be allowed",
		bodyQuotaNeverAllowed: "request cost exceeds the quota and can never be allowed",
		bodyInFlight:          "too many concurrent requests",
	} {
		for _, ms := range []int64{-1, 0, 3_600_000} {
			var s Scratch
			want := string(errorBody(nil, msg, ms))
			if got := string(constBody(nil, open, ms)); got != want {
				t.Errorf("constBody(nil, %q, %d) = %q, want %q", open, ms, got, want)
			}
			if got := string(constBody(&s, open, ms)); got != want {
				t.Errorf("constBody(scratch, %q, %d) = %q, want %q", open, ms, got, want)
			}
		}
	}
	got := string(NewRenderer(Options{}).Render(nil, core.Decision{DecidedBy: core.KindInFlight}, nil).Body)
	if want := `{"error":"too many concurrent requests"}` + "\n"; got != want {
		t.Errorf("in-flight denial body %q, want %q", got, want)
	}
}

// TestCanonical: every Result a Renderer returns says its fields may be
// set as they are, and they may: canonical names (as net/http writes
// them), no CR or LF in a value, even from a policy ID that holds them.
func TestCanonical(t *testing.T) {
	r := NewRenderer(Options{XRateLimit: true})
	st := core.Status{Policy: "a\r\nX-Evil: 1", Limit: 5, ResetAfter: time.Second, Window: time.Second}
	for _, d := range []core.Decision{
		{Allowed: true, DecidedBy: core.KindRate, Limit: 5, Rate: st},
		{DecidedBy: core.KindRate, Limit: 5, RetryAfter: time.Second, Rate: st},
		{DecidedBy: core.KindInFlight},
	} {
		for _, err := range []error{nil, core.ErrStoreUnavailable} {
			var s Scratch
			for _, res := range []Result{r.Render(nil, d, err), r.RenderScratch(&s, d, err)} {
				if !res.Canonical {
					t.Errorf("decision %+v, error %v: Canonical false", d, err)
				}
				bh := BodyHeaders()
				for _, h := range append(res.Headers, bh[:]...) {
					if h.Name != http.CanonicalHeaderKey(h.Name) || strings.ContainsAny(h.Value, "\r\n") {
						t.Errorf("decision %+v, error %v: field %q: %q", d, err, h.Name, h.Value)
					}
				}
			}
		}
	}
}
