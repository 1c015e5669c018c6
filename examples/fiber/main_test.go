package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/core"
)

// TestRun serves the example, spends the demo key's burst, and stops it.
func TestRun(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, &out, core.NewManualClock(1)) }()

	url := "http://" + ln.Addr().String() + "/hello"
	get := func(key string) (int, string) {
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Ratelimit") + " " + string(b)
	}
	var codes []int
	var last string
	for range 7 {
		c, body := get("demo-key")
		codes, last = append(codes, c), body
	}
	// The clock is frozen: the burst of 5 passes, nothing after it.
	if fmt.Sprint(codes) != "[200 200 200 200 200 429 429]" {
		t.Fatalf("codes %v", codes)
	}
	if want := `"demo";r=0;t=1, "demo/quota";r=995;t=3600 {"error":"rate limit exceeded","retry_after_ms":200}` + "\n"; last != want {
		t.Fatalf("7th answer %q, want %q", last, want)
	}
	if c, body := get(""); c != 401 || body != ` {"error":"no API key"}`+"\n" {
		t.Fatalf("no key: %d %q", c, body)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "curl -i -H 'X-API-Key: demo-key' "+url) || !strings.HasSuffix(s, "stopped\n") {
		t.Fatalf("output:\n%s", s)
	}

	// README.md shows the banner on the default address (the Fiber one
	// as the Gin one, with "Fiber").
	banner, _, _ := strings.Cut(out.String(), "Ctrl-C stops it.\n")
	banner = strings.ReplaceAll(banner+"Ctrl-C stops it.\n", ln.Addr().String(), "127.0.0.1:8080")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), strings.ReplaceAll(banner, "Fiber", "Gin")) || !strings.Contains(banner, "limitplane Fiber example on ") {
		t.Errorf("README.md does not show the banner:\n%s", banner)
	}
}
