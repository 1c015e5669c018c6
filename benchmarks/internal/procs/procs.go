// Package procs starts, watches and stops the child processes of the
// benchmark commands (gateways, redis-server), so that each command stops
// every process it started on every path out: each child runs in its own
// process group (a terminal's Ctrl-C reaches only the command, which then
// stops it) and gets SIGKILL if the command dies.
package procs

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one child process started by Start.
type Proc struct {
	// Name names the process in errors and logs.
	Name string
	// Cmd is the started command; Cmd.Process.Pid is its PID.
	Cmd *exec.Cmd
	// Log is the file holding its stdout and stderr.
	Log  string
	done chan struct{} // closed once the process has been waited for
}

// Start starts cmd, named name, with its stdout and stderr in the file
// logPath, in a process group of its own and with SIGKILL as its parent-
// death signal.
func Start(name string, cmd *exec.Cmd, logPath string) (*Proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("procs: %s: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("procs: start %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, done: make(chan struct{}), Log: logPath}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process's group, unless it has ended.
func (p *Proc) Signal(sig syscall.Signal) {
	if !p.Exited() {
		syscall.Kill(-p.Cmd.Process.Pid, sig)
	}
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop asks the process to end (SIGCONT first, in case it was stopped,
// then SIGTERM), waits for it and kills it after 5 s. Safe to call more
// than once.
func (p *Proc) Stop() {
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.Kill()
	}
}

// Tail returns the last n bytes of the process's log, for error messages.
func (p *Proc) Tail(n int) string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Set holds every process of a run so that all of them are stopped,
// whatever path the run ends by. The zero Set is empty and ready.
type Set struct {
	mu    sync.Mutex
	procs []*Proc
}

// Add puts p in the set.
func (s *Set) Add(p *Proc) {
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
}

// Procs returns the processes in the set, in the order added.
func (s *Set) Procs() []*Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Proc(nil), s.procs...)
}

// StopAll stops every process in the set, in parallel, and empties it.
func (s *Set) StopAll() {
	s.mu.Lock()
	ps := s.procs
	s.procs = nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop() }()
	}
	wg.Wait()
}

// FreeAddr returns a loopback address ("127.0.0.1:port") whose port was
// free a moment ago. Never 6379: that is a Redis the command did not start.
func FreeAddr() (string, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("procs: find a free port: %w", err)
		}
		addr := l.Addr().String()
		l.Close()
		if !strings.HasSuffix(addr, ":6379") {
			return addr, nil
		}
	}
}

// BuildGateway builds cmd/limitplane-gateway of the main module (found with
// `go list -m`, so through the benchmarks module's replace directive) into
// dir and returns the binary's path.
func BuildGateway(ctx context.Context, dir string, tags ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/limitplane/limitplane").Output()
	if err != nil {
		return "", fmt.Errorf("procs: find the limitplane module (run from the benchmarks module): %w", err)
	}
	root := strings.TrimSpace(string(out))
	bin := filepath.Join(dir, "gateway")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		bin += "-" + strings.Join(tags, "-")
		args = []string{"build", "-tags", strings.Join(tags, ","), "-o", bin}
	}
	build := exec.CommandContext(ctx, "go", append(args, "./cmd/limitplane-gateway")...)
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("procs: build cmd/limitplane-gateway: %w\n%s", err, b)
	}
	return bin, nil
}
