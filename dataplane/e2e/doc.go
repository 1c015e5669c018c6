// Package e2e holds limitplane's end-to-end tests of control and data
// planes, and nothing else: it has no code of its own outside its tests.
//
// The tests run the real programs as processes: TestMain builds
// ./cmd/limitplane-controlplane, ./cmd/limitplane-gateway and ./examples/service
// once (go build) into a temporary directory; each test starts a control plane (its admin token
// in the environment, its bbolt file in the test's temporary directory,
// its sync port on the loopback and a -dataplanes file of hashed tokens
// the test writes), one redis-server per data plane
// (internal/redistest.Start, never the Redis on 127.0.0.1:6379) and the
// data planes' gateways with generated YAML (a Redis store, an admin
// section and a control_plane section). They talk to them the way an
// operator and a client would: the admin REST API with spec's JSON, the
// gateways' /readyz, and HTTP requests whose admitted counts are asserted
// exactly. Every process a test starts is stopped by t.Cleanup (SIGTERM,
// then SIGKILL after a bound).
//
// What the tests show (the "Show it works" list of the data-plane issue):
// Tyk's behaviour of a quota per data plane; per-data-plane allocation of
// one global limit and a data plane sharing one Redis; quota resets
// reaching every gateway once, also after a cut; the control plane
// killed, frozen and absent; a data plane's link to it cut (TestLinkCut
// puts a data plane in a network namespace joined by veth links, so it
// needs root and ip); bad tokens and bad changes refused with the
// running configuration untouched. The "fake control plane" of the bad
// input tests is a gRPC server built on dataplane/syncpb in the test.
// BenchmarkPropagation times one key change from the admin API to four
// gateways. TestServices runs services of one's own (examples/service on
// Gin, Fiber, net/http and gRPC, two replicas each) as data-plane members
// instead of gateways. The HA tests (ha_*_test.go) run control-plane
// replicas with -store on one PostgreSQL of their own (internal/pgtest):
// TestHAPropagation (p50/p99 of a change through another replica),
// TestHAChaos (replicas SIGKILLed under writers) and TestHADatabaseOutage
// (PostgreSQL stopped with pg_ctl stop -m immediate under writes); they
// need Debian's postgresql package (initdb, postgres, pg_ctl).
//
// Run them with
//
//	go test -race -count=1 ./dataplane/e2e/
//
// redis-server must be on PATH (or named by REDIS_SERVER). With
// LP_E2E_RACE=1 the programs are built with -race too; with
// LP_E2E_DUMP=1 a failed test sends SIGQUIT to the processes it still
// runs, so their logs end with every goroutine's stack.
package e2e
