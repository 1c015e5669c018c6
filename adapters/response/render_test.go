package response

import (
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TestAppendInt: appendInt writes what strconv.AppendInt does, at every
// power of ten and its neighbours, for negatives and the extremes, into a
// buffer with room and into one without.
func TestAppendInt(t *testing.T) {
	vs := []int64{0, 1, 9, 42, 99, -1, -100, math.MinInt64, math.MaxInt64, 1e18 - 1, 1e18, 3599123, 1<<53 - 1}
	for p := int64(1); p <= 1e18; p *= 10 {
		vs = append(vs, p-1, p, p+1)
	}
	for _, v := range vs {
		want := strconv.AppendInt([]byte("x="), v, 10)
		var roomy [64]byte
		if got := appendInt(append(roomy[:0], "x="...), v); string(got) != string(want) {
			t.Errorf("appendInt(%d) = %q, want %q", v, got, want)
		}
		if got := appendInt([]byte("x="), v); string(got) != string(want) {
			t.Errorf("appendInt(%d), no room = %q, want %q", v, got, want)
		}
	}
}

// TestRenderItemNames: a policy's name in RateLimit is written as in
// RateLimit-Policy (an sf-string, '"' and '\' escaped, bytes outside
// printable ASCII as '_', "limit" for no name), with Render and
// RenderDecision alike.
func TestRenderItemNames(t *testing.T) {
	d := core.Decision{Allowed: true, DecidedBy: core.KindRate, Limit: 5, Remaining: 4, ResetAfter: time.Second,
		Rate:  core.Status{Policy: "a\"b\\c\u00e9", Limit: 5, Remaining: 4, Window: time.Second, ResetAfter: time.Second},
		Quota: core.Status{Limit: 100, Remaining: 99, Window: 24 * time.Hour, ResetAfter: 24 * time.Hour}}
	want := []Header{
		{HeaderPolicy, `"a\"b\\c__";q=5;w=1, "limit/quota";q=100;w=86400`},
		{HeaderRateLimit, `"a\"b\\c__";r=4;t=1, "limit/quota";r=99;t=86400`},
	}
	rend := NewRenderer(Options{})
	var s Scratch
	for i := 0; i < 2; i++ { // the second time from the cache
		for _, got := range [][]Header{rend.Render(nil, d, nil).Headers, rend.RenderDecision(&s, &d, nil).Headers} {
			if !slices.Equal(got, want) {
				t.Errorf("got %q, want %q", got, want)
			}
		}
	}
}
