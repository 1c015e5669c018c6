package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"github.com/limitplane/limitplane/gateway/server"
)

// A gateway in front of the built-in echo upstream, from its file: key
// k has 2 requests a minute, so the third is refused with 429.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "gateway")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "gateway.yaml")
	err = os.WriteFile(file, []byte(`
listen: 127.0.0.1:0
policies: [{id: p, rate: {requests: 2, per: 1m}}]
keys: [{key: k, policies: [p]}]
apis: [{id: echo, listen_path: /echo/, target: "builtin:echo"}]
`), 0o600)
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	srv, err := server.Open(ctx, server.Options{
		ConfigPath: file,
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()

	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL()+"/echo/hello", nil)
		req.Header.Set("X-API-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}

	// What a program does on SIGTERM: drain, then release.
	if err := srv.Shutdown(ctx); err != nil {
		panic(err)
	}
	fmt.Println(<-served)
	// Output:
	// 200
	// 200
	// 429
	// http: Server closed
}
