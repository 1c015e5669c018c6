package drlharness

import (
	"io"
	"net"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// One admission every 10 ms for 3 s (sent at k×10 ms, answered 1 ms
// later), plus 50 admissions in a burst at 1.5 s, a refused request, and
// one admitted request that took 2 s.
func TestWindows(t *testing.T) {
	var recs []record
	for k := int64(0); k < 300; k++ {
		recs = append(recs, record{sent: k * 10 * ms, recv: k*10*ms + ms, status: 200})
	}
	for range 50 {
		recs = append(recs, record{sent: 1500 * ms, recv: 1500*ms + 2*ms, status: 200})
	}
	recs = append(recs, record{sent: 10 * ms, recv: 11 * ms, status: 429})
	recs = append(recs, record{sent: 500 * ms, recv: 2500 * ms, status: 200})
	a := newAdmissions(recs, time.Second)

	// [0, 1 s): the 100 regular ones; the slow one is not certainly in.
	if n := a.within(0, 1000*ms); n != 100 {
		t.Errorf("within [0,1s) = %d, want 100", n)
	}
	// [995 ms, 1995 ms): regular ones sent 1000..1980 (99, the one sent
	// at 1990 is answered at 1991 < 1995: 100), plus the burst.
	if n := a.within(995*ms, 1995*ms); n != 150 {
		t.Errorf("within [995ms,1995ms) = %d, want 150", n)
	}
	// [400 ms, 2600 ms) holds the slow one too.
	if n := a.within(400*ms, 2600*ms); n != 220+50+1 {
		t.Errorf("within [400ms,2600ms) = %d, want 271", n)
	}
	best, at := a.worstWindow(time.Second, 3*time.Second)
	if best != 150 || at != 510*time.Millisecond {
		t.Errorf("worstWindow = %d at %v, want 150 at 510ms (the first window holding the burst and 100 regular ones)", best, at)
	}
}

// reachedFrom finds when a rate of 100/s starts.
func TestReachedFrom(t *testing.T) {
	var recs []record
	// 20/s until 2 s, then 100/s until 5 s.
	for s := int64(0); s < 2000*ms; s += 50 * ms {
		recs = append(recs, record{sent: s, recv: s, status: 200})
	}
	for s := 2000 * ms; s < 5000*ms; s += 10 * ms {
		recs = append(recs, record{sent: s, recv: s, status: 200})
	}
	a := newAdmissions(recs, time.Second)
	// 95 in a second: [1.94 s, 2.94 s) holds the one sent at 1.95 s and
	// 2.00 … 2.93 s (94); [1.93 s, 2.93 s) only 1 + 93.
	if d := a.reachedFrom(time.Second, 5*time.Second, time.Second, 100, 0.95); d != 940*time.Millisecond {
		t.Errorf("reachedFrom(1s) = %v, want 940ms (the window starting at 1.94 s)", d)
	}
	if d := a.reachedFrom(0, 5*time.Second, time.Second, 100, 1.01); d != -1 {
		t.Errorf("reachedFrom(101 %%) = %v, want -1 (never)", d)
	}
}

// The plan splits the offered load over the live slots by weight, gives
// a dead slot's share to the others, and integrates min(R, offered).
func TestPlan(t *testing.T) {
	slots := []*slot{{i: 0}, {i: 1}, {i: 2}}
	p := newPlan(slots, 900, []float64{2, 1, 0})
	p.update(func(p *plan) { p.live = []bool{true, true, true} })
	if r := []float64{slots[0].getRate(), slots[1].getRate(), slots[2].getRate()}; r[0] != 600 || r[1] != 300 || r[2] != 0 {
		t.Errorf("rates %v, want [600 300 0]", r)
	}
	p.history[0].at = 0
	p.update(func(p *plan) { p.live[0], p.live[1] = false, false; p.total = 1200 })
	p.history[1].at = 2 * time.Second
	if r := slots[2].getRate(); r != 1200 {
		t.Errorf("the last live slot (weight 0) gets %v, want all 1200", r)
	}
	// 2 s at min(1000, 900) + 2 s at min(1000, 1200).
	if got := p.possible(1000, 0, 4*time.Second); got != 3800 {
		t.Errorf("possible = %v, want 3800", got)
	}
}

// The link proxy shifts what Redis sends by its delay (without adding up)
// and holds everything while stalled.
func TestLinkProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an echo server standing in for Redis
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go io.Copy(c, c)
		}
	}()
	p, err := newLinkProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func() time.Duration {
		start := time.Now()
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := roundTrip(); d > 100*time.Millisecond {
		t.Errorf("round trip %v without delay", d)
	}
	p.SetDelay(200 * time.Millisecond)
	// Three writes 50 ms apart come back 200 ms after each was sent.
	start := time.Now()
	for range 3 {
		c.Write([]byte("y"))
		time.Sleep(50 * time.Millisecond)
	}
	for i := range 3 {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		got, want := time.Since(start), time.Duration(i)*50*time.Millisecond+200*time.Millisecond
		if got < want || got > want+80*time.Millisecond {
			t.Errorf("reply %d after %v, want %v (+80ms)", i, got, want)
		}
	}
	p.SetDelay(0)
	p.Stall()
	c.Write([]byte("z"))
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("read %d bytes (err %v) through a stalled link", n, err)
	}
	p.Release()
	if d := roundTrip(); d > time.Second {
		t.Errorf("round trip %v after release", d)
	}
}
