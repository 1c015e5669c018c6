package depcheck

import (
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// floors are the lowest versions go.mod may require: each fixes a known
// vulnerability in the version before it (issue 18, row 15).
var floors = map[string]string{
	"github.com/andybalholm/brotli": "v1.2.7",
	"github.com/quic-go/quic-go":    "v0.59.1",
}

// toolchainFloor is the lowest toolchain line go.mod may name: its
// standard library has the net/http, crypto/tls, crypto/x509, textproto and
// html/template fixes that Go 1.26.8 lacks.
const toolchainFloor = "go1.27.3"

// TestVersionFloors reads the main module's and the benchmarks module's
// go.mod (through `go mod edit -json`) and checks every floor.
func TestVersionFloors(t *testing.T) {
	for _, gomod := range []string{"../../go.mod", "../../benchmarks/go.mod"} {
		out, err := exec.Command("go", "mod", "edit", "-json", gomod).Output()
		if err != nil {
			t.Fatalf("go mod edit -json %s: %v", gomod, err)
		}
		var mod struct {
			Toolchain string
			Require   []struct{ Path, Version string }
		}
		if err := json.Unmarshal(out, &mod); err != nil {
			t.Fatalf("%s: %v", gomod, err)
		}
		if mod.Toolchain == "" || less(strings.TrimPrefix(mod.Toolchain, "go"), strings.TrimPrefix(toolchainFloor, "go")) {
			t.Errorf("%s: toolchain %q, want %s or later", gomod, mod.Toolchain, toolchainFloor)
		}
		seen := 0
		for _, r := range mod.Require {
			floor, ok := floors[r.Path]
			if !ok {
				continue
			}
			seen++
			if less(strings.TrimPrefix(r.Version, "v"), strings.TrimPrefix(floor, "v")) {
				t.Errorf("%s: %s %s, want %s or later", gomod, r.Path, r.Version, floor)
			}
		}
		if seen != len(floors) {
			t.Errorf("%s: %d of the %d pinned modules required; a module no longer required can leave the list", gomod, seen, len(floors))
		}
	}
}

// less reports whether dotted version a (1.2.3, no prerelease) is below b.
func less(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

func TestLess(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"1.1.0", "1.2.7", true}, {"1.2.8", "1.2.7", false}, {"1.2.7", "1.2.7", false},
		{"0.59.0", "0.59.1", true}, {"1.26.8", "1.27.3", true}, {"1.27", "1.27.3", true}, {"1.28", "1.27.3", false},
	} {
		if got := less(c.a, c.b); got != c.want {
			t.Errorf("less(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
