package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/core"
)

// TestServerAndClient runs the example server with a frozen clock, the
// example client against it, and stops the server.
func TestServerAndClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var srvOut bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, &srvOut, core.NewManualClock(1)) }()

	var out bytes.Buffer
	if err := runClient(context.Background(), ln.Addr().String(), "demo-key", 7, &out); err != nil {
		t.Fatal(err)
	}
	if err := runClient(context.Background(), ln.Addr().String(), "wrong", 1, &out); err != nil {
		t.Fatal(err)
	}
	want := `call 1: OK  ratelimit: "demo";r=4;t=1
call 2: OK  ratelimit: "demo";r=3;t=1
call 3: OK  ratelimit: "demo";r=2;t=1
call 4: OK  ratelimit: "demo";r=1;t=1
call 5: OK  ratelimit: "demo";r=0;t=1
call 6: ResourceExhausted "rate limit exceeded" retry in 200ms  ratelimit: "demo";r=0;t=1
call 7: ResourceExhausted "rate limit exceeded" retry in 200ms  ratelimit: "demo";r=0;t=1
call 1: PermissionDenied "unknown API key"
`
	if out.String() != want {
		t.Fatalf("client output:\n%s\nwant:\n%s", out.String(), want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := srvOut.String(); !strings.Contains(s, "go run ./examples/grpc -client -addr "+ln.Addr().String()) || !strings.HasSuffix(s, "stopped\n") {
		t.Fatalf("server output:\n%s", s)
	}

	// README.md shows the banner on the default address.
	banner, _, _ := strings.Cut(srvOut.String(), "Ctrl-C stops it.\n")
	banner = strings.ReplaceAll(banner+"Ctrl-C stops it.\n", ln.Addr().String(), "127.0.0.1:50051")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```\n"+banner+"```\n") {
		t.Errorf("README.md does not show the banner:\n%s", banner)
	}
}

// A client pointed at no server fails instead of printing Unavailable
// lines and exiting 0.
func TestClientWithoutServerFails(t *testing.T) {
	var out bytes.Buffer
	err := runClient(context.Background(), "127.0.0.1:1", "demo-key", 3, &out)
	if err == nil || !strings.Contains(err.Error(), "call 1: ") || out.Len() != 0 {
		t.Fatalf("err %v, output %q", err, out.String())
	}
}

// -n below 1 is an error, not a client that does nothing and exits 0.
func TestClientNeedsACall(t *testing.T) {
	var out bytes.Buffer
	for _, n := range []int{0, -3} {
		err := runClient(context.Background(), "127.0.0.1:1", "demo-key", n, &out)
		if want := fmt.Sprintf("-n %d: the client makes at least one call", n); err == nil || err.Error() != want || out.Len() != 0 {
			t.Fatalf("-n %d: err %v, output %q; want %q", n, err, out.String(), want)
		}
	}
}
