package gateway_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// TestQueryTargetsAsSent: request targets sent as written (a '#', which a
// client never sends in a URL it parses, is part of the query: a target
// has no fragment) get the same answers on both engines, the credential
// parameter read by identity's rules (identity.RawQuerier).
func TestQueryTargetsAsSent(t *testing.T) {
	g := newTestGateway(t)
	g.apply(t, &spec.Snapshot{
		Policies: []spec.Policy{{ID: "p", Rate: &spec.Rate{Requests: 100, Per: spec.Duration(time.Minute)}}},
		Keys:     []spec.Key{{KeyHash: keyHash("good"), Policies: []string{"p"}}},
		APIs:     []spec.API{{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho}},
	})
	for _, tc := range []struct {
		target, hdr string
		status      int
		body        string // the error, "" for a 200
	}{
		{"/echo/x?api_key=good#x", "", 403, "unknown API key"},
		{"/echo/x?a=1#&api_key=good", "", 200, ""},
		{"/echo/x?a=1#&x=1;api_key=zzz", "X-API-Key: good\r\n", 401, "ambiguous credentials: the api_key query parameter beside a ';'"},
		{"/echo/x?api_key=go%zzod", "X-API-Key: good\r\n", 401, "malformed api_key query parameter"},
		{"/echo/x?x=1;y=2", "X-API-Key: good\r\n", 200, ""},
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(g.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("GET " + tc.target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + tc.hdr + "\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.target, resp.StatusCode, b, tc.status)
		}
		if tc.body != "" && string(b) != `{"error":"`+tc.body+`"}`+"\n" {
			t.Errorf("%s: body %s, want error %q", tc.target, b, tc.body)
		}
	}
}
