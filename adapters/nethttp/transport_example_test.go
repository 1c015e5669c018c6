package nethttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// A Transport holds an http.Client's calls to a third-party API under that
// API's limit: here 20 per second, one at a time, so five calls take at
// least four emission intervals (200ms). With a Redis store the budget is
// shared by every process using the same Key.
func ExampleNewTransport() {
	thirdParty := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer thirdParty.Close()

	tr, err := nethttp.NewTransport(nethttp.TransportOptions{
		Store: memory.New(memory.Options{}),
		Key:   "api.example.com",
		Limit: core.Limit{Rate: 20, Period: time.Second, Burst: 1},
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: tr}
	start := time.Now()
	for i := 0; i < 5; i++ {
		resp, err := client.Get(thirdParty.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
	}
	fmt.Println("5 calls held to 20/s:", time.Since(start) >= 200*time.Millisecond)
	// Output: 5 calls held to 20/s: true
}
