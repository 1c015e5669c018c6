package gateway

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"
	"weak"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http/httpguts"

	lpfasthttp "github.com/limitplane/limitplane/adapters/fasthttp"
	"github.com/limitplane/limitplane/identity"
)

// The gateway's fasthttp engine: ServeFastHTTP routes as ServeHTTP does
// (Gateway.route), each API's fasthttp chain (apiHandler.fast) runs
// adapters/fasthttp's middleware over the same limiter and renderer as
// the net/http chain, and proxies with a fasthttp.HostClient per
// upstream. What differs from net/http is listed in README ("The fasthttp
// engine").

// apiHandler is an API's handler on both engines, what attach gives
// live.Config: the net/http chain, and the fasthttp chain over the same
// limiter, authenticator and renderer.
type apiHandler struct {
	http.Handler
	fast fasthttp.RequestHandler
}

// fastRequestKey is the user value under which ServeFastHTTP hands an
// API's chain the request target it parsed.
const fastRequestKey = "limitplane.gateway.request"

// fastRequest is what ServeFastHTTP parsed of a request, as net/http
// parses it: the method and the target (Path decoded, RawPath,
// RawQuery). Its strings are the gateway's own, not fasthttp's buffers.
type fastRequest struct {
	method string
	url    url.URL
}

// fastRequestOf returns the request ServeFastHTTP parsed for ctx.
func fastRequestOf(ctx *fasthttp.RequestCtx) *fastRequest {
	fr, _ := ctx.UserValue(fastRequestKey).(*fastRequest)
	return fr
}

// ServeFastHTTP is ServeHTTP for the fasthttp engine: the same routes,
// answers and limiter under the snapshot running when ctx arrives. A
// request target net/http would refuse to parse gets net/http's own 400;
// "OPTIONS *" its empty 200.
func (g *Gateway) ServeFastHTTP(ctx *fasthttp.RequestCtx) {
	fr, _ := g.fastRequests.Get().(*fastRequest)
	if fr == nil {
		fr = new(fastRequest)
	}
	defer func() {
		*fr = fastRequest{}
		g.fastRequests.Put(fr)
	}()
	if status, body := fastFraming(&ctx.Request.Header); status != 0 {
		fastRefuse(ctx, status, body)
		return
	}
	lpfasthttp.DropTrailerFields(&ctx.Request.Header)
	if !fr.parse(ctx) {
		fastRefuse(ctx, http.StatusBadRequest, "400 Bad Request") // as net/http answers a target it cannot parse
		return
	}
	if fr.method == http.MethodOptions && fr.url.Path == "*" {
		return // net/http answers OPTIONS * with an empty 200 itself
	}
	a, ans := g.route(fr.method, fr.url.Path, fr.url.RawPath, fr.url.RawQuery)
	if a == nil {
		if ans.allow {
			ctx.Response.Header.Set("Allow", allowedMethods)
		}
		if ans.location != "" {
			ctx.Response.Header.Set("Location", ans.location)
		}
		writeFastError(&ctx.Response, ans.status, ans.msg)
		return
	}
	ctx.SetUserValue(fastRequestKey, fr)
	a.Handler().(*apiHandler).fast(ctx)
}

// fastRefuse answers ctx as net/http's server answers a request it will
// not serve: status, a text/plain body, and the connection closed, so
// nothing after the request on it is read as another.
func fastRefuse(ctx *fasthttp.RequestCtx, status int, body string) {
	if body != "" {
		ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
	} else {
		ctx.Response.Header.SetNoDefaultContentType(true)
	}
	ctx.Response.SetStatusCode(status)
	ctx.Response.SetBodyString(body)
	ctx.SetConnectionClose()
}

// fastFraming returns the status and body net/http's server answers a
// request with whose framing or header it refuses, which fasthttp's
// server reads and serves (0 and "" for none): a version that is not
// HTTP/d.d (400) or not HTTP/1.x (505); a method that is not a token or a
// target with a space (400); an HTTP/1.1 request without a Host field,
// with two, or with one that is malformed (400); a field name that is not a token or a value with a
// control byte other than a tab (400: net/http's MIME header reader
// refuses them); Content-Length fields that disagree (400: the
// request-smuggling shape RFC 9112 section 6.3 tells servers to refuse);
// Transfer-Encoding given twice (501); an Expect other than 100-continue
// (417, without a body). It reads the request's raw header
// lines, which fasthttp keeps as they came; a request with a Host and no
// raw lines was not read from a connection (a caller of ServeFastHTTP
// built it) and is not checked.
func fastFraming(h *fasthttp.RequestHeader) (int, string) {
	if len(h.RawHeaders()) == 0 && len(h.Host()) > 0 {
		return 0, ""
	}
	switch p := h.Protocol(); {
	case string(p) == "HTTP/1.1", string(p) == "HTTP/1.0":
	case len(p) != len("HTTP/X.Y") || string(p[:5]) != "HTTP/" || p[6] != '.' || !isDigit(p[5]) || !isDigit(p[7]):
		return http.StatusBadRequest, "400 Bad Request" // not a version http.ParseHTTPVersion reads
	case p[5] != '1':
		return http.StatusHTTPVersionNotSupported, "505 HTTP Version Not Supported: unsupported protocol version"
	}
	if !validFieldName(h.Method()) || bytes.IndexByte(h.RequestURI(), ' ') >= 0 {
		// A method is a token; a space in the target is a request
		// line net/http does not read (fasthttp takes the last space's
		// as the one before the version).
		return http.StatusBadRequest, "400 Bad Request"
	}
	hosts, tes := 0, 0
	var host, expect []byte // expect: the first Expect value
	var length []byte
	lengths := false // Content-Length fields that disagree
	for raw := h.RawHeaders(); len(raw) > 0; {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			// Obsolete line folding (RFC 9112 section 5.2): more of the
			// field above; only its bytes are checked.
			if !validFieldValue(line) {
				return http.StatusBadRequest, "400 Bad Request"
			}
			continue
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		if !validFieldName(name) || !validFieldValue(value) {
			return http.StatusBadRequest, "400 Bad Request"
		}
		// The length first: most lines are none of these, and one
		// comparison of lengths costs less than four of names.
		switch len(name) {
		case len("Host"), len("Expect"), len("Content-Length"), len("Transfer-Encoding"):
		default:
			continue
		}
		switch {
		case bytes.EqualFold(name, []byte("Host")):
			hosts++
			host = bytes.Trim(value, " \t")
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			tes++
		case bytes.EqualFold(name, []byte("Expect")) && expect == nil:
			expect = bytes.Trim(value, " \t")
		case bytes.EqualFold(name, []byte("Content-Length")):
			v := bytes.TrimSpace(value)
			if length != nil && !bytes.Equal(v, length) {
				lengths = true
			}
			length = v
		}
	}
	switch {
	case hosts == 0 && (!h.IsHTTP11() || h.IsConnect()):
	case hosts == 0:
		return http.StatusBadRequest, "400 Bad Request: missing required Host header"
	case hosts == 1 && !httpguts.ValidHostHeader(unsafe.String(unsafe.SliceData(host), len(host))):
		return http.StatusBadRequest, "400 Bad Request: malformed Host header"
	case hosts > 1, lengths:
		return http.StatusBadRequest, "400 Bad Request"
	case tes > 1:
		return http.StatusNotImplemented, "Unsupported transfer encoding"
	case len(expect) > 0 && !httpguts.HeaderValuesContainsToken([]string{string(expect)}, "100-continue"):
		return http.StatusExpectationFailed, "" // net/http's answer to an expectation it cannot meet: no body
	}
	return 0, ""
}

// isDigit reports whether c is an ASCII digit.
func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// validFieldName reports whether name is a header field name net/http's
// server accepts: a token (httpguts.ValidHeaderFieldName).
func validFieldName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if !httpguts.IsTokenRune(rune(c)) {
			return false
		}
	}
	return true
}

// validFieldValue reports whether v is a header field value net/http's
// server accepts: no control byte but a tab (httpguts.ValidHeaderFieldValue).
// Eight bytes at a time while none is below a space or DEL (a word has a
// byte below n when (x − n·0x01…01) &^ x has a high bit set, n ≤ 128:
// "Bit Twiddling Hacks", hasless); then byte by byte from the first word
// that has one.
func validFieldValue(v []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(v) >= 8 {
		x := binary.LittleEndian.Uint64(v)
		del := x ^ 0x7f*ones // DEL becomes a zero byte
		if (x-0x20*ones)&^x&highs != 0 || (del-ones)&^del&highs != 0 {
			break
		}
		v = v[8:]
	}
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// parse reads ctx's method and target into fr, the target as
// url.ParseRequestURI reads it (net/http's server does the same); false
// for a target that does not parse. A target of a path without escapes
// and control bytes, the usual one, is split without the parser.
func (fr *fastRequest) parse(ctx *fasthttp.RequestCtx) bool {
	fr.method = methodString(ctx.Method())
	raw := ctx.Request.Header.RequestURI()
	plain := len(raw) > 0 && raw[0] == '/'
	for _, c := range raw {
		if c == '%' || c < 0x20 || c == 0x7f {
			plain = false
			break
		}
	}
	if !plain {
		u, err := url.ParseRequestURI(string(raw))
		if err != nil {
			return false
		}
		fr.url = *u
		return true
	}
	s := string(raw)
	p, q, ok := strings.Cut(s, "?")
	fr.url = url.URL{Path: p, RawQuery: q, ForceQuery: ok && q == ""}
	return true
}

// methodString returns m as a string, without a copy for the usual
// methods.
func methodString(m []byte) string {
	for _, s := range [...]string{http.MethodGet, http.MethodPost, http.MethodHead, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions, http.MethodConnect} {
		if string(m) == s {
			return s
		}
	}
	return string(m)
}

// writeFastError is writeError for the fasthttp engine.
func writeFastError(resp *fasthttp.Response, status int, msg string) {
	resp.Header.SetContentType("application/json")
	resp.Header.Set("X-Content-Type-Options", "nosniff")
	resp.SetStatusCode(status)
	resp.SetBody(errorBody(msg))
}

// fastUpstream is an API's upstream on the fasthttp engine: it strips
// the request as o says, then serves it.
func (o outbound) fastUpstream(serve func(ctx *fasthttp.RequestCtx, fr *fastRequest)) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		fr := fastRequestOf(ctx)
		o.applyFast(&ctx.Request.Header, &fr.url)
		serve(ctx, fr)
	}
}

// applyFast is apply for the fasthttp engine: it strips h, the request's
// own header (the upstream gets the request itself, not a copy), and u.
func (o outbound) applyFast(h *fasthttp.RequestHeader, u *url.URL) {
	o.rewriteURL(u)
	for _, s := range o.sources {
		switch s.In {
		case identity.InHeader:
			h.Del(s.Name)
		case identity.InCookie:
			h.DelCookie(s.Name)
		}
	}
}

// fastEcho is the built-in echo upstream on the fasthttp engine: the
// same answer as echo's, from the stripped request.
func fastEcho(id string) func(ctx *fasthttp.RequestCtx, fr *fastRequest) {
	return func(ctx *fasthttp.RequestCtx, fr *fastRequest) {
		h := make(http.Header)
		ctx.Request.Header.VisitAll(func(k, v []byte) {
			if name := string(k); name != "Host" { // net/http keeps Host apart
				h[name] = append(h[name], string(v))
			}
		})
		n := int64(min(len(ctx.Request.Body()), maxEchoBody))
		b, err := echoBody(id, fr.method, &fr.url, lpfasthttp.Request{Ctx: ctx}.RemoteAddr(), h, n)
		if err != nil {
			writeFastError(&ctx.Response, http.StatusInternalServerError, "internal error")
			return
		}
		ctx.Response.Header.SetContentType("application/json")
		ctx.Response.SetBody(b)
	}
}

// fastProxy is an API's reverse proxy on the fasthttp engine: what
// newProxy's httputil.ReverseProxy does, with a fasthttp.HostClient.
type fastProxy struct {
	api     string
	target  *url.URL
	client  *fasthttp.HostClient
	trusted []netip.Prefix
	log     *slog.Logger
}

// serve sends ctx's request, already stripped, to the upstream and its
// answer to the client under the rate-limit fields already set: the
// path joined to the target's, the Host the target's, hop-by-hop fields
// dropped both ways, X-Forwarded-For, -Host and -Proto as newProxy sets
// them.
func (p *fastProxy) serve(ctx *fasthttp.RequestCtx, fr *fastRequest) {
	req := &ctx.Request
	inHost := fr.url.Host
	if inHost == "" {
		inHost = string(req.Header.Host())
	}
	var xff []string
	chunked := req.Header.ContentLength() == -1 // before Transfer-Encoding goes
	xff = scrubProxyFields(&req.Header, func() bool { return p.fromTrusted(ctx) })
	out := url.URL{Scheme: p.target.Scheme, Host: p.target.Host, ForceQuery: fr.url.ForceQuery}
	out.Path, out.RawPath = joinURLPath(p.target, &fr.url)
	if p.target.RawQuery == "" || fr.url.RawQuery == "" {
		out.RawQuery = p.target.RawQuery + fr.url.RawQuery
	} else {
		out.RawQuery = p.target.RawQuery + "&" + fr.url.RawQuery
	}
	req.SetRequestURI(out.Scheme + "://" + out.Host + out.RequestURI())
	req.Header.SetNoDefaultContentType(true) // none unless the client sent one
	req.Header.SetProtocol("HTTP/1.1")       // as net/http's proxy, whatever the client spoke
	if chunked {
		// A chunked request goes on chunked, as net/http's proxy sends
		// a body of unknown length (SetBodyStream releases the body
		// buffer: the stream reads a copy).
		req.SetBodyStream(bytes.NewReader(bytes.Clone(req.Body())), -1)
	}
	if ip, ok := clientIP(ctx); ok {
		if len(xff) > 0 {
			ip = strings.Join(xff, ", ") + ", " + ip
		}
		req.Header.Set("X-Forwarded-For", ip)
	}
	req.Header.Set("X-Forwarded-Host", inHost)
	req.Header.Set("X-Forwarded-Proto", "http")

	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := p.client.Do(req, resp); err != nil {
		p.log.Warn("upstream failed", "api", p.api, "target", p.target.String(), "err", err)
		writeFastError(&ctx.Response, http.StatusBadGateway, "upstream unavailable")
		return
	}
	copyFastResponse(&ctx.Response, resp, ctx.IsHead())
}

// forwardedFields are the fields a proxy sets afresh (X-Forwarded-For
// extended from a trusted peer's), as net/http/httputil's SetXForwarded.
var forwardedFields = [...]string{"Forwarded", fwdXFF: "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// fwdXFF is X-Forwarded-For's index in forwardedFields.
const fwdXFF = 1

// scrubProxyFields drops from h the hop-by-hop fields (hopHeaders and
// those its Connection fields name; Te: trailers is kept) and
// forwardedFields, and returns the X-Forwarded-For values it had when
// trusted says they came from a trusted proxy. It looks at h's fields
// once and deletes only those present, which for most requests (no
// Connection field) is none. VisitAll shows the fields fasthttp keeps
// apart from its list too (Connection: close as a flag,
// Transfer-Encoding, Trailer).
func scrubProxyFields(h *fasthttp.RequestHeader, trusted func() bool) (xff []string) {
	var hop, fwd uint16 // bit i: hopHeaders[i], forwardedFields[i] present
	var connBuf [2][]byte
	conn := connBuf[:0]
	h.VisitAll(func(k, v []byte) {
		name := string(k)
		if i := slices.Index(hopHeaders, name); i >= 0 {
			hop |= 1 << i
			if name == "Connection" {
				conn = append(conn, v)
			}
		} else if i := slices.Index(forwardedFields[:], name); i >= 0 {
			fwd |= 1 << i
		}
	})
	if hop == 0 && fwd == 0 {
		return nil
	}
	if fwd&(1<<fwdXFF) != 0 && trusted() {
		for _, v := range h.PeekAll("X-Forwarded-For") {
			xff = append(xff, string(v))
		}
	}
	te := hop&(1<<hopTe) != 0 && headerHasToken(h, "Te", "trailers")
	// The fields the Connection fields name, each token deleted as it is
	// read (conn's values stay as they are while only Del runs).
	for _, v := range conn {
		for tok := range bytes.SplitSeq(v, []byte(",")) {
			if tok = bytes.Trim(tok, " \t"); len(tok) > 0 {
				h.DelBytes(tok)
			}
		}
	}
	for i, name := range hopHeaders {
		if hop&(1<<i) != 0 {
			h.Del(name)
		}
	}
	if te {
		h.Set("Te", "trailers")
	}
	for i, name := range forwardedFields {
		if fwd&(1<<i) != 0 {
			h.Del(name)
		}
	}
	return xff
}

// clientIP returns ctx's peer address without its port, as
// net.SplitHostPort of the net/http engine's RemoteAddr gives it; false
// when the peer's address has no host part.
func clientIP(ctx *fasthttp.RequestCtx) (string, bool) {
	q := lpfasthttp.Request{Ctx: ctx}
	if a, ok := q.PeerAddr(); ok {
		return a.String(), true
	}
	ip, _, err := net.SplitHostPort(q.RemoteAddr())
	return ip, err == nil
}

// fromTrusted reports whether ctx's peer is one of the trusted proxies.
func (p *fastProxy) fromTrusted(ctx *fasthttp.RequestCtx) bool {
	if len(p.trusted) == 0 {
		return false
	}
	a, err := identity.PeerAddr(lpfasthttp.Request{Ctx: ctx})
	if err != nil {
		return false
	}
	for _, t := range p.trusted {
		if t.Contains(a) {
			return true
		}
	}
	return false
}

// copyFastResponse adds up's status, fields (but the hop-by-hop ones and
// Content-Length) and body to dst, whose rate-limit fields stay. For a
// HEAD request dst keeps up's Content-Length, as net/http's proxy does.
func copyFastResponse(dst, up *fasthttp.Response, head bool) {
	hop := connectionTokens(up.Header.PeekAll("Connection"))
	up.Header.VisitAll(func(k, v []byte) {
		name := string(k)
		if name == "Content-Length" || isHopField(name) || hop[name] {
			return
		}
		dst.Header.AddBytesKV(k, v)
	})
	dst.SetStatusCode(up.StatusCode())
	if head {
		dst.SkipBody = true
		dst.Header.SetContentLength(up.Header.ContentLength())
		return
	}
	if up.Header.ContentLength() < 0 {
		// Chunked (or ended by the connection's close) from the
		// upstream: chunked to the client, as net/http's proxy sends it.
		dst.SetBodyStream(bytes.NewReader(bytes.Clone(up.Body())), -1)
		return
	}
	// The body changes hands without a copy; up gets dst's empty buffer.
	b := up.SwapBody(nil)
	up.SwapBody(dst.SwapBody(b))
}

// connectionTokens returns the field names that Connection values list,
// canonical.
func connectionTokens(vals [][]byte) map[string]bool {
	if len(vals) == 0 {
		return nil
	}
	names := make(map[string]bool)
	for _, v := range vals {
		for _, name := range strings.Split(string(v), ",") {
			if name = textproto.TrimString(name); name != "" {
				names[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	return names
}

// isHopField reports whether name (canonical) is one of hopHeaders.
func isHopField(name string) bool {
	for _, h := range hopHeaders {
		if h == name {
			return true
		}
	}
	return false
}

// headerHasToken reports whether a field name of h lists token, with
// httpguts.HeaderValuesContainsToken, as net/http/httputil's proxy asks
// ("trailers;q=0.5" is not "trailers").
func headerHasToken(h *fasthttp.RequestHeader, name, token string) bool {
	var vs []string
	for _, v := range h.PeekAll(name) {
		vs = append(vs, string(v))
	}
	return httpguts.HeaderValuesContainsToken(vs, token)
}

// joinURLPath is net/http/httputil's: b's path under a's, escaped forms
// kept, so the fasthttp proxy sends the path the net/http one does.
func joinURLPath(a, b *url.URL) (path, rawpath string) {
	if a.RawPath == "" && b.RawPath == "" {
		return singleJoiningSlash(a.Path, b.Path), ""
	}
	apath := a.EscapedPath()
	bpath := b.EscapedPath()
	aslash := strings.HasSuffix(apath, "/")
	bslash := strings.HasPrefix(bpath, "/")
	switch {
	case aslash && bslash:
		return a.Path + b.Path[1:], apath + bpath[1:]
	case !aslash && !bslash:
		return a.Path + "/" + b.Path, apath + "/" + bpath
	}
	return a.Path + b.Path, apath + bpath
}

// singleJoiningSlash is net/http/httputil's.
func singleJoiningSlash(a, b string) string {
	aslash := strings.HasSuffix(a, "/")
	bslash := strings.HasPrefix(b, "/")
	switch {
	case aslash && bslash:
		return a + b[1:]
	case !aslash && !bslash:
		return a + "/" + b
	}
	return a + b
}

// fastClients holds the gateway's fasthttp clients, one per upstream
// (scheme and host), shared by every API and every snapshot that proxies
// to it, as one http.Transport is on the net/http engine: keep-alive
// connections survive an Apply. The map holds its clients weakly: the
// handlers built for the running configuration (and for requests still
// in flight under an older one) hold them, and a client none holds,
// whose idle connections fasthttp has closed (MaxIdleConnDuration), is
// collected and its entry dropped by the next get. So upstreams a
// control plane stops naming cost nothing once their connections are
// idle long enough, however many there have been.
type fastClients struct {
	mu sync.Mutex
	m  map[string]weak.Pointer[fasthttp.HostClient]
}

// fastReadBufferSize bounds an upstream's response header on the
// fasthttp engine (fasthttp's default, 4 KiB, refuses common ones).
const fastReadBufferSize = 64 << 10

// fastMaxConns is the most connections the fasthttp engine opens to one
// upstream: more than a gateway's file descriptors would let it.
const fastMaxConns = 1 << 20

// get returns the client for target, made on first use.
func (c *fastClients) get(target *url.URL) *fasthttp.HostClient {
	key := target.Scheme + "://" + target.Host
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc := c.m[key].Value(); hc != nil {
		return hc
	}
	for k, p := range c.m { // get runs when an API is built: rarely
		if p.Value() == nil {
			delete(c.m, k)
		}
	}
	addr := target.Host
	tls := target.Scheme == "https"
	if target.Port() == "" {
		port := "80"
		if tls {
			port = "443"
		}
		addr = net.JoinHostPort(target.Hostname(), port)
	}
	hc := &fasthttp.HostClient{
		Addr:                     addr,
		IsTLS:                    tls,
		NoDefaultUserAgentHeader: true, // as ReverseProxy: no User-Agent unless the client sent one
		DialDualStack:            true, // IPv6 upstreams too, as net/http's dialer (fasthttp's default dials tcp4 only)
		DisablePathNormalizing:   true, // the path is sent as net/http would send it
		// No cap on connections, as http.DefaultTransport has none:
		// fasthttp's default (512) would answer 502 above it.
		MaxConns:            fastMaxConns,
		MaxConnWaitTimeout:  30 * time.Second,
		MaxIdleConnDuration: 90 * time.Second, // http.DefaultTransport's IdleConnTimeout
		ReadBufferSize:      fastReadBufferSize,
	}
	if c.m == nil {
		c.m = make(map[string]weak.Pointer[fasthttp.HostClient])
	}
	c.m[key] = weak.Make(hc)
	return hc
}

// len returns the number of upstreams with a client still held.
func (c *fastClients) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, p := range c.m {
		if p.Value() != nil {
			n++
		}
	}
	return n
}

// closeIdle drops every client's idle connections.
func (c *fastClients) closeIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.m {
		if hc := p.Value(); hc != nil {
			hc.CloseIdleConnections()
		}
	}
}
