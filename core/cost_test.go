package core_test

import (
	"errors"
	"testing"

	"github.com/limitplane/limitplane/core"
)

func TestCostHeader(t *testing.T) {
	h := core.CostHeader{Name: "X-Cost", Max: 100}
	for _, tc := range []struct {
		values []string
		want   int64
		err    string
	}{
		{nil, 0, ""},
		{[]string{"1"}, 1, ""},
		{[]string{"3"}, 3, ""},
		{[]string{"100"}, 100, ""},
		{[]string{"101"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"0"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"-3"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"+3"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"03"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"2.5"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{" 3"}, 3, ""},    // a field value's surrounding white space is no part of it
		{[]string{"\t7\t"}, 7, ""}, // (fasthttp leaves tabs, net/http trims them)
		{[]string{" \t"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"3 3"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"abc"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{""}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"99999999999999999999"}, 0, "malformed X-Cost header: want a whole number from 1 to 100"},
		{[]string{"3", "3"}, 0, "malformed X-Cost header: given more than once"},
		{[]string{"3,3"}, 0, "malformed X-Cost header: given more than once"},
	} {
		n, err := h.Cost(tc.values)
		msg := ""
		if err != nil {
			msg = err.Error()
			if !errors.Is(err, core.ErrMalformedCost) {
				t.Errorf("%q: %v does not wrap ErrMalformedCost", tc.values, err)
			}
		}
		if n != tc.want || msg != tc.err {
			t.Errorf("%q: %d, %q; want %d, %q", tc.values, n, msg, tc.want, tc.err)
		}
	}
	// No bound: up to MaxCost.
	if n, err := (core.CostHeader{Name: "X-Cost"}).Cost([]string{"9007199254740991"}); n != core.MaxCost || err != nil {
		t.Errorf("MaxCost: %d, %v", n, err)
	}
	if _, err := (core.CostHeader{Name: "X-Cost"}).Cost([]string{"9007199254740992"}); err == nil {
		t.Error("MaxCost+1 taken")
	}
	if n, err := (core.CostHeader{}).Cost([]string{"x"}); n != 0 || err != nil {
		t.Errorf("no name: %d, %v", n, err)
	}
}
