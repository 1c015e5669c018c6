package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// FastMaxBodyBytes is the largest request body the fasthttp engine
// takes, in bytes: it reads each body whole before the gateway sees the
// request, and answers a larger one 413.
const FastMaxBodyBytes = 16 << 20

// headerSlop is what net/http's server reads of a header beyond
// MaxHeaderBytes before it answers 431 (its "bufio slop"): the fasthttp
// engine takes the same headers.
const headerSlop = 4096

// fastEngine is fasthttp's server as an engine (server.engine:
// fasthttp). fasthttp's server cannot close the connections it serves, so
// the engine keeps them (conns) and close closes them.
type fastEngine struct {
	s       *fasthttp.Server
	ln      *trackedListener // the gateway's listener
	closing atomic.Bool
}

// newFastEngine is a fasthttp server for f with the file's server
// settings: read_header_timeout bounds the request header,
// read_timeout the body from the end of the header, write_timeout the
// response's write, idle_timeout a keep-alive connection's wait,
// max_header_bytes the header (431 above it and headerSlop, as net/http).
func (s *Server) newFastEngine(f *inFlight, ln net.Listener) *fastEngine {
	sc := s.cfg.Server
	e := &fastEngine{ln: &trackedListener{Listener: ln, conns: &connSet{m: make(map[net.Conn]struct{})}}}
	e.s = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			f.n.Add(1)
			defer f.n.Add(-1)
			f.h.ServeFastHTTP(ctx)
		},
		ErrorHandler: fastErrorHandler,
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if h.ContentLength() == 0 {
				// No body to read (fasthttp says 0 for a request
				// without Content-Length or Transfer-Encoding): no
				// deadline to move, one timer update a request saved.
				return fasthttp.RequestConfig{}
			}
			return fasthttp.RequestConfig{ReadTimeout: sc.ReadTimeout}
		},
		ReadTimeout:                  sc.ReadHeaderTimeout,
		WriteTimeout:                 sc.WriteTimeout,
		IdleTimeout:                  sc.IdleTimeout,
		ReadBufferSize:               sc.MaxHeaderBytes + headerSlop,
		MaxRequestBodySize:           FastMaxBodyBytes,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		Logger:                       fastLogger{s.log},
	}
	return e
}

// serve serves the listener the engine was made with (ln is that one).
func (e *fastEngine) serve(net.Listener) error {
	if e.closing.Load() {
		return http.ErrServerClosed
	}
	err := e.s.Serve(e.ln)
	if e.closing.Load() || err == nil {
		// fasthttp returns nil once its listener is closed.
		return http.ErrServerClosed
	}
	return err
}

// shutdown closes the listener itself first: fasthttp's Shutdown does
// nothing when Serve has not registered the listener yet, and Serve would
// then serve on.
func (e *fastEngine) shutdown(ctx context.Context) error {
	e.closing.Store(true)
	e.ln.Close()
	return e.s.ShutdownWithContext(ctx)
}

func (e *fastEngine) close() {
	e.closing.Store(true)
	e.ln.Close()
	e.ln.conns.closeAll()
}

// fastErrorHandler answers the requests fasthttp cannot read as net/http's
// server does: 431 for a header over max_header_bytes, 413 for a body over
// FastMaxBodyBytes, 408 for a request not read in time, 400 for anything
// else, each with a text/plain body and the connection closed.
func fastErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	status := http.StatusBadRequest
	var small *fasthttp.ErrSmallBuffer
	var timeout interface{ Timeout() bool }
	switch {
	case errors.As(err, &small):
		status = http.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status = http.StatusRequestEntityTooLarge
	case errors.As(err, &timeout) && timeout.Timeout():
		status = http.StatusRequestTimeout
	}
	ctx.Response.Reset()
	ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	ctx.Response.SetStatusCode(status)
	ctx.Response.SetBodyString(fmt.Sprintf("%d %s", status, http.StatusText(status)))
	ctx.SetConnectionClose()
}

// fastLogger writes fasthttp's log lines as warnings.
type fastLogger struct{ l *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) {
	l.l.Warn("fasthttp: " + fmt.Sprintf(format, args...))
}

// connSet is the connections a listener accepted and that are not closed
// yet.
type connSet struct {
	mu     sync.Mutex
	m      map[net.Conn]struct{}
	closed bool
}

// add keeps c, or closes it when the set is closed already.
func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	s.m[c] = struct{}{}
	return true
}

func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

// closeAll closes every connection kept, and those added later.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	conns := make([]net.Conn, 0, len(s.m))
	for c := range s.m {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// trackedListener keeps each connection it accepts in a connSet until
// the connection is closed. Closing it again returns nil.
type trackedListener struct {
	net.Listener
	conns *connSet
	once  sync.Once
}

func (l *trackedListener) Close() error {
	var err error
	l.once.Do(func() { err = l.Listener.Close() })
	return err
}

func (l *trackedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, conns: l.conns}
		if l.conns.add(tc) {
			return tc, nil
		}
	}
}

// trackedConn leaves its connSet when closed. Once closed, setting its
// deadlines does nothing: fasthttp panics when that fails, as it does on a
// connection that close cut under a request; its next read or write
// fails instead, which fasthttp handles.
type trackedConn struct {
	net.Conn
	conns  *connSet
	once   sync.Once
	closed atomic.Bool
}

func (c *trackedConn) Close() error {
	c.closed.Store(true)
	c.once.Do(func() { c.conns.remove(c) })
	return c.Conn.Close()
}

func (c *trackedConn) SetDeadline(t time.Time) error {
	if c.closed.Load() {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

func (c *trackedConn) SetReadDeadline(t time.Time) error {
	if c.closed.Load() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *trackedConn) SetWriteDeadline(t time.Time) error {
	if c.closed.Load() {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}
