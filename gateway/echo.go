package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
)

// maxEchoBody is how much of a request body the echo upstream reads.
const maxEchoBody = 1 << 20

// EchoReply is the JSON answer of the built-in echo upstream
// (spec.BuiltinEcho): the request as it arrived upstream, after the listen
// path and credentials were stripped, with credentials it still carries
// shown as "[redacted]".
type EchoReply struct {
	API        string            `json:"api"`
	Method     string            `json:"method"`
	Path       string            `json:"path"`
	Query      string            `json:"query,omitempty"`
	RemoteAddr string            `json:"remote_addr"`
	Headers    map[string]string `json:"headers"`
	BodyBytes  int64             `json:"body_bytes"`
}

// Credentials the echo upstream never shows: header fields (canonical
// names) and query parameters whose values it replaces by "[redacted]".
// They are the places the gateway reads credentials from, plus Cookie and
// RFC 6750's access_token parameter.
var (
	echoSecretHeaders = []string{"Authorization", "X-Api-Key", "Cookie"}
	echoSecretParams  = []string{"api_key", "access_token"}
)

// hopHeaders are the hop-by-hop header fields (RFC 9110 §7.6.1, and the
// older ones net/http/httputil.ReverseProxy also drops): they describe the
// client's connection to the gateway, so an upstream behind the proxy
// never receives them, and the echo upstream does not show them.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	hopTe: "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// hopTe is Te's index in hopHeaders.
const hopTe = 5

// echo returns the builtin:echo upstream for API id: it answers every
// request whose body it can read (400 otherwise) with 200 and JSON describing it as an http(s) upstream would
// receive it: without hop-by-hop header fields (hopHeaders and those the
// Connection field names), and with credentials (echoSecretHeaders,
// echoSecretParams) shown as "[redacted]", so a pasted demo output never
// leaks a key.
func echo(id string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxEchoBody))
		if err != nil {
			// A body that does not parse (bad chunked framing, a
			// Content-Length longer than what came): a real upstream
			// would not answer 200 either.
			writeError(w, http.StatusBadRequest, "malformed request body")
			return
		}
		b, err := echoBody(id, r.Method, r.URL, r.RemoteAddr, r.Header, n)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "internal error")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
}

// echoBody is the echo's JSON answer (an EchoReply and a newline) to a
// request of method for u from remoteAddr with header h (as net/http's
// Request.Header: no Host) and a body of n bytes: what both engines'
// echoes send.
func echoBody(id, method string, u *url.URL, remoteAddr string, h http.Header, n int64) ([]byte, error) {
	rep := EchoReply{
		API:        id,
		Method:     method,
		Path:       u.Path,
		Query:      redactQuery(u.RawQuery, echoSecretParams),
		RemoteAddr: remoteAddr,
		Headers:    make(map[string]string, len(h)),
		BodyBytes:  n,
	}
	hop := slices.Clone(hopHeaders)
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				hop = append(hop, http.CanonicalHeaderKey(name))
			}
		}
	}
	for name, vals := range h {
		if slices.Contains(hop, name) {
			continue
		}
		v := strings.Join(vals, ", ")
		if slices.Contains(echoSecretHeaders, name) {
			v = "[redacted]"
		}
		rep.Headers[name] = v
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("echo: %w", err)
	}
	return append(b, '\n'), nil
}

// redactQuery returns the raw query with the value of every parameter
// named in names replaced by "[redacted]", everything else as sent.
func redactQuery(raw string, names []string) string {
	if raw == "" {
		return ""
	}
	pairs := strings.Split(raw, "&")
	for i, p := range pairs {
		if k, _, _ := strings.Cut(p, "="); slices.Contains(names, unescapeParam(k)) {
			pairs[i] = k + "=[redacted]"
		}
	}
	return strings.Join(pairs, "&")
}

// unescapeParam decodes a query parameter name as url.ParseQuery does; a
// name that does not decode is returned as it is.
func unescapeParam(k string) string {
	if u, err := url.QueryUnescape(k); err == nil {
		return u
	}
	return k
}
