package adapters

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
)

// wireWriter is an http.ResponseWriter that does, per request, the work
// net/http's server does for a response, short of the socket: a new
// header map per request (the server's response.handlerHeader), the
// Content-Type sniffed when the handler sets none, the status line and
// the header fields serialized in sorted order (http.Header.Write, which
// is the server's writeSubset) and the body, all into a buffer reused
// from request to request (the server's pooled bufio.Writer). Unlike
// httptest.ResponseRecorder it keeps no snapshot of the header map
// (ResponseRecorder clones it on WriteHeader) and allocates no result,
// so "added" is what a middleware adds on a real server's path, less the
// syscall, and the bare row is about a fifth of the recorder's.
type wireWriter struct {
	header http.Header
	status int
	buf    bytes.Buffer
}

// reset starts a new response.
func (w *wireWriter) reset() {
	w.header = make(http.Header)
	w.status = 0
	w.buf.Reset()
}

func (w *wireWriter) Header() http.Header { return w.header }

func (w *wireWriter) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	w.status = code
	w.buf.WriteString("HTTP/1.1 ")
	w.buf.Write(strconv.AppendInt(w.buf.AvailableBuffer(), int64(code), 10))
	w.buf.WriteString(" ")
	w.buf.WriteString(http.StatusText(code))
	w.buf.WriteString("\r\n")
	w.header.Write(&w.buf)
	w.buf.WriteString("\r\n")
}

func (w *wireWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		if _, ok := w.header["Content-Type"]; !ok {
			w.header.Set("Content-Type", http.DetectContentType(p))
		}
		w.WriteHeader(http.StatusOK)
	}
	return w.buf.Write(p)
}

// BenchmarkPeersNetHTTPWire is BenchmarkPeersNetHTTP with a wireWriter,
// reset before each request, in place of a new httptest.ResponseRecorder.
func BenchmarkPeersNetHTTPWire(b *testing.B) { benchPeersNetHTTPWire(b, admitRate) }

// BenchmarkPeersNetHTTPWireDeny is BenchmarkPeersNetHTTPWire at denyRate.
func BenchmarkPeersNetHTTPWireDeny(b *testing.B) { benchPeersNetHTTPWire(b, denyRate) }

func benchPeersNetHTTPWire(b *testing.B, rate peerRate) {
	benchNetHTTPRows(b, rate, func() func(http.Handler, *http.Request) {
		w := new(wireWriter)
		return func(h http.Handler, r *http.Request) {
			w.reset()
			h.ServeHTTP(w, r)
		}
	})
}

// TestWireWriterAsServer checks that a wireWriter writes what net/http's
// server writes for the same handler, less the fields the server adds
// itself (Date, Content-Length): a limitplane answer, admitted and
// denied, through a real server and a real client.
func TestWireWriterAsServer(t *testing.T) {
	for _, rate := range []peerRate{admitRate, denyRate} {
		h := netHTTPPeers[1].wrap(t, okHandler(), rate)
		srv := httptest.NewServer(h)
		// The warm-up request spends denyRate's one request; the second
		// is the one compared.
		var resp *http.Response
		for range 2 {
			var err error
			if resp, err = srv.Client().Get(srv.URL + "/x"); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		srv.Close()
		resp.Header.Del("Date")
		resp.Header.Del("Content-Length")
		var want bytes.Buffer
		fmt.Fprintf(&want, "HTTP/1.1 %s\r\n", resp.Status)
		resp.Header.Write(&want)
		want.WriteString("\r\n")

		r := httptest.NewRequest("GET", "/x", nil)
		r.RemoteAddr = "127.0.0.1:40000"
		w := new(wireWriter)
		for range 2 {
			w.reset()
			h.ServeHTTP(w, r)
		}
		got := w.buf.String()
		head, _, _ := bytes.Cut([]byte(got), []byte("\r\n\r\n"))
		if string(head)+"\r\n\r\n" != want.String() {
			t.Errorf("rate %v: wireWriter wrote\n%q\nthe server\n%q", rate, string(head)+"\r\n\r\n", want.String())
		}
	}
}

// cpuClock measures the process's CPU time (user and system, every
// thread: the garbage collector's background workers among them) over a
// benchmark's loop. Its report, cpu-ns/op, counts what wall-clock ns/op
// leaves out on a machine with an idle core: the collection of each
// request's garbage, done beside the loop rather than in it. A server
// whose cores are all busy pays that too.
type cpuClock struct {
	b     *testing.B
	start int64
}

func startCPU(b *testing.B) cpuClock { return cpuClock{b, processCPUNanos(b)} }

// report adds cpu-ns/op to b's results; call it after the loop.
func (c cpuClock) report() {
	if c.b.N > 0 {
		c.b.ReportMetric(float64(processCPUNanos(c.b)-c.start)/float64(c.b.N), "cpu-ns/op")
	}
}

// processCPUNanos returns this process's CPU time so far, user and
// system, in ns.
func processCPUNanos(tb testing.TB) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
