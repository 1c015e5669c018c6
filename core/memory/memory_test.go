package memory_test

import (
	"testing"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/storetest"
)

// request prepares c's limits on s and returns c as a Request under that
// rule (core.Call's fields are Request's and LimitSet's).
func request(tb testing.TB, s core.Store, c core.Call) core.Request {
	tb.Helper()
	r, err := s.Prepare(c.Limits())
	if err != nil {
		tb.Fatalf("Prepare(%+v): %v", c.Limits(), err)
	}
	return c.Request(r)
}

// prepare returns ls's rule on s.
func prepare(tb testing.TB, s core.Store, ls core.LimitSet) *core.Rule {
	tb.Helper()
	r, err := s.Prepare(ls)
	if err != nil {
		tb.Fatalf("Prepare(%+v): %v", ls, err)
	}
	return r
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T, clock core.Clock) core.Store {
			s := memory.New(memory.Options{Clock: clock})
			t.Cleanup(func() { s.Close() })
			return s
		},
	})
}
