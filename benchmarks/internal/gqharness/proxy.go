package gqharness

import (
	"net"
	"sync"
	"time"
)

// CutKind says what a cut does to a data plane's link to the control
// plane.
type CutKind string

const (
	// CutRefuse closes every open connection of the link at the cut's
	// start and, until its end, accepts each new connection only to close
	// it at once: the gateways see their stream fail and every redial
	// fail fast, as with a control plane that is down.
	CutRefuse CutKind = "refuse"
	// CutStall passes no byte either way, on open or new connections,
	// until the cut's end: the gateways see silence, as with a network
	// partition that drops packets, and find out by their keepalive.
	CutStall CutKind = "stall"
)

// cutProxy is one data plane's TCP link to the control plane's sync port.
// All of the data plane's gateways dial it instead of the control plane,
// so the harness can cut exactly that data plane off (Cut, Restore).
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	kind   CutKind       // "" while the link runs
	gate   chan struct{} // closed by Restore; nil while the link runs
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// newCutProxy listens on a free loopback port and forwards to target.
func newCutProxy(target string) (*cutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address the gateways dial.
func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

// Cut cuts the link the way kind says until Restore.
func (p *cutProxy) Cut(kind CutKind) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kind != "" {
		return
	}
	p.kind, p.gate = kind, make(chan struct{})
	if kind == CutRefuse {
		for c := range p.conns {
			c.Close()
		}
	}
}

// Restore ends a cut.
func (p *cutProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
	}
	p.kind, p.gate = "", nil
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refused := p.kind == CutRefuse || p.closed
		p.mu.Unlock()
		if refused {
			c.Close()
			continue
		}
		r, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			c.Close() // the control plane is down: so is the link
			continue
		}
		p.mu.Lock()
		if p.closed || p.kind == CutRefuse {
			p.mu.Unlock()
			c.Close()
			r.Close()
			continue
		}
		p.conns[c], p.conns[r] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(r, c)
		go p.pipe(c, r)
	}
}

// pipe copies src to dst, holding each chunk while the link is stalled.
func (p *cutProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			if gate != nil {
				<-gate
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil { // io.EOF or a closed connection
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Close ends any cut, closes the listener and every connection, and waits
// for its goroutines.
func (p *cutProxy) Close() {
	p.Restore()
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
