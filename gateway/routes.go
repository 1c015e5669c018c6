package gateway

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
	"strings"
	"sync"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/live"
)

// allowedMethods is the Allow field of the gateway's 405 answer: it
// forwards any method but CONNECT; these are the ones it advertises.
const allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

// ServeHTTP routes r by the longest listen path that matches its path,
// under the snapshot running when r arrives. Requests no route can take
// are answered here, in JSON like every other answer of the gateway's own:
// 503 before the first Apply and while SetUnavailable holds, 405 for CONNECT, 400 for a target that is
// not a path, 308 to the clean path for one with "." or ".." segments,
// 404 when no listen path matches.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a, ans := g.route(r.Method, r.URL.Path, r.URL.RawPath, r.URL.RawQuery)
	if a == nil {
		if ans.allow {
			w.Header().Set("Allow", allowedMethods)
		}
		if ans.location != "" {
			w.Header().Set("Location", ans.location)
		}
		writeError(w, ans.status, ans.msg)
		return
	}
	a.Handler().ServeHTTP(w, r)
}

// answer is the gateway's own answer to a request no API takes.
type answer struct {
	status   int
	msg      string // the JSON body's error
	allow    bool   // 405: send Allow: allowedMethods
	location string // 308: where to
}

// route chooses the built API that serves a request of method for the
// decoded path p, spelled rawPath by the client when that differs from
// p's default escaping (url.URL.RawPath; rawQuery is kept on a redirect),
// or the answer to send instead: the one decision both engines make, in
// the order ServeHTTP documents. A listen path matches whole segments of
// the path as the client escaped it, so "/shop%2Freports", whose first
// segment is "shop/reports", is not under "/shop/" (an upstream that
// decodes it would otherwise serve "/shop/reports" past its endpoints).
func (g *Gateway) route(method, p, rawPath, rawQuery string) (*live.API, answer) {
	st := g.State()
	if st == nil {
		return nil, answer{status: http.StatusServiceUnavailable, msg: "no configuration applied yet"}
	}
	if reason := g.Unavailable(); reason != "" {
		return nil, answer{status: http.StatusServiceUnavailable, msg: reason}
	}
	if method == http.MethodConnect {
		// A reverse proxy opens no tunnels.
		return nil, answer{status: http.StatusMethodNotAllowed, msg: "method CONNECT is not allowed", allow: true}
	}
	if p != "" && p[0] != '/' {
		// "GET *": net/http answers only OPTIONS * itself.
		return nil, answer{status: http.StatusBadRequest, msg: "request target must be a path starting with /"}
	}
	if c := cleanPath(p); c != p {
		// "/open/../echo/x" must not reach the open API's upstream, which
		// might resolve it to a path the echo API protects: send the
		// client to the clean path, whose route decides.
		u := url.URL{Path: c, RawQuery: rawQuery}
		return nil, answer{status: http.StatusPermanentRedirect, msg: "request path is not clean; use " + c, location: u.String()}
	}
	for _, a := range st.Routes() {
		// prefix "/echo" matches "/echo" and "/echo/...", not "/echoes".
		if pre := a.Prefix(); strings.HasPrefix(p, pre) && (len(p) == len(pre) || p[len(pre)] == '/') {
			if rawPath != "" {
				if _, ok := cutEscapedPrefix(rawPath, pre); !ok {
					continue // an encoded "/" joins segments the listen path splits
				}
			}
			if a.Handler() != nil {
				return a, answer{}
			}
			// Not built (yet). The problem itself (an environment
			// variable's name and length, a file's path) is for
			// operators, in /readyz and the control plane's
			// /api/dataplanes, not for whoever calls the API.
			return nil, answer{status: http.StatusServiceUnavailable, msg: fmt.Sprintf("API %q is not built on this gateway; its operators see why in the gateway's /readyz", a.ID())}
		}
	}
	return nil, answer{status: http.StatusNotFound, msg: "no API is served at this path"}
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

// outbound is what an API strips from a request before its upstream sees
// it. The reverse proxy applies it to its outbound request, a copy it
// makes anyway, so stripping costs no copy of its own there.
type outbound struct {
	// prefix is the listen path (without its final slash) to remove from
	// the path: "/echo/a" becomes "/a", "/echo" becomes "/". "" keeps
	// the path.
	prefix string
	// sources are the credential places to remove: those header fields,
	// those query parameters (the rest of the query is passed on as sent)
	// and those cookies (other cookies stay).
	sources []identity.Source
}

// apply strips r, whose Header and URL the caller owns (a copy, never a
// request a handler was given).
func (o outbound) apply(r *http.Request) {
	o.rewriteURL(r.URL)
	for _, s := range o.sources {
		switch s.In {
		case identity.InHeader:
			r.Header.Del(s.Name)
		case identity.InCookie:
			if lines, ok := dropCookie(r.Header["Cookie"], s.Name); ok {
				if len(lines) == 0 {
					r.Header.Del("Cookie")
				} else {
					r.Header["Cookie"] = lines
				}
			}
		}
	}
}

// cutListenPath returns u's path after prefix (a listen path without its
// final "/"), decoded and, when u keeps the client's escaping (RawPath),
// escaped as the client sent it (segment by segment, so also when the
// client spelled the prefix with escapes); raw is "" when the path is to
// be escaped anew (no RawPath, or nothing after the prefix). The
// upstream gets these (rewriteURL), and endpoints are matched on the same
// (endpointPath).
func cutListenPath(u *url.URL, prefix string) (path, raw string) {
	path = strings.TrimPrefix(u.Path, prefix)
	if u.RawPath != "" {
		if rest, ok := cutEscapedPrefix(u.RawPath, prefix); ok && rest != "" {
			raw = rest
		}
	}
	return path, raw
}

// cutEscapedPrefix returns the escaped path raw after the segments of
// prefix (a decoded listen path without its final "/", "" for the root),
// and whether raw starts with them: each segment of raw is decoded before
// it is compared, so "/sh%6Fp/x" is under "/shop" (rest "/x") while
// "/shop%2Fx", one segment "shop/x", is not. rest is "" or starts with
// "/".
func cutEscapedPrefix(raw, prefix string) (rest string, ok bool) {
	for prefix != "" {
		if prefix[0] != '/' || raw == "" || raw[0] != '/' {
			return "", false
		}
		prefix, raw = prefix[1:], raw[1:]
		i := strings.IndexByte(prefix, '/')
		if i < 0 {
			i = len(prefix)
		}
		j := strings.IndexByte(raw, '/')
		if j < 0 {
			j = len(raw)
		}
		if seg := raw[:j]; seg != prefix[:i] {
			if dec, err := url.PathUnescape(seg); err != nil || dec != prefix[:i] {
				return "", false
			}
		}
		prefix, raw = prefix[i:], raw[j:]
	}
	return raw, true
}

// rewriteURL strips u, which the caller owns, of the listen path and the
// credential query parameters: the part of apply both engines share.
func (o outbound) rewriteURL(u *url.URL) {
	if o.prefix != "" {
		path, raw := cutListenPath(u, o.prefix)
		u.Path, u.RawPath = orSlash(path), ""
		if raw != "" {
			u.RawPath = orSlash(raw)
		}
	}
	for _, s := range o.sources {
		if s.In == identity.InQuery {
			if q, ok := dropParam(u.RawQuery, s.Name); ok {
				u.RawQuery = q
			}
		}
	}
}

// handler returns h behind o, for an upstream other than the proxy: h
// gets a copy of each request, stripped.
func (o outbound) handler(h http.Handler) http.Handler {
	if o.prefix == "" && len(o.sources) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A handler must not modify the request it is given.
		r2 := *r
		r2.Header = r.Header.Clone()
		u := *r.URL
		r2.URL = &u
		o.apply(&r2)
		h.ServeHTTP(w, &r2)
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

// newProxy returns a reverse proxy for API api to target. The request is
// stripped as strip says, then its path is joined to the target's path;
// the Host header becomes the target's; X-Forwarded-For, -Host and -Proto
// are set afresh from the peer, except that a trusted proxy's
// X-Forwarded-For chain is kept and the proxy's address appended.
func newProxy(api string, target *url.URL, strip outbound, t http.RoundTripper, buffers httputil.BufferPool, trusted []netip.Prefix, log *slog.Logger) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// pr.Out is the proxy's own copy, its Header and URL too.
			strip.apply(pr.Out)
			pr.SetURL(target)
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 && fromTrusted(pr.In, trusted) {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			pr.SetXForwarded()
		},
		Transport:  t,
		BufferPool: buffers,
		ErrorLog:   slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return // the client went away
			}
			log.Warn("upstream failed", "api", api, "target", target.String(), "err", err)
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

// bufferPool is an httputil.BufferPool of 32 KiB copy buffers: without
// one, ReverseProxy allocates a fresh buffer for every response body. It
// pools the buffers' arrays, so that Put, which turns the slice back into
// a pointer to its array, allocates nothing either (a pooled *[]byte
// would cost an allocation per Put).
type bufferPool struct{ p sync.Pool }

// copyBufferSize is the size of the proxies' copy buffers, as
// ReverseProxy's own.
const copyBufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return v[:]
	}
	return new([copyBufferSize]byte)[:]
}

func (b *bufferPool) Put(buf []byte) {
	if cap(buf) < copyBufferSize {
		return // not one of ours
	}
	b.p.Put((*[copyBufferSize]byte)(buf[:copyBufferSize]))
}

// newTransport is http.DefaultTransport with enough idle connections per
// upstream for a busy gateway (the default keeps 2).
func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	return t
}

// writeError answers with status and a JSON body shaped like the
// middleware's: {"error": msg}.
func writeError(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(errorBody(msg))
}

// errorBody is the JSON body of the gateway's own answers, both engines':
// {"error": msg} and a newline.
func errorBody(msg string) []byte {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	return append(b, '\n')
}
