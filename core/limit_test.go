package core

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLimitValidate(t *testing.T) {
	cases := []struct {
		l    Limit
		want string // "" = valid
	}{
		{Limit{}, ""},
		{Limit{Rate: Unlimited}, ""},
		{PerSecond(5), ""},
		{Limit{Rate: 5, Period: time.Second, Burst: 1}, ""},
		{Limit{Rate: 0, Period: time.Second, Burst: 1}, "rate 0 must be > 0"},
		{Limit{Rate: -2, Period: time.Second}, "rate -2 must be > 0"},
		{Limit{Rate: 1, Period: 0, Burst: 1}, "period 0s must be > 0"},
		{Limit{Rate: 1, Period: -time.Second}, "period -1s must be > 0"},
		{Limit{Rate: 1, Period: time.Second, Burst: -1}, "burst -1 must be > 0"},
		{Limit{Rate: 3, Period: 2}, "finer than one event per nanosecond"},
		{Limit{Rate: 1, Period: 1 << 62, Burst: 1}, "overflows"},
		{Limit{Rate: 1, Period: time.Hour, Burst: 1 << 40}, "overflows"},
		{Limit{Rate: 1, Period: time.Second, Algorithm: 9}, "unknown algorithm 9"},
		// Counts are bounded by MaxCount = 2^53 − 1 (issue 9): the largest
		// ones are valid, one more is not, in every algorithm.
		{Limit{Rate: MaxCount, Period: 1 << 60}, ""},
		{Limit{Rate: 1, Period: 1, Burst: MaxCount}, ""},
		{Limit{Rate: MaxCount + 1, Period: 1 << 60}, "rate 9007199254740992 is above 9007199254740991 (2^53 − 1)"},
		{Limit{Rate: MaxCount + 1, Period: 1 << 60, Algorithm: FixedWindow}, "rate 9007199254740992 is above 9007199254740991 (2^53 − 1)"},
		{Limit{Rate: MaxCount + 1, Period: 1 << 60, Algorithm: SlidingLog}, "rate 9007199254740992 is above"},
		{Limit{Rate: 1, Period: 1, Burst: MaxCount + 1}, "burst 9007199254740992 is above 9007199254740991 (2^53 − 1)"},
	}
	for _, c := range cases {
		err := c.l.Validate()
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: unexpected error %v", c.l, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%+v: error %v, want ErrInvalidLimit containing %q", c.l, err, c.want)
		}
		if _, err2 := c.l.CheckedGCRA(); err2 == nil {
			t.Errorf("%+v: CheckedGCRA accepted an invalid limit", c.l)
		}
	}
}

func TestQuotaValidate(t *testing.T) {
	for _, q := range []Quota{{}, {Max: Unlimited}, {Max: 1, Renewal: time.Hour}, {Max: MaxCount, Renewal: time.Hour}} {
		if err := q.Validate(); err != nil {
			t.Errorf("%+v: %v", q, err)
		}
	}
	for _, q := range []Quota{{Max: 0, Renewal: time.Hour}, {Max: -3, Renewal: time.Hour}, {Max: 5}, {Max: 5, Renewal: -1}, {Max: 5, Renewal: 1 << 62}} {
		if err := q.Validate(); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%+v: error %v, want ErrInvalidLimit", q, err)
		}
	}
	q := Quota{Max: MaxCount + 1, Renewal: time.Hour}
	const want = "invalid limit: quota max 9007199254740992 is above 9007199254740991 (2^53 − 1), the largest count every store keeps exactly"
	if err := q.Validate(); !errors.Is(err, ErrInvalidLimit) || err.Error() != want {
		t.Errorf("%+v: error %v, want %q", q, err, want)
	}
}

func TestCheckedGCRAEqualsGCRA(t *testing.T) {
	for _, l := range []Limit{PerSecond(7), {Rate: 100, Period: 10 * time.Second, Burst: 3}, {Rate: 1, Period: time.Hour}} {
		p, err := l.CheckedGCRA()
		if err != nil || p != l.GCRA() {
			t.Errorf("%+v: CheckedGCRA = %+v, %v; GCRA = %+v", l, p, err, l.GCRA())
		}
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range []Algorithm{GCRA, SlidingWindow, FixedWindow, SlidingLog} {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("round trip of %v: %v, %v", a, got, err)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil {
		t.Error("ParseAlgorithm(leaky) accepted")
	}
}
