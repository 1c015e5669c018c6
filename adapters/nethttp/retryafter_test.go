package nethttp

import (
	"testing"
	"time"
)

// TestParseRetryAfter: delay-seconds of any length (capped at a year, as
// a number too long for int64 is), HTTP-dates before and after now, and
// what RFC 9110 does not allow.
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2015, 10, 21, 7, 28, 0, 0, time.UTC)
	year := 365 * 24 * time.Hour
	for _, tc := range []struct {
		v  string
		d  time.Duration
		ok bool
	}{
		{"0", 0, true},
		{"5", 5 * time.Second, true},
		{"007", 7 * time.Second, true},
		{"31536000", year, true},
		{"31536001", year, true},
		{"9223372036", year, true},
		{"9223372036854775807", year, true},
		{"9223372036854775808", year, true},
		{"99999999999999999999", year, true},
		{"Wed, 21 Oct 2015 07:28:30 GMT", 30 * time.Second, true},
		{"Wed, 21 Oct 2015 07:27:00 GMT", 0, true},
		{"Fri, 31 Dec 9999 23:59:59 GMT", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Sub(now), true},
		{"", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{"5.5", 0, false},
		{" 5", 0, false},
		{"5s", 0, false},
		{"soon", 0, false},
	} {
		d, ok := parseRetryAfter(tc.v, now)
		if d != tc.d || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.v, d, ok, tc.d, tc.ok)
		}
	}
}
