package procs

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A started process's output goes to its log; Stop ends it even while it
// is stopped (SIGSTOP), Kill ends it at once, and a Set stops all of its
// processes. A process that ended is left alone by Signal.
func TestStartStopKill(t *testing.T) {
	dir := t.TempDir()
	start := func(name string) *Proc {
		t.Helper()
		p, err := Start(name, exec.Command("sh", "-c", "echo hello from "+name+"; exec sleep 60"), filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(p.Tail(100), "hello from "+name) {
			if time.Now().After(deadline) {
				t.Fatalf("%s wrote %q, want its greeting", name, p.Tail(100))
			}
			time.Sleep(10 * time.Millisecond)
		}
		return p
	}

	stopped := start("stopped")
	stopped.Signal(syscall.SIGSTOP)
	stopped.Stop()
	if !stopped.Exited() {
		t.Fatal("Stop returned before a stopped process ended")
	}
	if got := stopped.Cmd.ProcessState.Sys().(syscall.WaitStatus).Signal(); got != syscall.SIGTERM {
		t.Fatalf("the stopped process ended by %v, want SIGTERM", got)
	}
	stopped.Signal(syscall.SIGTERM) // ended: nothing to signal, no panic

	killed := start("killed")
	killed.Kill()
	if got := killed.Cmd.ProcessState.Sys().(syscall.WaitStatus).Signal(); got != syscall.SIGKILL {
		t.Fatalf("Kill ended it by %v, want SIGKILL", got)
	}

	var s Set
	a, b := start("a"), start("b")
	s.Add(a)
	s.Add(b)
	if ps := s.Procs(); len(ps) != 2 || ps[0] != a || ps[1] != b {
		t.Fatalf("Procs() = %v, want [a b]", ps)
	}
	s.StopAll()
	if !a.Exited() || !b.Exited() || len(s.Procs()) != 0 {
		t.Fatalf("after StopAll: a exited %v, b exited %v, %d left; want both ended, none left", a.Exited(), b.Exited(), len(s.Procs()))
	}
}

func TestFreeAddr(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":6379") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("FreeAddr() = %q, want a loopback address with a port, never 6379", addr)
	}
}
