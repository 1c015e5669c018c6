package identity

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// JWKS defaults.
const (
	// DefaultJWKSRefresh is how often a JWKS is fetched again.
	DefaultJWKSRefresh = time.Hour
	// DefaultJWKSUnknownKIDRefresh is the shortest time between fetches
	// caused by tokens naming a kid the cached set lacks.
	DefaultJWKSUnknownKIDRefresh = 5 * time.Minute
	// DefaultJWKSTimeout bounds one fetch.
	DefaultJWKSTimeout = 10 * time.Second
	// DefaultJWKSMaxBytes bounds a JWKS response body.
	DefaultJWKSMaxBytes = 1 << 20
)

// JWKSOptions configure a JWKS. Only URL is required.
type JWKSOptions struct {
	// URL is the JWK Set document (RFC 7517 §5), e.g. an OpenID
	// provider's jwks_uri. It must be https, or http to a loopback host
	// (or anywhere with AllowInsecureHTTP).
	URL string
	// AllowInsecureHTTP allows a plain-http URL to a non-loopback host,
	// for identity providers reachable only inside a trusted network.
	AllowInsecureHTTP bool
	// RefreshInterval is how often the set is fetched again; default
	// DefaultJWKSRefresh (1h). Keys missing from a fetched set are
	// dropped, so a revoked key stops working at the next fetch.
	RefreshInterval time.Duration
	// UnknownKIDRefresh is the shortest time between fetches triggered by
	// a token naming an unknown kid (so a rotated-in key works at once,
	// but random kids cannot make the gateway hammer the provider);
	// default DefaultJWKSUnknownKIDRefresh (5m); negative disables such
	// fetches. The request that triggers a fetch waits for it; others
	// naming unknown kids meanwhile are refused. Providers publish a key
	// before signing with it, so RefreshInterval normally has it first.
	UnknownKIDRefresh time.Duration
	// Timeout bounds each fetch; default DefaultJWKSTimeout (10s).
	Timeout time.Duration
	// MaxBytes bounds a response body; default DefaultJWKSMaxBytes (1 MiB).
	MaxBytes int64
	// Client makes the requests; default a client that follows no
	// redirects. Its transport is wrapped to enforce MaxBytes.
	Client *http.Client
	// AllowStartWithoutKeys makes NewJWKS succeed even when the first
	// fetch fails (tokens are refused until a later fetch succeeds). By
	// default a failed first fetch is an error.
	AllowStartWithoutKeys bool
	// OnError, if set, receives every failed fetch (for logs and
	// metrics), except a fetch cut short because the JWKS is stopping
	// (Close, or the end of the context given to NewJWKS): a clean
	// shutdown reports nothing. It must be safe for concurrent use.
	OnError func(error)

	// fetchFailed, when set, is called after each failed fetch has been
	// handled (reported to OnError or dropped): a test seam.
	fetchFailed func()
}

// JWKS is a remote JSON Web Key Set, cached in memory and refreshed in the
// background with github.com/MicahParks/keyfunc/v3 (storage by
// github.com/MicahParks/jwkset). Use it as JWTOptions.JWKS.
//
// Its one background goroutine runs until the context given to NewJWKS is
// done or Close is called. Only keys whose "use" is "sig" or absent are
// used; symmetric ("oct") keys are never used, since a key published in a
// JWKS is public.
type JWKS struct {
	kf     keyfunc.Keyfunc
	store  jwkset.Storage
	cancel context.CancelFunc
}

// NewJWKS fetches o.URL and starts refreshing it until ctx is done or
// Close is called. Errors: a bad URL or options, or (unless
// AllowStartWithoutKeys) a failed first fetch.
func NewJWKS(ctx context.Context, o JWKSOptions) (*JWKS, error) {
	u, err := url.Parse(o.URL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("identity: JWKS URL %q: want an absolute https URL", o.URL)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && (o.AllowInsecureHTTP || IsLoopbackHost(u.Hostname())):
	default:
		return nil, fmt.Errorf("identity: JWKS URL %q: want https (or AllowInsecureHTTP)", o.URL)
	}
	if o.RefreshInterval == 0 {
		o.RefreshInterval = DefaultJWKSRefresh
	}
	if o.UnknownKIDRefresh == 0 {
		o.UnknownKIDRefresh = DefaultJWKSUnknownKIDRefresh
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultJWKSTimeout
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultJWKSMaxBytes
	}
	if o.RefreshInterval < 0 || o.Timeout < 0 || o.MaxBytes < 0 {
		return nil, errors.New("identity: JWKS: negative RefreshInterval, Timeout or MaxBytes")
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if o.Client != nil {
		c := *o.Client
		client = &c
	}
	client.Transport = maxBytesTransport{rt: client.Transport, max: o.MaxBytes}

	ctx, cancel := context.WithCancel(ctx)
	var onErr func(context.Context, error)
	if o.OnError != nil || o.fetchFailed != nil {
		// jwkset passes the fetch's own context, already cancelled, so the
		// JWKS's context tells a shutdown from a failure.
		onErr = func(_ context.Context, err error) {
			if ctx.Err() == nil && o.OnError != nil {
				o.OnError(fmt.Errorf("identity: JWKS %s: %w", o.URL, err))
			}
			if o.fetchFailed != nil {
				o.fetchFailed()
			}
		}
	}
	// jwkset starts its refresh goroutine before the first fetch; every
	// failure path below cancels ctx to end it.
	st, err := jwkset.NewStorageFromHTTP(o.URL, jwkset.HTTPClientStorageOptions{
		Client:                    client,
		Ctx:                       ctx,
		HTTPTimeout:               o.Timeout,
		NoErrorReturnFirstHTTPReq: o.AllowStartWithoutKeys,
		RefreshErrorHandler:       onErr,
		RefreshInterval:           o.RefreshInterval,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("identity: JWKS %s: %w", o.URL, err)
	}
	var limiter *rate.Limiter
	if o.UnknownKIDRefresh > 0 {
		limiter = rate.NewLimiter(rate.Every(o.UnknownKIDRefresh), 1)
	}
	store, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
		HTTPURLs:          map[string]jwkset.Storage{o.URL: st},
		RateLimitWaitMax:  o.Timeout,
		RefreshUnknownKID: limiter,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("identity: JWKS %s: %w", o.URL, err)
	}
	kf, err := keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: store, UseWhitelist: []jwkset.USE{jwkset.UseSig, ""}})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("identity: JWKS %s: %w", o.URL, err)
	}
	return &JWKS{kf: kf, store: store, cancel: cancel}, nil
}

// Close stops the background refresh. Keys already cached stay usable.
func (s *JWKS) Close() { s.cancel() }

// Len returns the number of keys cached (for tests and metrics).
func (s *JWKS) Len(ctx context.Context) int {
	all, err := s.store.KeyReadAll(ctx)
	if err != nil {
		return 0
	}
	return len(all)
}

// key returns the key for t: the one its kid names (fetching the set again,
// rate-limited, when the kid is unknown), or, for a token without kid, the
// set's only key. Symmetric keys are refused.
func (s *JWKS) key(ctx context.Context, t *jwt.Token, hasKID bool) (any, error) {
	k, err := s.kf.KeyfuncCtx(ctx)(t)
	if err != nil {
		return nil, err
	}
	if !hasKID {
		set, ok := k.(jwt.VerificationKeySet)
		if !ok || len(set.Keys) != 1 {
			return nil, errors.New("token names no kid and the key set does not have exactly one key")
		}
		k = set.Keys[0]
	}
	if _, sym := k.([]byte); sym {
		return nil, errors.New("symmetric key in a JWKS")
	}
	return k, nil
}

// IsLoopbackHost reports whether host, a URL's Hostname() (no port, no
// brackets), is "localhost" or a loopback IP address (127.0.0.0/8, ::1):
// the hosts a plain-http JWKS URL may name without AllowInsecureHTTP.
// Other names are not resolved, so they report false.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// maxBytesTransport fails reading a response body past max bytes.
type maxBytesTransport struct {
	rt  http.RoundTripper
	max int64
}

// RoundTrip implements http.RoundTripper.
func (t maxBytesTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt := t.rt
	if rt == nil {
		rt = http.DefaultTransport
	}
	resp, err := rt.RoundTrip(r)
	if err == nil {
		resp.Body = http.MaxBytesReader(nil, resp.Body, t.max)
	}
	return resp, err
}
