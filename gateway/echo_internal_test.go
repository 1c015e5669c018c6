package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The echo upstream answers a body it cannot read (bad chunked framing)
// with 400, not with 200 and body_bytes 0; a good chunked body is counted.
func TestEchoMalformedBody(t *testing.T) {
	srv := httptest.NewServer(echo("x"))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"bad chunk size", "zz\r\nabc\r\n0\r\n\r\n", http.StatusBadRequest, `{"error":"malformed request body"}`},
		{"good chunks", "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", http.StatusOK, `"body_bytes": 5`},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			req := "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + c.body
			if _, err := io.WriteString(conn, req); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) {
				t.Fatalf("got %d %s; want %d with %s", resp.StatusCode, b, c.status, c.want)
			}
		})
	}
}
