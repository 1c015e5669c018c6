package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
)

// A Redis store shares one limit between every process that uses the same
// Redis: here a third-party API's 100 calls a minute, which any number of
// workers draw on with core.Wait. (Compiled, not run: it needs a Redis.)
func ExampleNew() {
	client, err := redisstore.NewClientFromURL("redis://127.0.0.1:6379/0")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	// The limit is prepared once; every call carries the rule.
	rule, err := store.Prepare(core.LimitSet{Rate: core.Limit{Rate: 100, Period: time.Minute}})
	if err != nil {
		log.Fatal(err)
	}
	call := core.Request{Consumer: "api.example.com", Rule: rule, Cost: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := core.Wait(ctx, store, call); err != nil {
		log.Fatal(err)
	}
	fmt.Println("allowed to call the API now")
}
