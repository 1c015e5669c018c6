package drlharness

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// linkProxy is one gateway's TCP link to Redis, through which the harness
// can slow or stall that gateway's view of Redis: every byte Redis sends
// the gateway can be held for a delay (a slow link: the gateway's calls
// still land at once, its answers and pub/sub messages arrive late), and
// the whole link can be stalled (nothing passes either way until it is
// released). Data in flight is held one read buffer per direction and
// connection; TCP's flow control holds the rest.
type linkProxy struct {
	ln     net.Listener
	target string
	// delay is the hold on Redis-to-gateway bytes, in nanoseconds;
	// patterns, when set, limit it to the chunks holding one of them.
	delay    atomic.Int64
	patterns atomic.Pointer[[][]byte]
	mu       sync.Mutex
	// stalled is closed when the link is released; nil when running.
	stalled chan struct{}
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// newLinkProxy listens on a free loopback port and forwards to target.
func newLinkProxy(target string) (*linkProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &linkProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address the gateway dials instead of Redis's.
func (p *linkProxy) Addr() string { return p.ln.Addr().String() }

// SetDelay holds every later chunk Redis sends for d before passing it
// on, or with patterns only the chunks that contain one of them (and, the
// stream being in order, what follows them on the same connection).
func (p *linkProxy) SetDelay(d time.Duration, patterns ...[]byte) {
	p.patterns.Store(&patterns)
	p.delay.Store(int64(d))
}

// held reports whether chunk b waits out the delay.
func (p *linkProxy) held(b []byte) bool {
	ps := p.patterns.Load()
	if ps == nil || len(*ps) == 0 {
		return true
	}
	for _, pat := range *ps {
		if bytes.Contains(b, pat) {
			return true
		}
	}
	return false
}

// Stall stops all traffic on the link until Release.
func (p *linkProxy) Stall() {
	p.mu.Lock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
	p.mu.Unlock()
}

// Release lets traffic pass again after Stall.
func (p *linkProxy) Release() {
	p.mu.Lock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	p.mu.Unlock()
}

// gate returns a channel that is closed when traffic may pass (nil: now).
func (p *linkProxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled
}

func (p *linkProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		r, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			r.Close()
			return
		}
		p.conns[c], p.conns[r] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(r, c, false)
		go p.pipe(c, r, true)
	}
}

// chunk is bytes read from one side at a time.
type chunk struct {
	at   time.Time
	data []byte
}

// pipe copies from src to dst through a bounded queue of chunks, each held
// until it was read plus the delay (Redis-to-gateway only) and while the
// link is stalled. The delay shifts the stream; it does not add up.
func (p *linkProxy) pipe(dst, src net.Conn, fromRedis bool) {
	defer p.wg.Done()
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() { // writer
		defer close(done)
		for c := range q {
			if fromRedis {
				if d := time.Duration(p.delay.Load()); d > 0 && p.held(c.data) {
					time.Sleep(time.Until(c.at.Add(d)))
				}
			}
			if g := p.gate(); g != nil {
				<-g
			}
			if _, err := dst.Write(c.data); err != nil {
				src.Close()
				for range q { // let the reader finish
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{at: time.Now(), data: append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Close releases any stall, closes the listener and every connection, and
// waits for its goroutines.
func (p *linkProxy) Close() {
	p.Release()
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
