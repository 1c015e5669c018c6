package failurelog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// textLog returns a logger writing slog's text lines without time to a
// buffer.
func textLog() (*slog.Logger, *syncBuffer) {
	out := new(syncBuffer)
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})), out
}

// TestFailureLog drives the store-failure log with manual timers: 100
// failures in one interval write the first at once and one line for the
// other 99 when the interval ends; an interval without failures ends the
// run, so the next failure is logged at once; Close writes what is
// pending and nothing is written after it.
func TestFailureLog(t *testing.T) {
	log, out := textLog()
	timers := &ManualTimers{}
	f := New(log, Options{Msg: "limit store failed", Interval: 5 * time.Second, AfterFunc: timers.After})
	for i := range 100 {
		f.Failed(fmt.Errorf("dial: refused %d", i))
	}
	want := `level=WARN msg="limit store failed" err="dial: refused 0" failures=1 total=1` + "\n"
	if out.String() != want {
		t.Fatalf("after 100 failures:\n%s\nwant\n%s", out, want)
	}
	if n := timers.Fire(); n != 1 || timers.Delays()[0] != 5*time.Second {
		t.Fatalf("%d timers fired, delays %v; want 1 of 5s", n, timers.Delays())
	}
	want += `level=WARN msg="limit store failed" err="dial: refused 99" failures=99 total=100` + "\n"
	if out.String() != want {
		t.Fatalf("at the interval's end:\n%s\nwant\n%s", out, want)
	}
	// A quiet interval: no line, and the next failure is logged at once.
	if n := timers.Fire(); n != 1 || out.String() != want {
		t.Fatalf("quiet interval: %d timers fired, output:\n%s", n, out)
	}
	if n := timers.Fire(); n != 0 {
		t.Fatalf("%d timers after a quiet interval, want none", n)
	}
	f.Failed(errors.New("timeout"))
	f.Failed(errors.New("breaker open"))
	f.Failed(errors.New("breaker open"))
	want += `level=WARN msg="limit store failed" err=timeout failures=1 total=101` + "\n"
	if out.String() != want {
		t.Fatalf("after a quiet interval:\n%s\nwant\n%s", out, want)
	}
	f.Close()
	want += `level=WARN msg="limit store failed" err="breaker open" failures=2 total=103` + "\n"
	if out.String() != want {
		t.Fatalf("after Close:\n%s\nwant\n%s", out, want)
	}
	f.Failed(errors.New("late"))
	if n := timers.Fire(); n != 0 || out.String() != want || f.Total() != 104 {
		t.Fatalf("after Close: %d timers fired, total %d, output:\n%s", n, f.Total(), out)
	}
}

// TestFailureLogRecovered: Recovered writes the failures counted since the
// last line at once and ends the run: its interval's timer writes
// nothing later (a summary of an outage that is over would read as a new
// one), and the next failure is logged at once. Without a run it does
// nothing.
func TestFailureLogRecovered(t *testing.T) {
	log, out := textLog()
	timers := &ManualTimers{}
	f := New(log, Options{Msg: "no answer", Interval: 30 * time.Second, AfterFunc: timers.After})
	f.Recovered()
	if out.String() != "" {
		t.Fatalf("Recovered without failures wrote:\n%s", out)
	}
	for i := range 18 {
		f.Failed(fmt.Errorf("refused %d", i))
	}
	f.Recovered()
	want := `level=WARN msg="no answer" err="refused 0" failures=1 total=1` + "\n" +
		`level=WARN msg="no answer" err="refused 17" failures=17 total=18` + "\n"
	if out.String() != want {
		t.Fatalf("after Recovered:\n%s\nwant\n%s", out, want)
	}
	if n := timers.Fire(); n != 0 || out.String() != want {
		t.Fatalf("after Recovered: %d timers fired, output:\n%s", n, out)
	}
	f.Failed(errors.New("refused again"))
	want += `level=WARN msg="no answer" err="refused again" failures=1 total=19` + "\n"
	if out.String() != want {
		t.Fatalf("a failure after Recovered:\n%s\nwant\n%s", out, want)
	}
	// A tick of the ended run that had already started (its stop came
	// too late) does nothing either.
	f.Recovered()
	f.Failed(errors.New("refused once more"))
	f.tick(f.run - 1)
	want += `level=WARN msg="no answer" err="refused once more" failures=1 total=20` + "\n"
	if out.String() != want || !f.inInterval {
		t.Fatalf("a stale tick:\n%s\nwant\n%s (and the new run's interval open)", out, want)
	}
	f.Close()
}
