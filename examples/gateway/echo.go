package main

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
)

// maxEchoBody is how much of a request body the echo upstream reads.
const maxEchoBody = 1 << 20

// echoReply is the echo upstream's answer: the request as it arrived
// upstream (after the listen path was stripped).
type echoReply struct {
	API        string            `json:"api"`
	Method     string            `json:"method"`
	Path       string            `json:"path"`
	Query      string            `json:"query,omitempty"`
	RemoteAddr string            `json:"remote_addr"`
	Headers    map[string]string `json:"headers"`
	BodyBytes  int64             `json:"body_bytes"`
}

// echo returns the builtin:echo upstream for API id: it answers every
// request with 200 and JSON describing it. Credential headers are shown as
// "[redacted]" so a pasted demo output never leaks a key.
func echo(id string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, io.LimitReader(r.Body, maxEchoBody))
		rep := echoReply{
			API:        id,
			Method:     r.Method,
			Path:       r.URL.Path,
			Query:      r.URL.RawQuery,
			RemoteAddr: r.RemoteAddr,
			Headers:    make(map[string]string, len(r.Header)),
			BodyBytes:  n,
		}
		for name, vals := range r.Header {
			v := strings.Join(vals, ", ")
			if slices.Contains([]string{"Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization"}, name) {
				v = "[redacted]"
			}
			rep.Headers[name] = v
		}
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			writeError(w, http.StatusInternalServerError, "internal error")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(b, '\n'))
	})
}
