package dataplane

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/limitplane/limitplane/dataplane/threshold"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/live"
	"github.com/limitplane/limitplane/metrics"
	"github.com/limitplane/limitplane/spec"
)

// FollowOptions configure Follow: where the control plane is and who this
// data-plane member is (as AgentOptions), and how the member enforces
// (as live.Options).
type FollowOptions struct {
	// Address is the control plane's sync address, "host:port", or
	// several replicas' as a comma-separated list (AgentOptions.Address
	// says how the member fails over between them);
	// required.
	Address string
	// TLS secures the connection (AgentOptions.TLS); nil means
	// plaintext, for a loopback address.
	TLS *tls.Config
	// DialOptions are added to the agent's own (AgentOptions.DialOptions).
	DialOptions []grpc.DialOption
	// Group is the data plane this member belongs to: the processes
	// sharing one Redis (the replicas of a service, gateways beside
	// them); required.
	Group string
	// Tags select the APIs this data plane serves.
	Tags []string
	// Token is the data plane's secret; required.
	Token string
	// ID names this member in its group ("" means "<hostname>-<pid>");
	// Version is sent in Hello ("" means "dev").
	ID, Version string

	// Store holds the counters. Replicas on one Redis share their limits
	// through a *redisstore.Store on it (or a drl.Store in front of one,
	// for the Distributed Rate Limiter); nil means an in-process store
	// of this process's own, which Close closes. Follow does not close a
	// Store it is given.
	Store core.Store
	// FailurePolicy, Fallback, StoreTimeout, Observer, OnStoreError,
	// ClientIP and Resolver are live.Options's.
	FailurePolicy core.FailurePolicy
	Fallback      core.Store
	StoreTimeout  time.Duration
	Observer      core.Observer
	OnStoreError  func(error)
	ClientIP      identity.ClientIPOptions
	Resolver      spec.Resolver

	// A Store that is (or has under it) a redisstore.Store made with
	// Options.FollowsControlPlane spends global quotas from leases: Follow
	// then runs the data plane's QuotaRunner beside the agent (one is
	// elected per data plane among the processes on that Redis), with the
	// same Address, TLS, DialOptions, Group and Token, and Close stops it.

	// ThresholdWebhook, when set, sends quota threshold events
	// (policies' thresholds) to its URL: a threshold.Notifier is the
	// engines' QuotaObserver, stopped by Close. Its Claimer defaults to
	// the data plane's Redis (threshold.NewRedisClaimer, so the replicas
	// send each event once) when Store is a Redis store or has one
	// under it (made with FollowsControlPlane: the events also go to the
	// control plane's usage, with the quota runner's reports), and its
	// DataPlane to Group. nil: thresholds are not
	// watched.
	ThresholdWebhook *threshold.Options

	// Persister keeps the last applied configuration, so that a member
	// restarted while the control plane is down enforces it; nil means
	// the data plane's Redis when Store is a Redis store (or has one
	// under it: an Exact method, as drl.Store's), else none.
	Persister Persister
	// MaxStale and OnStale are AgentOptions's: with OnStale
	// StaleFailClosed, every request answers 503 (gRPC Unavailable) once
	// MaxStale passes without the control plane.
	MaxStale time.Duration
	OnStale  OnStale
	// StartTimeout is how long the member waits for the control plane
	// before it enforces the persisted configuration; 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration

	// DisableDecisionMetrics leaves metrics.Collector out of
	// MetricsHandler (limitplane_decisions_total, the decision latency
	// histogram, limitplane_store_errors_total): a decision then costs what it costs with a
	// static configuration (BenchmarkFollowedOverhead: the collector adds
	// 16 to 34 % to an admitted request's CPU time). The configuration and
	// sync metrics stay. Observer, if set, is told about decisions either
	// way.
	DisableDecisionMetrics bool

	// Logger receives the member's log lines; nil means slog.Default().
	Logger *slog.Logger
}

// Follower is a service's running configuration kept in step with a
// control plane: a *live.Config (embedded: Limiter, Authenticator,
// Revision, NotBuilt and the rest are its) and the Agent that feeds it.
// Give Limiter(api) and Authenticator(api) to the adapters' middleware.
// Close stops it.
type Follower struct {
	*live.Config
	// served are the APIs given to Authenticator: the service's own,
	// which Readiness requires.
	servedMu sync.Mutex
	served   []string
	agent    *Agent
	store    core.Store
	failure  core.FailurePolicy
	closers  []func() error
	registry *prometheus.Registry
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
}

// Follow starts a data-plane member for a service: a live configuration
// that the control plane at opts.Address keeps in step (policies, keys
// with their revocations and quota resets, API definitions), enforced by
// whatever middleware the service puts Limiter and Authenticator in. It
// returns at once: until the first configuration is applied (from the
// control plane, or the persisted one after StartTimeout) every request
// through it answers 503. The agent runs until ctx is done or Close is
// called. It fails when opts lack Address, Group or Token, have a Group
// that is not ValidGroup or an ID that protocol.CheckGatewayID refuses, or name an
// invalid OnStale, MaxStale or ClientIP, or an Address gRPC cannot dial
// (a malformed target; an unreachable control plane is retried, never an
// error).
func Follow(ctx context.Context, opts FollowOptions) (*Follower, error) {
	switch {
	case opts.Address == "":
		return nil, errors.New("dataplane: FollowOptions.Address is empty")
	case opts.Group == "":
		return nil, errors.New("dataplane: FollowOptions.Group is empty")
	case !ValidGroup(opts.Group):
		return nil, fmt.Errorf("dataplane: FollowOptions.Group %q: want %s", opts.Group, GroupRule)
	case opts.Token == "":
		return nil, errors.New("dataplane: FollowOptions.Token is empty")
	}
	if opts.ID != "" {
		if err := protocol.CheckGatewayID(opts.ID); err != nil {
			return nil, fmt.Errorf("dataplane: FollowOptions.ID: %w", err)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	f := &Follower{store: opts.Store, failure: opts.FailurePolicy, done: make(chan struct{}), registry: prometheus.NewRegistry()}
	if f.store == nil {
		m := memory.New(memory.Options{SweepInterval: time.Minute})
		f.store = m
		f.closers = append(f.closers, m.Close)
	}
	decisions := metrics.New(metrics.Options{})
	applies := metrics.NewGateway(metrics.Options{})
	var observer core.Observer
	switch {
	case opts.DisableDecisionMetrics:
		observer = opts.Observer
	case opts.Observer != nil:
		observer = teeObserver{decisions, opts.Observer}
	default:
		observer = decisions
	}
	var notifier *threshold.Notifier
	if w := opts.ThresholdWebhook; w != nil {
		o := *w
		if o.Claimer == nil {
			if rs := redisUnder(f.store); rs != nil {
				rc := threshold.NewRedisClaimer(rs.Client(), rs.KeyPrefix())
				// Reported to the control plane's usage by the quota
				// runner, which runs over such a store.
				rc.Reports = rs.FollowsControlPlane()
				o.Claimer = rc
			}
		}
		if o.DataPlane == "" {
			o.DataPlane = opts.Group
		}
		if o.Logger == nil {
			o.Logger = opts.Logger
		}
		n, err := threshold.New(o)
		if err != nil {
			f.closeAll()
			return nil, fmt.Errorf("dataplane: follow: %w", err)
		}
		notifier = n
		f.closers = append(f.closers, n.Close)
	}
	var quotaObserver core.QuotaObserver
	if notifier != nil {
		quotaObserver = notifier
	}
	cfg, err := live.New(live.Options{
		Store:         f.store,
		QuotaObserver: quotaObserver,
		FailurePolicy: opts.FailurePolicy,
		Fallback:      opts.Fallback,
		StoreTimeout:  opts.StoreTimeout,
		Observer:      observer,
		OnStoreError: func(err error) {
			decisions.ObserveStoreError(err)
			if opts.OnStoreError != nil {
				opts.OnStoreError(err)
			}
		},
		OnApply:  applies.ObserveApply,
		ClientIP: opts.ClientIP,
		Resolver: opts.Resolver,
		Logger:   opts.Logger,
	})
	if err != nil {
		f.closeAll()
		return nil, fmt.Errorf("dataplane: follow: %w", err)
	}
	f.Config = cfg
	f.closers = append(f.closers, cfg.Close)
	persister := opts.Persister
	if persister == nil {
		if rs := redisUnder(f.store); rs != nil {
			persister = NewRedisPersister(rs.Client(), opts.Group)
		}
	}
	a, err := New(AgentOptions{
		Target:       cfg,
		Address:      opts.Address,
		TLS:          opts.TLS,
		DialOptions:  opts.DialOptions,
		Group:        opts.Group,
		Tags:         opts.Tags,
		Token:        opts.Token,
		GatewayID:    opts.ID,
		Version:      opts.Version,
		Persister:    persister,
		MaxStale:     opts.MaxStale,
		OnStale:      opts.OnStale,
		StartTimeout: opts.StartTimeout,
		Logger:       opts.Logger,
	})
	if err != nil {
		f.closeAll()
		return nil, err // New's errors name the option
	}
	f.agent = a
	if err := a.checkAddresses(); err != nil {
		// A malformed target (Run would stop at once).
		f.closeAll()
		return nil, fmt.Errorf("dataplane: FollowOptions.Address %q: %w", opts.Address, err)
	}
	if !opts.DisableDecisionMetrics {
		f.registry.MustRegister(decisions)
	}
	if notifier != nil {
		f.registry.MustRegister(metrics.NewThresholds(metrics.Options{}, notifier.MetricStats))
	}
	f.registry.MustRegister(applies, metrics.NewSync(metrics.Options{}, func() metrics.SyncState {
		s := a.Status()
		d := s.Deliveries
		return metrics.SyncState{
			Connected: s.State == "connected", AppliedRevision: s.AppliedRevision, Staleness: s.Staleness,
			SnapshotsApplied: d.SnapshotsApplied, SnapshotsRejected: d.SnapshotsRejected,
			ChangesApplied: d.ChangesApplied, ChangesRejected: d.ChangesRejected, Reconnects: s.Reconnects,
		}
	}))
	var qr *QuotaRunner
	if rs := redisUnder(f.store); rs != nil && rs.FollowsControlPlane() {
		log := opts.Logger
		qr, err = NewQuotaRunner(QuotaRunnerOptions{
			Client: rs.Client(), KeyPrefix: rs.KeyPrefix(), Group: opts.Group, Token: opts.Token,
			Address: opts.Address, TLS: opts.TLS, DialOptions: opts.DialOptions,
			OnError: func(err error) { log.Debug("dataplane: follow: global quotas", "err", err) },
		})
		if err != nil {
			f.closeAll()
			return nil, fmt.Errorf("dataplane: follow: %w", err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	go func() {
		defer close(f.done)
		var wg sync.WaitGroup
		if qr != nil {
			wg.Go(func() { _ = qr.Run(rctx) })
		}
		if err := a.Run(rctx); err != nil {
			opts.Logger.Error("dataplane: follow: the agent stopped", "err", err)
		}
		wg.Wait()
	}()
	return f, nil
}

// redisUnder returns the Redis store s is, or has under it (a drl.Store's
// Exact), nil when there is none.
func redisUnder(s core.Store) *redisstore.Store {
	for range 4 {
		switch v := s.(type) {
		case *redisstore.Store:
			return v
		case interface{ Exact() core.Store }:
			s = v.Exact()
		default:
			return nil
		}
	}
	return nil
}

// teeObserver tells two observers about each decision.
type teeObserver [2]core.Observer

// ObserveDecision implements core.Observer.
func (t teeObserver) ObserveDecision(api string, d core.Decision, err error, took time.Duration) {
	t[0].ObserveDecision(api, d, err, took)
	t[1].ObserveDecision(api, d, err, took)
}

// Authenticator is live.Config.Authenticator, and it also makes api one
// of the service's own APIs: Readiness is not ready while the running
// configuration lacks it or has not built it (every request would answer
// 503), where another API not built only makes it degraded.
func (f *Follower) Authenticator(api string) identity.Authenticator {
	f.servedMu.Lock()
	if !slices.Contains(f.served, api) {
		f.served = append(f.served, api)
	}
	f.servedMu.Unlock()
	return f.Config.Authenticator(api)
}

// ownProblem returns why one of the service's own APIs cannot be served
// under st, "" when all can.
func (f *Follower) ownProblem(st *live.State) string {
	f.servedMu.Lock()
	defer f.servedMu.Unlock()
	for _, api := range f.served {
		e := st.API(api)
		if e == nil {
			return fmt.Sprintf("API %q is not in the running configuration (is it defined at the control plane, for this data plane's tags?)", api)
		}
		if _, ok := e.Built(); !ok {
			return fmt.Sprintf("API %q is not built: %s", api, e.Problem())
		}
	}
	return ""
}

// Agent returns the agent that keeps the configuration in step (for its
// Status).
func (f *Follower) Agent() *Agent { return f.agent }

// Readiness is what ReadyHandler answers, as JSON.
type Readiness struct {
	// Ready is true when the member enforces a configuration and may
	// take traffic.
	Ready bool `json:"ready"`
	// Revision is the running configuration's revision (0: none).
	Revision uint64 `json:"revision"`
	// Error says why the member is not ready.
	Error string `json:"error,omitempty"`
	// Degraded is true when some API or policy is not built (NotBuilt
	// lists them); the rest is enforced, so the member stays ready.
	Degraded bool            `json:"degraded,omitempty"`
	NotBuilt []live.NotBuilt `json:"not_built,omitempty"`
	// Store says whether the limit store answered a PING: "ok",
	// "unreachable" (Error says why) or "in-process" (a store with no
	// Ping method, such as the memory store); "" when Readiness did not
	// ask, because the member was not ready for another reason.
	Store string `json:"store,omitempty"`
	// ControlPlane is the agent's status.
	ControlPlane Status `json:"control_plane"`
}

// Readiness reports whether the member may take traffic: not before a
// configuration is applied, not while SetUnavailable holds (on_stale:
// fail_closed), not while the control plane refuses this data plane's
// token (Status.NotReady), not while one of the service's own APIs
// (those given to Authenticator) is missing from the running
// configuration or not built, and, when the FailurePolicy is
// core.FailClosed, not while the store does not answer a PING (bounded
// by ctx and live.DefaultPingTimeout). Under FailOpen or FailFallback a
// store that does not answer leaves the member ready (requests are
// served meanwhile), with Store "unreachable" and the failure in Error,
// as the gateway's GET /readyz does.
func (f *Follower) Readiness(ctx context.Context) Readiness {
	s := f.agent.Status()
	out := Readiness{ControlPlane: s}
	st := f.State()
	if st != nil {
		out.Revision = st.Revision()
		out.NotBuilt = st.NotBuilt()
		out.Degraded = len(out.NotBuilt) > 0
	}
	switch {
	case st == nil:
		out.Error = "no configuration applied yet"
	case s.NotReady() != "":
		out.Error = s.NotReady()
	case f.Unavailable() != "":
		out.Error = f.Unavailable()
	case f.ownProblem(st) != "":
		out.Error = f.ownProblem(st)
	default:
		out.Ready = true
		f.pingStore(ctx, &out)
	}
	return out
}

// pingStore sets out.Store, and for a store that does not answer
// out.Error, and out.Ready under FailClosed.
func (f *Follower) pingStore(ctx context.Context, out *Readiness) {
	var err error
	out.Store, err = live.PingStore(ctx, f.store, live.DefaultPingTimeout)
	if err != nil {
		out.Error = "limit store unreachable: " + err.Error()
		out.Ready = f.failure != core.FailClosed
	}
}

// ReadyHandler returns an http.Handler for the service's GET /readyz: 200
// with Readiness as JSON when ready, 503 with it otherwise.
func (f *Follower) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := f.Readiness(r.Context())
		b, err := json.Marshal(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if !out.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write(append(b, '\n'))
	})
}

// MetricsHandler returns an http.Handler for the service's GET /metrics,
// in Prometheus's text format: the decisions (metrics.Collector, unless
// FollowOptions.DisableDecisionMetrics), the configurations applied
// (metrics.Gateway) and the link to the control
// plane (metrics.Sync), each under the "limitplane" namespace. Register
// more with Registry.
func (f *Follower) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(f.registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Registry returns the registry MetricsHandler serves.
func (f *Follower) Registry() *prometheus.Registry { return f.registry }

// Close stops the agent (waiting for it: the last configuration and
// contact are persisted), then the configuration and the in-process
// store Follow made. Requests after Close are decided under the last
// configuration. It is safe to call more than once.
func (f *Follower) Close() error {
	var err error
	f.once.Do(func() {
		f.cancel()
		<-f.done
		err = f.closeAll()
	})
	return err
}

func (f *Follower) closeAll() error {
	var errs []error
	for i := len(f.closers) - 1; i >= 0; i-- {
		errs = append(errs, f.closers[i]())
	}
	return errors.Join(errs...)
}
