package memory_test

import (
	"testing"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T, clock core.Clock) core.Store {
			s := memory.New(memory.Options{Clock: clock})
			t.Cleanup(func() { s.Close() })
			return s
		},
	})
}
