package dataplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/internal/failurelog"
	"github.com/limitplane/limitplane/live"
	"github.com/limitplane/limitplane/spec"
)

// Defaults of AgentOptions.
const (
	// DefaultDigestInterval is how often the agent reports its digest.
	DefaultDigestInterval = 30 * time.Second
	// DefaultStartTimeout is how long the agent waits for the control
	// plane's first configuration before it applies the persisted one.
	DefaultStartTimeout = 5 * time.Second
	// DefaultBackoffInitial is the first reconnect delay (before jitter).
	DefaultBackoffInitial = 100 * time.Millisecond
	// DefaultBackoffMax caps the reconnect delay, jitter included: a
	// gateway is connected again within about a second of its control
	// plane's return, however long the outage, and a refusing control
	// plane gets at most one attempt a second from each gateway.
	DefaultBackoffMax = time.Second
	// DefaultBackoffMultiplier is the factor the delay grows by after each
	// failed attempt.
	DefaultBackoffMultiplier = 2.0
	// DefaultBackoffJitter is the randomization factor: each delay is
	// drawn from [d×(1−j), d×(1+j)].
	DefaultBackoffJitter = 0.2
	// DefaultKeepaliveTime is how long a quiet connection waits before it
	// pings the control plane.
	DefaultKeepaliveTime = 10 * time.Second
	// DefaultKeepaliveTimeout is how long a ping may go unanswered before
	// the connection is taken for dead.
	DefaultKeepaliveTimeout = 5 * time.Second
	// DefaultSaveDelay is how long the agent lets changes gather before
	// it persists the configuration they made.
	DefaultSaveDelay = time.Second
	// DefaultContactSaveInterval is how often, at most, the agent
	// persists the time of its last contact while connected.
	DefaultContactSaveInterval = 5 * time.Second
)

// OnStale says what a data plane does once it has been without its
// control plane for AgentOptions.MaxStale.
type OnStale string

// OnStale values.
const (
	// StaleKeep serves on with the last configuration (Tyk's emergency
	// mode). The default.
	StaleKeep OnStale = "keep"
	// StaleFailClosed makes the gateway answer 503 to every API request
	// (gateway.SetUnavailable) until the control plane answers again.
	StaleFailClosed OnStale = "fail_closed"
)

// Backoff configures the reconnect delays: exponential with jitter
// (github.com/cenkalti/backoff/v5's ExponentialBackOff), reset after a
// stream on which the control plane answered. It is the only backoff:
// when the agent dials Address, each attempt dials a connection of its
// own, so gRPC's connect backoff never adds its delay to the agent's.
type Backoff struct {
	// Initial is the first delay; 0 means DefaultBackoffInitial.
	Initial time.Duration
	// Max caps the delay, jitter included (no wait is longer); 0 means
	// DefaultBackoffMax.
	Max time.Duration
	// Multiplier is the growth factor; 0 means DefaultBackoffMultiplier.
	Multiplier float64
	// Jitter is the randomization factor in [0, 1); 0 means
	// DefaultBackoffJitter, a negative value none (exact delays, for
	// tests).
	Jitter float64
}

// Target is the running configuration an Agent keeps in step with its
// control plane. *live.Config implements it, and so does
// *gateway.Gateway, which embeds one; their documentation says what each
// method does. The agent calls ApplyPartial for a snapshot of the
// control plane's history, Replace for one of another history (or a
// data plane ahead of it), UpdateKeys for changes of keys only, Snapshot
// and Key to compute and check digests, NotBuilt to report what this
// host could not build, and SetUnavailable for on_stale: fail_closed.
type Target interface {
	ApplyPartial(ctx context.Context, snap *spec.Snapshot) error
	Replace(ctx context.Context, snap *spec.Snapshot) error
	UpdateKeys(ctx context.Context, revision uint64, put []spec.Key, del []string) error
	Snapshot() *spec.Snapshot
	Key(hash string) *spec.Key
	NotBuilt() []live.NotBuilt
	SetUnavailable(reason string)
}

var (
	_ Target = (*live.Config)(nil)
)

// AgentOptions configure an Agent.
type AgentOptions struct {
	// Target is the running configuration the agent keeps in step: a
	// *gateway.Gateway, or a service's *live.Config (see Follow);
	// required. The agent is its only writer: do not Apply to it
	// meanwhile.
	Target Target
	// Address is the control plane's sync address, "host:port" (a gRPC
	// target; a host name is resolved by gRPC's dns resolver), or the
	// addresses of several replicas of one control plane (processes on
	// one shared store) as a comma-separated list,
	// "cp1.example:7071,cp2.example:7071" (spaces around the commas are
	// ignored; an empty part is an error). Required unless Conn is set.
	//
	// Failover: each attempt dials one address of the list, the first
	// chosen at random (gateways spread over the replicas), then the
	// next one after each stream that ends, whatever ended it (the
	// replica shut down, refused the connection, was killed, or stopped
	// answering keepalive pings): the delay between attempts is the
	// Backoff, as with one address. A host name with several A/AAAA
	// records is one address whose records gRPC tries in a shuffled
	// order (pick_first with shuffleAddressList), moving to the next
	// record when one refuses or does not answer within the connect
	// timeout. The agent's Hello carries the revision and digest it runs,
	// and a replica of the same store continues from them with changes
	// (see controlplane.SyncServer), so a failover costs no snapshot.
	Address string
	// TLS, when set, secures the connection (a client certificate in it
	// makes it mutual TLS); nil means plaintext, which the gateway's
	// configuration allows only to a loopback address.
	TLS *tls.Config
	// DialOptions are added to the agent's own (credentials, keepalive,
	// connect timeout) when it dials Address. The agent dials one
	// connection per attempt and closes it when the stream ends.
	DialOptions []grpc.DialOption
	// Conn, when set, is used instead of dialling Address (and not
	// closed by the agent); TLS, DialOptions and Keepalive are then the
	// connection's business, and so is its connect backoff, which comes
	// on top of the agent's.
	Conn grpc.ClientConnInterface
	// Group is the data-plane group (the gateways sharing one Redis);
	// required.
	Group string
	// Tags select the APIs this data plane serves.
	Tags []string
	// Token is the data plane's secret; required.
	Token string
	// GatewayID names this gateway in its group; "" means
	// "<hostname>-<pid>". At most protocol.MaxGatewayIDBytes bytes of
	// UTF-8 without control characters (protocol.CheckGatewayID).
	GatewayID string
	// Version is sent in Hello, for operators; "" means "dev".
	Version string
	// Persister keeps the last applied configuration, to start from it
	// when the control plane cannot be reached; nil means none.
	Persister Persister
	// SaveDelay is how long changes gather before one save persists
	// them all (the latest configuration wins); 0 means
	// DefaultSaveDelay.
	SaveDelay time.Duration
	// ContactSaveInterval is how often, at most, the time of the last
	// contact with the control plane is persisted while connected (when
	// Persister is a ContactPersister; it is also saved when a stream
	// gains or loses the control plane, and when Run stops); 0 means
	// DefaultContactSaveInterval.
	ContactSaveInterval time.Duration
	// MaxStale is how long the data plane may be without its control
	// plane before OnStale applies; 0 means never. Staleness counts from
	// the last contact, which a ContactPersister carries over restarts:
	// a gateway started from the persisted configuration counts from the
	// persisted contact, not from its own start. While the stream is
	// open the control plane is in contact: one that stops answering
	// without closing the connection is noticed by Keepalive (Time, then
	// Timeout: 15 s by default), and staleness counts from then.
	MaxStale time.Duration
	// OnStale is what happens then; "" means StaleKeep.
	OnStale OnStale
	// StaleChanged, if set, is called with true when the data plane
	// becomes stale and false when the control plane answers again (for
	// logs and alerts). It is called from the agent's goroutines and
	// must not block.
	StaleChanged func(stale bool)
	// Backoff configures the reconnect delays.
	Backoff Backoff
	// Keepalive are the connection's keepalive pings; zero fields mean
	// DefaultKeepaliveTime and DefaultKeepaliveTimeout, and pings are
	// sent also without an open stream.
	Keepalive keepalive.ClientParameters
	// DigestInterval is how often the agent sends a DigestReport; 0
	// means DefaultDigestInterval.
	DigestInterval time.Duration
	// StartTimeout is how long Run waits for the control plane's first
	// configuration before it applies the persisted one; 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// Now is the wall clock of Status's times and of staleness; nil means
	// time.Now. Timers run on real time.
	Now func() time.Time
	// Logger receives the agent's log lines; nil means slog.Default().
	Logger *slog.Logger
}

// Status is what the agent reports about its link to the control plane
// (GET /readyz's "control_plane", the sync metrics).
type Status struct {
	// State is "connecting" (a stream is being opened or waits for the
	// control plane's first message), "connected" (the control plane
	// answered on the open stream), "disconnected" (waiting to
	// reconnect) or "refused" (the control plane refused this data
	// plane's credentials, codes.Unauthenticated or
	// codes.PermissionDenied, and has not accepted them since; the agent
	// keeps retrying, and the gateway is not ready: see NotReady).
	State string `json:"state"`
	// AppliedRevision is the revision the gateway runs (0: none).
	AppliedRevision uint64 `json:"applied_revision"`
	// Digest is protocol.Digest of the running configuration.
	Digest string `json:"digest"`
	// History names the control-plane history the running configuration
	// belongs to (its revision counts in it); "" when none is known.
	History string `json:"history"`
	// Source is where the running configuration came from:
	// "control_plane", "persisted" or "none".
	Source string `json:"source"`
	// LastContact is when the control plane was last heard from (nil:
	// never; the JSON member is then left out). While connected it is
	// now.
	LastContact *time.Time `json:"last_contact,omitempty"`
	// LastContact may come from the Persister (ContactPersister) when the
	// running configuration is the persisted one.
	//
	// Staleness is how long the data plane has been without its control
	// plane: 0 while connected, else the time since LastContact (since
	// Run started when there is none). StalenessSeconds is the same in
	// seconds, to the millisecond.
	Staleness        time.Duration `json:"-"`
	StalenessSeconds float64       `json:"staleness_seconds"`
	// Stale reports whether Staleness has passed MaxStale (never when
	// MaxStale is 0).
	Stale bool `json:"stale"`
	// LastError is the last stream failure (kept while not connected:
	// the control plane's answer clears it) or the last rejected delivery
	// (cleared by the next applied one); "" when none.
	LastError string `json:"last_error"`
	// PersistedRevision is the revision last saved by the Persister (or
	// loaded from it); 0 when none.
	PersistedRevision uint64 `json:"persisted_revision"`
	// Reconnects counts streams opened after the first.
	Reconnects uint64 `json:"reconnects"`
	// Deliveries counts deliveries by kind and outcome.
	Deliveries Deliveries `json:"deliveries"`
	// Address is the part of AgentOptions.Address the latest stream was
	// opened to (with several replicas: the one the agent is on, or
	// trying); "" before the first attempt and with AgentOptions.Conn.
	Address string `json:"address,omitempty"`
}

// NotReady returns why the gateway must not be taken as ready because of
// its control plane, or "" when nothing about the control plane stops
// it: while State is "refused", "not ready: the control plane refused
// this data plane's credentials: <the control plane's message>". The
// gateway's GET /readyz answers 503 with it (gateway.ControlPlaneStatus).
func (s Status) NotReady() string {
	if s.State != "refused" {
		return ""
	}
	return "not ready: " + strings.TrimPrefix(s.LastError, "dataplane: ")
}

// Deliveries counts the deliveries an agent applied or rejected.
type Deliveries struct {
	SnapshotsApplied  uint64 `json:"snapshots_applied"`
	SnapshotsRejected uint64 `json:"snapshots_rejected"`
	ChangesApplied    uint64 `json:"changes_applied"`
	ChangesRejected   uint64 `json:"changes_rejected"`
}

// Agent keeps a gateway in step with a control plane: it holds the sync
// stream (see the package documentation), applies what arrives, persists
// it, and starts from the persisted configuration when the control plane
// is away. Create it with New and run it with Run.
type Agent struct {
	o   AgentOptions
	g   Target
	log *slog.Logger
	// addrs are the parts of AgentOptions.Address, in order; next is
	// the index of the one the next attempt dials (connectLoop's only).
	addrs []string
	next  int

	// applyMu serialises every change the agent makes to the gateway
	// and to cur.
	applyMu sync.Mutex
	cur     running // guarded by applyMu; copied into st under mu

	// staleMu serialises changes of stale, which says whether OnStale
	// was acted on.
	staleMu sync.Mutex
	stale   bool

	mu       sync.Mutex
	st       Status
	started  time.Time // Run's start, for staleness before any contact
	running  bool
	applied  chan struct{} // closed at the first applied configuration
	saveNext chan struct{} // a save is wanted (capacity 1)
	// refused is the control plane's message when it refused the
	// credentials and has not answered since; "" otherwise.
	refused string
	// accepted is signalled (capacity 1) when a refusal ends.
	accepted chan struct{}
	// persistedHistory is the history of the configuration last persisted
	// or loaded (with Status.PersistedRevision).
	persistedHistory string
	// contactKick asks the contact saver to persist the last contact now
	// (capacity 1).
	contactKick chan struct{}
}

// running is the configuration the gateway runs, as the agent knows it.
type running struct {
	revision uint64
	digester protocol.Digester
	source   string
	// history is the control-plane history the configuration belongs
	// to ("" for none known).
	history string
}

// New checks opts and returns an Agent. It fails when Gateway is nil,
// neither Address nor Conn is set, a part of a comma-separated Address
// is empty or neither host:port nor a gRPC target whose scheme gRPC
// resolves, Group is not ValidGroup, Token is empty, or OnStale is
// unknown.
func New(opts AgentOptions) (*Agent, error) {
	switch {
	case opts.Target == nil:
		return nil, errors.New("dataplane: AgentOptions.Target is nil")
	case opts.Address == "" && opts.Conn == nil:
		return nil, errors.New("dataplane: AgentOptions.Address is empty")
	case opts.Group == "":
		return nil, errors.New("dataplane: AgentOptions.Group is empty")
	case !ValidGroup(opts.Group):
		return nil, fmt.Errorf("dataplane: AgentOptions.Group %q: want %s", opts.Group, GroupRule)
	case opts.Token == "":
		return nil, errors.New("dataplane: AgentOptions.Token is empty")
	}
	switch opts.OnStale {
	case "":
		opts.OnStale = StaleKeep
	case StaleKeep, StaleFailClosed:
	default:
		return nil, fmt.Errorf("dataplane: unknown OnStale %q (want keep or fail_closed)", opts.OnStale)
	}
	if opts.MaxStale < 0 {
		return nil, fmt.Errorf("dataplane: MaxStale %v is negative", opts.MaxStale)
	}
	addrs, err := splitAddresses(opts.Address)
	if err != nil && opts.Conn == nil {
		return nil, err
	}
	if opts.GatewayID == "" {
		host, _ := os.Hostname()
		opts.GatewayID = host + "-" + strconv.Itoa(os.Getpid())
	}
	if err := protocol.CheckGatewayID(opts.GatewayID); err != nil {
		return nil, fmt.Errorf("dataplane: AgentOptions.GatewayID: %w", err)
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.SaveDelay <= 0 {
		opts.SaveDelay = DefaultSaveDelay
	}
	if opts.ContactSaveInterval <= 0 {
		opts.ContactSaveInterval = DefaultContactSaveInterval
	}
	if opts.DigestInterval <= 0 {
		opts.DigestInterval = DefaultDigestInterval
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.Keepalive.Time <= 0 {
		opts.Keepalive.Time = DefaultKeepaliveTime
	}
	if opts.Keepalive.Timeout <= 0 {
		opts.Keepalive.Timeout = DefaultKeepaliveTimeout
	}
	b := &opts.Backoff
	if b.Initial <= 0 {
		b.Initial = DefaultBackoffInitial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoffMax
	}
	if b.Multiplier <= 0 {
		b.Multiplier = DefaultBackoffMultiplier
	}
	switch {
	case b.Jitter == 0:
		b.Jitter = DefaultBackoffJitter
	case b.Jitter < 0:
		b.Jitter = 0
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	a := &Agent{o: opts, g: opts.Target, log: opts.Logger.With("component", "dataplane", "group", opts.Group),
		applied: make(chan struct{}), saveNext: make(chan struct{}, 1), accepted: make(chan struct{}, 1), contactKick: make(chan struct{}, 1)}
	a.cur.source = "none"
	a.st = Status{State: "connecting", Source: "none", Digest: protocol.Digest(nil)}
	a.addrs = addrs
	if len(addrs) > 1 {
		a.next = rand.IntN(len(addrs))
	}
	return a, nil
}

// GroupRule says what ValidGroup accepts, for error messages.
const GroupRule = `1 to 128 characters without spaces, control characters, "{" or "}" (it names a Cluster hash tag)`

// ValidGroup reports whether g may name a data-plane group: 1 to 128
// bytes, none of them a space, a control character (below 0x20, and
// 0x7f), '{' or '}'. A group names the hash tag of its Redis keys (the
// persisted configuration, the DRL's, global quotas'), where a brace
// would move the tag, and appears in log lines and metrics.
func ValidGroup(g string) bool {
	if len(g) == 0 || len(g) > 128 {
		return false
	}
	for i := 0; i < len(g); i++ {
		if c := g[i]; c <= ' ' || c == 0x7f || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// splitAddresses returns the parts of a comma-separated Address, spaces
// around them trimmed; it fails on an empty part, and on a host:port part
// with no host or with port 0 (which names no server to connect to).
func splitAddresses(address string) ([]string, error) {
	parts := strings.Split(address, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
		if parts[i] == "" {
			return nil, fmt.Errorf("dataplane: AgentOptions.Address %q: part %d is empty (want host:port, or host:port,host:port,…)", address, i+1)
		}
		host, port, err := net.SplitHostPort(parts[i])
		switch {
		case err != nil:
			// Other gRPC targets (unix:…, dns:///…) are left to the dial
			// when gRPC has a resolver for their scheme; anything else
			// would be retried forever for a typo.
			if scheme, _, ok := strings.Cut(parts[i], ":"); !ok || resolver.Get(scheme) == nil {
				return nil, fmt.Errorf("dataplane: AgentOptions.Address %q: part %d, %q: %w (want host:port, or a gRPC target such as unix:///path or dns:///host:port)", address, i+1, parts[i], err)
			}
		case host == "":
			return nil, fmt.Errorf("dataplane: AgentOptions.Address %q: part %d, %q, names no host (want host:port, like cp.example:7071)", address, i+1, parts[i])
		case port == "0":
			return nil, fmt.Errorf("dataplane: AgentOptions.Address %q: part %d, %q, has port 0, which names no server (want a port from 1 to 65535)", address, i+1, parts[i])
		}
	}
	return parts, nil
}

// GatewayID returns the gateway's id as sent in Hello.
func (a *Agent) GatewayID() string { return a.o.GatewayID }

// Status returns the agent's state now. Safe for concurrent use.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.statusLocked(a.o.Now())
}

func (a *Agent) statusLocked(now time.Time) Status {
	s := a.st
	if s.State == "connected" {
		s.LastContact, s.Staleness = &now, 0
	} else {
		since := a.started
		if s.LastContact != nil {
			lc := *s.LastContact
			s.LastContact, since = &lc, lc
		}
		if !since.IsZero() && now.After(since) {
			s.Staleness = now.Sub(since)
		}
	}
	s.StalenessSeconds = s.Staleness.Round(time.Millisecond).Seconds() // no float noise in /readyz
	s.Stale = a.o.MaxStale > 0 && s.Staleness >= a.o.MaxStale && s.State != "connected"
	if a.refused != "" && s.State != "connected" {
		s.State = "refused"
	}
	return s
}

// Run runs the agent until ctx is done: it connects, applies what the
// control plane sends, reconnects with backoff when the stream ends,
// persists each applied configuration in the background, applies the
// persisted one when nothing came within StartTimeout, and enforces
// OnStale. It returns nil once ctx is done and every goroutine it started
// has ended. It fails at once when called a second time or when a part
// of Address cannot be dialled (a malformed target; an unreachable
// control plane is retried, never an error).
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return errors.New("dataplane: Run called twice")
	}
	a.running = true
	a.started = a.o.Now()
	a.mu.Unlock()

	connect := func() (grpc.ClientConnInterface, func(), error) { return a.o.Conn, func() {}, nil }
	if a.o.Conn == nil {
		// A malformed target fails now; each attempt dials anew.
		if err := a.checkAddresses(); err != nil {
			return err
		}
		connect = func() (grpc.ClientConnInterface, func(), error) {
			// One address per attempt, the next one each time: a lost
			// replica is left for another.
			addr := a.addrs[a.next]
			a.next = (a.next + 1) % len(a.addrs)
			a.mu.Lock()
			a.st.Address = addr
			a.mu.Unlock()
			cc, err := a.dial(addr)
			if err != nil {
				return nil, nil, err
			}
			return cc, func() { cc.Close() }, nil
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	if a.o.Persister != nil {
		wg.Go(func() { a.saver(ctx) })
	}
	if cp, ok := a.o.Persister.(ContactPersister); ok {
		wg.Go(func() { a.contactSaver(ctx, cp) })
	}
	wg.Go(func() { a.startFallback(ctx) })
	if a.o.MaxStale > 0 {
		wg.Go(func() { a.watchStale(ctx) })
	}
	a.connectLoop(ctx, connect)
	return nil
}

// checkAddresses fails when a part of Address is not a target gRPC can
// dial (it connects to none).
func (a *Agent) checkAddresses() error {
	for _, addr := range a.addrs {
		cc, err := a.dial(addr)
		if err != nil {
			return err
		}
		cc.Close()
	}
	return nil
}

// pickFirstShuffled is the connection's service config: a target that
// resolves to several addresses (a DNS name with several records) is
// tried in a random order, so gateways spread over its replicas and a
// lost one is not always tried first.
const pickFirstShuffled = `{"loadBalancingConfig":[{"pick_first":{"shuffleAddressList":true}}]}`

// dial makes the client connection to addr, one part of Address.
func (a *Agent) dial(addr string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if a.o.TLS != nil {
		creds = credentials.NewTLS(a.o.TLS)
	}
	ka := a.o.Keepalive
	ka.PermitWithoutStream = true
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(ka),
		// A connection serves one attempt (see connectLoop), so gRPC's
		// redial backoff never runs in practice; bounded like the
		// agent's all the same.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoffConfig(a.o.Backoff),
			// A dial to a dead address fails at its own pace; this
			// bounds a hanging one.
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultServiceConfig(pickFirstShuffled),
	}
	opts = append(opts, a.o.DialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dataplane: dial %s: %w", addr, err)
	}
	return cc, nil
}

// newBackOff returns the reconnect backoff.
func (a *Agent) newBackOff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = a.o.Backoff.Initial
	b.MaxInterval = a.o.Backoff.Max
	b.Multiplier = a.o.Backoff.Multiplier
	b.RandomizationFactor = a.o.Backoff.Jitter
	b.Reset()
	return b
}

// cappedBackOff caps an ExponentialBackOff's delays after jitter, so that
// Backoff.Max is the longest wait (the library caps before jitter).
type cappedBackOff struct {
	*backoff.ExponentialBackOff
	max time.Duration
}

func (c cappedBackOff) NextBackOff() time.Duration {
	return min(c.ExponentialBackOff.NextBackOff(), c.max)
}

// refusal returns the control plane's message when err says it refused
// the data plane's credentials (codes.Unauthenticated or
// codes.PermissionDenied).
func refusal(err error) (string, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return "", false
	}
	st := se.GRPCStatus()
	if c := st.Code(); c != codes.Unauthenticated && c != codes.PermissionDenied {
		return "", false
	}
	return st.Message(), true
}

// reconnectLogInterval is how often, at most, the agent logs attempts to
// reach the control plane that got no answer, after the first.
const reconnectLogInterval = 30 * time.Second

// connectLoop opens streams one after another until ctx is done, waiting
// a backoff delay after each stream that ends without the control plane
// having answered (and a reset delay after one where it had). Each
// attempt gets its connection from connect and releases it when its
// stream ends: a dialled connection left in gRPC's transient failure
// would wait out gRPC's own backoff after the agent's (a gateway came
// back 16 s after a 15 s outage), while a fresh one dials at once.
//
// A stream that ends after the control plane answered is logged (WARN)
// each time; attempts that get no answer (a control plane down for a
// while, retried every second) are each logged at DEBUG, and at WARN as
// failurelog does it: the first at once, then one line each
// reconnectLogInterval with their count, the last of a run when the
// control plane answers (before "connected"), never after it.
func (a *Agent) connectLoop(ctx context.Context, connect func() (grpc.ClientConnInterface, func(), error)) {
	bo := cappedBackOff{a.newBackOff(), a.o.Backoff.Max}
	unanswered := failurelog.New(a.log, failurelog.Options{
		Msg:      "dataplane: no answer from the control plane; reconnecting with backoff",
		Attrs:    []any{"backoff_max", a.o.Backoff.Max},
		Interval: reconnectLogInterval,
	})
	defer unanswered.Close()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			a.mu.Lock()
			a.st.Reconnects++
			a.mu.Unlock()
		}
		a.setState("connecting")
		var answered bool
		conn, release, err := connect()
		if err == nil {
			answered, err = a.session(ctx, conn, unanswered.Recovered)
			release()
		}
		if ctx.Err() != nil {
			a.disconnected(nil) // records the last contact when connected
			return
		}
		if answered {
			bo.Reset()
		}
		delay := bo.NextBackOff()
		if msg, ok := refusal(err); ok {
			if a.refuse(msg) {
				a.log.Error("dataplane: the control plane refused this data plane's credentials; this data-plane member is not ready (a running configuration keeps serving); retrying with backoff",
					"err", err, "in", delay)
			}
		} else {
			a.disconnected(err)
			if answered {
				a.log.Warn("dataplane: sync stream ended; reconnecting", "err", err, "in", delay)
			} else {
				a.log.Debug("dataplane: sync stream ended; reconnecting", "err", err, "in", delay)
				unanswered.Failed(err)
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// setState sets Status.State.
func (a *Agent) setState(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st.State = s
}

// disconnected records the end of a stream.
func (a *Agent) disconnected(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.st.State == "connected" {
		now := a.o.Now()
		a.st.LastContact = &now
	}
	a.st.State = "disconnected"
	if err != nil {
		a.st.LastError = err.Error()
	}
	a.kickContact()
}

// kickContact asks the contact saver to persist the last contact now.
func (a *Agent) kickContact() {
	select {
	case a.contactKick <- struct{}{}:
	default:
	}
}

// contactSaver persists the last contact (Status.LastContact) when kicked
// and every ContactSaveInterval while it changes, and once more when ctx
// is done. Failures are logged once per streak.
func (a *Agent) contactSaver(ctx context.Context, cp ContactPersister) {
	var saved time.Time
	failing := false
	save := func(ctx context.Context) {
		lc := a.Status().LastContact
		if lc == nil || !lc.After(saved) {
			return
		}
		if err := cp.SaveContact(ctx, *lc); err != nil {
			if !failing && ctx.Err() == nil {
				a.log.Error("dataplane: persist the last contact with the control plane", "err", err)
			}
			failing = true
			return
		}
		failing, saved = false, *lc
	}
	t := time.NewTicker(a.o.ContactSaveInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), finalSaveTimeout)
			save(fctx)
			cancel()
			return
		case <-a.contactKick:
		case <-t.C:
		}
		save(ctx)
	}
}

// refuse records that the control plane refused the credentials with
// msg; it reports whether that is news (not refused before, or refused
// with another message), to log it once per change.
func (a *Agent) refuse(msg string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.st.State == "connected" {
		now := a.o.Now()
		a.st.LastContact = &now
	}
	a.st.State = "disconnected"
	a.st.LastError = "dataplane: the control plane refused this data plane's credentials: " + msg
	a.kickContact()
	news := a.refused != msg
	a.refused = msg
	return news
}

// contact records that the control plane answered on the open stream; it
// lifts a fail-closed gateway.
func (a *Agent) contact() {
	a.mu.Lock()
	now := a.o.Now()
	a.st.State = "connected"
	a.st.LastContact = &now
	a.st.LastError = ""
	wasRefused := a.refused != ""
	a.refused = ""
	a.mu.Unlock()
	a.kickContact()
	if wasRefused {
		a.log.Info("dataplane: the control plane accepts this data plane's credentials again")
		select {
		case a.accepted <- struct{}{}:
		default:
		}
	}
	a.setStale(false)
}

// isRefused reports whether the control plane refused the credentials
// and has not answered since.
func (a *Agent) isRefused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused != ""
}

// watchStale checks staleness until ctx is done.
func (a *Agent) watchStale(ctx context.Context) {
	every := min(max(a.o.MaxStale/10, 10*time.Millisecond), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.setStale(a.Status().Stale)
	}
}

// setStale acts on OnStale when staleness changes to stale.
func (a *Agent) setStale(stale bool) {
	a.staleMu.Lock()
	defer a.staleMu.Unlock()
	if a.stale == stale {
		return
	}
	a.stale = stale
	if stale {
		a.log.Warn("dataplane: no contact with the control plane for max_stale", "max_stale", a.o.MaxStale, "on_stale", string(a.o.OnStale))
		if a.o.OnStale == StaleFailClosed {
			a.g.SetUnavailable(fmt.Sprintf("dataplane: no contact with the control plane for over %v; failing closed (on_stale: fail_closed)", a.o.MaxStale))
		}
	} else {
		a.log.Info("dataplane: the control plane answers again")
		if a.o.OnStale == StaleFailClosed {
			a.g.SetUnavailable("")
		}
	}
	if a.o.StaleChanged != nil {
		a.o.StaleChanged(stale)
	}
}

// startFallback applies the persisted configuration when nothing was
// applied within StartTimeout.
func (a *Agent) startFallback(ctx context.Context) {
	if a.o.Persister == nil {
		return
	}
	t := time.NewTimer(a.o.StartTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-a.applied:
		return
	case <-t.C:
	}
	// A refusal is an answer: the control plane is there and does not
	// want this data plane, so its persisted configuration is not
	// enforced until the control plane accepts the credentials.
	for a.isRefused() {
		a.log.Warn("dataplane: the control plane refused this data plane's credentials; not enforcing the persisted configuration")
		select {
		case <-ctx.Done():
			return
		case <-a.applied:
			return
		case <-a.accepted:
		}
	}
	var snap *spec.Snapshot
	var history string
	var err error
	if hp, ok := a.o.Persister.(HistoryPersister); ok {
		snap, history, err = hp.LoadHistory(ctx)
	} else {
		snap, err = a.o.Persister.Load(ctx)
	}
	if err != nil {
		a.log.Error("dataplane: load the persisted configuration", "err", err)
		return
	}
	if snap == nil {
		a.log.Warn("dataplane: the control plane did not answer in time and no configuration is persisted; every request answers 503 until it does", "start_timeout", a.o.StartTimeout)
		return
	}
	var contact time.Time
	if cp, ok := a.o.Persister.(ContactPersister); ok {
		if contact, err = cp.LoadContact(ctx); err != nil {
			a.log.Error("dataplane: load the persisted last contact; staleness counts from the start", "err", err)
		}
	}
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if a.cur.source != "none" {
		return // the control plane answered meanwhile
	}
	if !contact.IsZero() {
		// Staleness counts from the persisted contact: a gateway
		// restarted during a long outage gets no fresh max_stale.
		a.mu.Lock()
		if a.st.LastContact == nil {
			a.st.LastContact = &contact
		}
		a.mu.Unlock()
		if a.o.MaxStale > 0 {
			a.setStale(a.Status().Stale) // fail closed before serving
		}
	}
	dg := protocol.DigesterOf(snap)
	if err := a.g.ApplyPartial(ctx, snap); err != nil {
		a.log.Error("dataplane: the persisted configuration is refused", "revision", snap.Revision, "err", err)
		return
	}
	a.setRunning(running{revision: snap.Revision, digester: dg, source: "persisted", history: history})
	a.mu.Lock()
	a.st.PersistedRevision, a.persistedHistory = snap.Revision, history
	a.mu.Unlock()
	a.log.Warn("dataplane: the control plane did not answer in time; enforcing the persisted configuration",
		"revision", snap.Revision, "start_timeout", a.o.StartTimeout)
}

// setRunning records what the gateway runs now; applyMu is held.
func (a *Agent) setRunning(r running) {
	first := a.cur.source == "none"
	a.cur = r
	a.mu.Lock()
	a.st.AppliedRevision, a.st.Digest, a.st.Source, a.st.History = r.revision, r.digester.Digest(), r.source, r.history
	a.mu.Unlock()
	if first {
		close(a.applied)
	}
}

// current returns the revision, digest and history the gateway runs.
func (a *Agent) current() (uint64, string, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st.AppliedRevision, a.st.Digest, a.st.History
}
