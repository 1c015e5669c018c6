package adapters

import (
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// BenchmarkFiberKeyCheck is limitplane's Fiber middleware with the API-key
// authenticator (identity.NewAPIKey, its default sources) on one
// fasthttp.RequestCtx, its response reset per request: a key it refused
// before, presented again in X-API-Key ("unknown", 64 bytes; 403), the
// same key in two X-API-Key lines ("twice"; 401), and a known key
// ("known"; admitted, 10⁹ a second).
func BenchmarkFiberKeyCheck(b *testing.B) {
	store := memory.New(memory.Options{})
	b.Cleanup(func() { store.Close() })
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "k", Rate: core.Limit{Rate: peerLimit, Period: time.Second}},
	}}, core.Options{})
	if err != nil {
		b.Fatal(err)
	}
	known := strings.Repeat("k", 64)
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey(known), Policies: []string{"k"}}})
	if err != nil {
		b.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(lpfiber.Middleware(eng, identity.NewAPIKey(keys, identity.APIKeyOptions{}), lpfiber.Options{API: "x"}))
	app.Get("/x", func(c *fiber.Ctx) error { return c.SendString("ok") })
	h := app.Handler()
	unknown := strings.Repeat("u", 64)
	for _, tc := range []struct {
		name   string
		keys   []string
		status int
	}{{"unknown", []string{unknown}, 403}, {"twice", []string{unknown, unknown}, 401}, {"known", []string{known}, 200}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := fiberPeerCtx()
			for _, k := range tc.keys {
				ctx.Request.Header.Add("X-API-Key", k)
			}
			h(ctx)
			if c := ctx.Response.StatusCode(); c != tc.status {
				b.Fatalf("status %d, want %d", c, tc.status)
			}
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				h(ctx)
			}
		})
	}
}
