package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/examples/gateway/config"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/metrics"
)

// gateway routes each request to the API with the longest matching listen
// path, through that API's rate-limit middleware, to its upstream.
type gateway struct {
	routes    []route // longest listen path first
	closers   []func() error
	transport *http.Transport
	// metrics counts store failures (store_errors_total); it is not
	// exposed yet.
	metrics *metrics.Collector
}

type route struct {
	prefix string // the listen path without its final slash: "" for "/"
	api    config.API
	h      http.Handler
}

// newGateway wires cfg: one store, engine and key registry for every API,
// and per API its authenticator and the nethttp middleware in front of a
// reverse proxy or the echo upstream. ctx is the gateway's lifetime: JWKS
// refreshes run until it is done. Close releases what it started.
func newGateway(ctx context.Context, cfg *config.Config, e env, log *slog.Logger) (_ *gateway, err error) {
	g := &gateway{transport: newTransport(), metrics: metrics.New(metrics.Options{})}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	store, err := g.openStore(ctx, cfg, e, log)
	if err != nil {
		return nil, err
	}
	// Under a Redis outage every request fails: the metric counts each
	// failure, the log gets a line per interval.
	failures := newFailureLog(log, failureLogOptions{Msg: "limit store failed", AfterFunc: e.afterFunc})
	g.closers = append(g.closers, failures.Close)
	opts := core.Options{
		FailurePolicy: cfg.FailurePolicy,
		StoreTimeout:  cfg.StoreTimeout,
		Shadow:        cfg.Shadow,
		OnStoreError: func(err error) {
			g.metrics.ObserveStoreError(err)
			failures.Failed(err)
		},
	}
	if cfg.FailurePolicy == core.FailFallback {
		fb := memory.New(memory.Options{Clock: e.clock, SweepInterval: time.Minute, MaxKeys: cfg.Memory.MaxKeys})
		g.closers = append(g.closers, fb.Close)
		opts.Fallback = windowsAsGCRA{mem: fb}
	}
	engine, err := core.NewEngine(store, core.Config{Policies: cfg.Policies}, opts)
	if err != nil {
		return nil, err
	}
	keys, err := identity.NewKeys(cfg.Keys)
	if err != nil {
		return nil, err
	}
	apiKey := identity.NewAPIKey(keys, identity.APIKeyOptions{Now: e.now})
	clientIP, err := identity.NewClientIP(cfg.ClientIP)
	if err != nil {
		return nil, err
	}
	ro := cfg.Response
	ro.Now = e.now
	rend := response.NewRenderer(ro)

	for _, a := range cfg.APIs {
		var up http.Handler
		if a.Target.URL != nil {
			up = newProxy(a, g.transport, cfg.ClientIP.TrustedProxies, log)
		} else {
			up = echo(a.ID)
		}
		prefix := strings.TrimSuffix(a.ListenPath, "/")
		if a.StripListenPath {
			up = stripPrefix(prefix, up)
		}
		var auth identity.Authenticator = apiKey
		sources := apiKey.Sources()
		switch a.Auth {
		case config.AuthKeyless:
			auth, sources = &keylessAPI{api: a.ID, k: identity.Keyless{Policies: a.Policies, ClientIP: clientIP}}, nil
		case config.AuthJWT:
			j, err := g.newJWT(ctx, a, e, log)
			if err != nil {
				return nil, err
			}
			auth, sources = j, j.Sources()
		}
		if a.StripAuthData {
			up = stripCredentials(sources, up)
		}
		if a.FailureLimit != "" {
			auth = &identity.FailureLimited{Auth: auth, Limiter: engine, Policy: a.FailureLimit, ClientIP: clientIP}
		}
		h := nethttp.Middleware(engine, auth, nethttp.Options{API: a.ID, Renderer: rend})(up)
		g.routes = append(g.routes, route{prefix: prefix, api: a, h: h})
	}
	slices.SortStableFunc(g.routes, func(a, b route) int { return len(b.prefix) - len(a.prefix) })
	return g, nil
}

// newJWT returns a jwt API's authenticator. A key set fetched from a URL
// is fetched once now (the gateway does not start without it) and then
// refreshed in the background until ctx is done or the gateway closes.
func (g *gateway) newJWT(ctx context.Context, a config.API, e env, log *slog.Logger) (*identity.JWT, error) {
	o := *a.JWT
	o.Now = e.now
	if a.JWKS != nil {
		jo := *a.JWKS
		jo.OnError = func(err error) { log.Warn("JWKS refresh failed", "api", a.ID, "err", err) }
		jwks, err := identity.NewJWKS(ctx, jo)
		if err != nil {
			return nil, fmt.Errorf("API %q: %w", a.ID, err)
		}
		g.closers = append(g.closers, func() error { jwks.Close(); return nil })
		o.JWKS = jwks
	}
	j, err := identity.NewJWT(o)
	if err != nil {
		return nil, fmt.Errorf("API %q: %w", a.ID, err)
	}
	return j, nil
}

// Close stops the JWKS refreshes and the stores' goroutines, closes the
// Redis client, and drops idle upstream connections. It is called once,
// after the server has shut down.
func (g *gateway) Close() error {
	var errs []error
	for i := len(g.closers) - 1; i >= 0; i-- {
		errs = append(errs, g.closers[i]())
	}
	g.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// errReloadUnsupported is what reload answers until the gateway can
// reload its configuration.
var errReloadUnsupported = errors.New("reloading the configuration is not supported yet; restart the gateway to apply a changed file")

// reload is called on each reload request (SIGHUP) while the gateway
// serves. It is where a configuration reload will go; for now it changes
// nothing (counters, routes and keys stay as they are) and returns
// errReloadUnsupported.
func (g *gateway) reload(context.Context) error { return errReloadUnsupported }

// allowedMethods is the Allow field of the gateway's 405 answer: it
// forwards any method but CONNECT; these are the ones it advertises.
const allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

// ServeHTTP routes r by the longest listen path that matches its path.
// Requests net/http passes on that no route can take are answered here,
// in JSON like every other answer of the gateway's own.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		// A reverse proxy opens no tunnels.
		w.Header().Set("Allow", allowedMethods)
		writeError(w, http.StatusMethodNotAllowed, "method CONNECT is not allowed")
		return
	}
	p := r.URL.Path
	if p != "" && p[0] != '/' {
		// "GET *": net/http answers only OPTIONS * itself.
		writeError(w, http.StatusBadRequest, "request target must be a path starting with /")
		return
	}
	if c := cleanPath(p); c != p {
		// "/open/../echo/x" must not reach the open API's upstream, which
		// might resolve it to a path the echo API protects: send the
		// client to the clean path, whose route decides.
		u := url.URL{Path: c, RawQuery: r.URL.RawQuery}
		w.Header().Set("Location", u.String())
		writeError(w, http.StatusPermanentRedirect, "request path is not clean; use "+c)
		return
	}
	for i := range g.routes {
		rt := &g.routes[i]
		// prefix "/echo" matches "/echo" and "/echo/...", not "/echoes".
		if strings.HasPrefix(p, rt.prefix) && (len(p) == len(rt.prefix) || p[len(rt.prefix)] == '/') {
			rt.h.ServeHTTP(w, r)
			return
		}
	}
	writeError(w, http.StatusNotFound, "no API is served at this path")
}

// cleanPath is path.Clean that keeps a final slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// stripPrefix removes prefix (a listen path without its final slash) from
// the request path: "/echo/a" becomes "/a", "/echo" becomes "/".
func stripPrefix(prefix string, h http.Handler) http.Handler {
	if prefix == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		r2.URL = &u
		u.Path = orSlash(strings.TrimPrefix(r.URL.Path, prefix))
		if r.URL.RawPath != "" {
			if rest, ok := strings.CutPrefix(r.URL.RawPath, prefix); ok {
				u.RawPath = orSlash(rest)
			} else {
				u.RawPath = "" // prefix spelled with escapes: re-escape Path
			}
		}
		h.ServeHTTP(w, r2)
	})
}

// dropParam returns the raw query without the parameters named name
// (compared after unescaping, as url.ParseQuery reads them), and whether
// there were any.
func dropParam(raw, name string) (string, bool) {
	if raw == "" {
		return raw, false
	}
	pairs := strings.Split(raw, "&")
	kept := pairs[:0]
	for _, p := range pairs {
		if k, _, _ := strings.Cut(p, "="); unescapeParam(k) != name {
			kept = append(kept, p)
		}
	}
	if len(kept) == len(pairs) {
		return raw, false
	}
	return strings.Join(kept, "&"), true
}

// dropCookie returns the Cookie field lines without the cookies named
// name (lines left empty are dropped), and whether there were any.
func dropCookie(lines []string, name string) ([]string, bool) {
	var out []string
	found := false
	for _, l := range lines {
		var kept []string
		for _, c := range strings.Split(l, ";") {
			if n, _, _ := strings.Cut(strings.TrimSpace(c), "="); n == name {
				found = true
			} else if strings.TrimSpace(c) != "" {
				kept = append(kept, strings.TrimSpace(c))
			}
		}
		if len(kept) > 0 {
			out = append(out, strings.Join(kept, "; "))
		}
	}
	return out, found
}

func orSlash(s string) string {
	if s == "" {
		return "/"
	}
	return s
}

// stripCredentials removes every place sources name from a request before
// h sees it: those header fields, those query parameters (the rest of the
// query is passed on as sent) and those cookies (other cookies stay). It
// runs after authentication, which has read the credential.
func stripCredentials(sources []identity.Source, h http.Handler) http.Handler {
	if len(sources) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A handler must not modify the request it is given: r2 is a
		// shallow copy, whose Header and URL are copied before a change.
		r2 := *r
		cloned := false
		for _, s := range sources {
			switch s.In {
			case identity.InHeader:
				if _, ok := r2.Header[http.CanonicalHeaderKey(s.Name)]; ok {
					if !cloned {
						r2.Header, cloned = r.Header.Clone(), true
					}
					r2.Header.Del(s.Name)
				}
			case identity.InQuery:
				if q, ok := dropParam(r2.URL.RawQuery, s.Name); ok {
					u := *r2.URL
					u.RawQuery = q
					r2.URL = &u
				}
			case identity.InCookie:
				if lines, ok := dropCookie(r2.Header["Cookie"], s.Name); ok {
					if !cloned {
						r2.Header, cloned = r.Header.Clone(), true
					}
					if len(lines) == 0 {
						r2.Header.Del("Cookie")
					} else {
						r2.Header["Cookie"] = lines
					}
				}
			}
		}
		h.ServeHTTP(w, &r2)
	})
}

// newProxy returns a reverse proxy to a's URL target. The request path
// (already stripped) is joined to the target's path; the Host header
// becomes the target's; X-Forwarded-For, -Host and -Proto are set afresh
// from the peer, except that a trusted proxy's X-Forwarded-For chain is
// kept and the proxy's address appended.
func newProxy(a config.API, t http.RoundTripper, trusted []netip.Prefix, log *slog.Logger) http.Handler {
	target := a.Target.URL
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 && fromTrusted(pr.In, trusted) {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			pr.SetXForwarded()
		},
		Transport: t,
		ErrorLog:  slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return // the client went away
			}
			log.Warn("upstream failed", "api", a.ID, "target", target.String(), "err", err)
			writeError(w, http.StatusBadGateway, "upstream unavailable")
		},
	}
}

// fromTrusted reports whether r's peer is in trusted.
func fromTrusted(r *http.Request, trusted []netip.Prefix) bool {
	if len(trusted) == 0 {
		return false
	}
	a, err := identity.PeerAddr(nethttp.Request{R: r})
	if err != nil {
		return false
	}
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// newTransport is http.DefaultTransport with enough idle connections per
// upstream for a busy gateway (the default keeps 2).
func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	return t
}

// keylessAPI identifies the callers of one keyless API by client IP. Each
// address gets counters of its own on this API: two keyless APIs with the
// same policy limit a client separately.
type keylessAPI struct {
	api string
	k   identity.Keyless
}

// Authenticate implements identity.Authenticator.
func (k *keylessAPI) Authenticate(ctx context.Context, r identity.Request) (*core.Consumer, error) {
	c, err := k.k.Authenticate(ctx, r)
	if err != nil {
		return nil, err
	}
	c.ID += "@" + k.api // c is fresh for each request
	return c, nil
}

// writeError answers with status and a JSON body shaped like the
// middleware's: {"error": msg}.
func writeError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
