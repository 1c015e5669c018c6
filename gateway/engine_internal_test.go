package gateway

import (
	"flag"
	"net"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"
)

// testEngine is the engine the gateway tests serve their gateways on
// (ServeTest): go test ./gateway -engine fasthttp runs them on fasthttp.
var testEngine = flag.String("engine", "net/http", "engine the tests serve gateways on: net/http or fasthttp")

// TestServer is a gateway served on a real loopback listener for a test.
type TestServer struct {
	URL   string // http://127.0.0.1:port
	close func()
}

// Close stops the server.
func (s *TestServer) Close() { s.close() }

// ServeTest serves g on a loopback listener with the engine -engine
// names, until the test ends or Close is called.
func ServeTest(t testing.TB, g *Gateway) *TestServer {
	t.Helper()
	switch *testEngine {
	case "net/http":
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		return &TestServer{URL: srv.URL, close: srv.Close}
	case "fasthttp":
		return serveFastTest(t, g)
	}
	t.Fatalf("-engine %q: want net/http or fasthttp", *testEngine)
	return nil
}

// serveFastTest serves g on a loopback listener with the fasthttp engine,
// whatever -engine says, until the test ends or Close is called.
func serveFastTest(t testing.TB, g *Gateway) *TestServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fasthttp.Server{Handler: g.ServeFastHTTP, NoDefaultServerHeader: true, NoDefaultContentType: true}
	done := make(chan struct{})
	go func() { defer close(done); fs.Serve(ln) }()
	stop := func() {
		ln.Close()
		fs.Shutdown()
		<-done
	}
	var once sync.Once
	s := &TestServer{URL: "http://" + ln.Addr().String(), close: func() { once.Do(stop) }}
	t.Cleanup(s.Close)
	return s
}
