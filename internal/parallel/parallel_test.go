package parallel

import (
	"fmt"
	"sync"
	"testing"
)

// TestRangesCoverEachItemOnce: for any count and number of parts, the
// ranges are non-empty, start at multiples of MinPart, number at most the
// parts asked for, and cover [0, n) once; errors are joined in order.
func TestRangesCoverEachItemOnce(t *testing.T) {
	for _, parts := range []int{0, 1, 2, 3, 4, 7} {
		for _, n := range []int{0, 1, MinPart - 1, MinPart, MinPart + 1, 2*MinPart + 1, 3*MinPart + 5, 10000, 100003} {
			seen := make([]int32, n)
			var mu sync.Mutex
			calls := 0
			err := Ranges(n, parts, func(lo, hi int) error {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if lo%MinPart != 0 || lo > hi || lo == hi && n > 0 {
					return fmt.Errorf("range [%d, %d)", lo, hi)
				}
				for i := lo; i < hi; i++ {
					seen[i]++
				}
				return nil
			})
			if err != nil {
				t.Fatalf("n=%d parts=%d: %v", n, parts, err)
			}
			if calls > max(parts, 1) {
				t.Fatalf("n=%d parts=%d: %d calls", n, parts, calls)
			}
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("n=%d parts=%d: item %d seen %d times", n, parts, i, c)
				}
			}
		}
	}
	err := Ranges(3*MinPart, 3, func(lo, hi int) error { return fmt.Errorf("part %d", lo/MinPart) })
	if err == nil || err.Error() != "part 0\npart 1\npart 2" {
		t.Fatalf("errors: %v, want the parts' errors joined in order", err)
	}
}
