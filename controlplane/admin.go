package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/failurelog"
	"github.com/limitplane/limitplane/spec"
)

// AdminOptions configure Admin.
type AdminOptions struct {
	// Store holds the state. Required.
	Store Store
	// Token is the bearer token every call must carry
	// ("Authorization: Bearer <token>", the scheme's name in any case,
	// one Authorization field only: identity.BearerToken). Required, at
	// least MinTokenBytes long: the admin API never runs without one, nor
	// with one that can be guessed.
	Token string
	// DataPlanes is the registry GET /api/dataplanes lists; nil lists
	// none.
	DataPlanes *DataPlanes
	// MaxBodyBytes bounds a request body; 0 means 1 MiB.
	MaxBodyBytes int64
	// MaxBulkBytes bounds the bodies of POST /api/keys:batch and POST
	// /api/import instead; 0 means DefaultMaxBulkBytes.
	MaxBulkBytes int64
	// Metrics counts writes, their latency and refused calls; nil counts
	// nothing.
	Metrics *Metrics
	// Log receives refused calls (missing or wrong token; rate-limited:
	// the first at once, then at most one line per
	// failurelog.DefaultInterval with their count) and store failures;
	// nil means slog.Default().
	Log *slog.Logger
}

// MaxProblems is the most validation problems one answer lists; the
// answer says how many more there were.
const MaxProblems = 100

// MinTokenBytes is the shortest admin token Admin accepts, in bytes
// (openssl rand -hex 32 makes one of 64).
const MinTokenBytes = 32

// CheckToken reports why token cannot be the admin token, or returns nil;
// the error's text continues "the token ..." ("is 5 bytes, want at least
// 32 ..."). The token is refused when it is shorter than MinTokenBytes, or holds white space or a control
// character (a byte up to 0x20, or DEL), which a client could not send as
// the token (identity.BearerToken trims surrounding white space: a token
// of spaces would refuse every call).
func CheckToken(token string) error {
	if len(token) < MinTokenBytes {
		return fmt.Errorf("is %d bytes, want at least %d (e.g. openssl rand -hex 32)", len(token), MinTokenBytes)
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("holds white space or the control character %q at byte %d; no Authorization header carries it as sent", c, i)
		}
	}
	return nil
}

// TokenID names an admin token in audit lines without revealing it:
// "sha256:" and the first 12 hex digits of its SHA-256.
func TokenID(token string) string { return HashToken(token)[:len("sha256:")+12] }

// Admin returns the admin REST API's handler. Bodies are spec's JSON;
// unknown fields are refused. Every answer is JSON; an error is
// {"error": "...", "problems": [{"path": "...", "problem": "..."}]}, with
// problems only when a write would leave an invalid state (422; paths
// name objects by ID: keys["sha256:…"].policies[0]). A call without the
// token gets 401.
//
//	GET    /api/policies        every policy, in ID order
//	                            → {"revision", "policies": [Policy...]}
//	PUT    /api/policies/{id}   store a policy             → {"revision"}
//	GET    /api/policies/{id}   the policy (404 if none)
//	DELETE /api/policies/{id}   delete it (404 if none)    → {"revision"}
//	GET    /api/apis            → {"revision", "apis": [API...]}
//	PUT/GET/DELETE /api/apis/{id}      the same for APIs
//	GET    /api/keys[?after=HASH][&limit=N]
//	                            one page of keys in hash order: at most N
//	                            (DefaultKeysLimit, at most MaxKeysLimit)
//	                            after HASH → {"revision", "keys": [Key...],
//	                            "next"}; next is the hash to ask after for
//	                            the next page, "" on the last
//	POST   /api/keys            create a key from {"key": plaintext, ...}
//	                            (hashed at once, never stored; 422 when
//	                            it breaks identity.CheckKey) or
//	                            {"key_hash": ...}; 409 if it exists
//	                            → 201 {"key_hash", "revision"}
//	PUT    /api/keys/{hash}     create or replace a key; replacing resets
//	                            its quotas unless ?suppress_reset=1
//	                            → {"key_hash", "revision"}
//	GET/DELETE /api/keys/{hash}
//	POST   /api/keys/{hash}/reset-quota[?api=ID]
//	                            reset the key's quotas, or only its
//	                            api_limits quota for API ID (409 when it
//	                            has none) → {"key_hash", "revision"}
//	POST   /api/keys:batch[?suppress_reset=1]
//	                            create or replace 1 to MaxBatchKeys keys,
//	                            {"keys": [{"key": plaintext or "key_hash",
//	                            ...}, ...]}, in one write (one revision)
//	                            or none: any problem is 422 listing every
//	                            one by index (keys[3].policies[0]);
//	                            replacing a key resets its quotas unless
//	                            ?suppress_reset=1
//	                            → {"revision", "key_hashes": [...]}, the
//	                            hashes in the order given
//	GET    /api/export          the whole state as one document of
//	                            ExportFormatVersion {"format_version",
//	                            "revision", "policies", "apis", "keys"}:
//	                            every API whatever its tags, keys by hash
//	                            with their quota epochs, secrets as spec
//	                            keeps them (references; an inline secret
//	                            only if an operator wrote one, and then
//	                            the export is a secret too); streamed
//	                            from one read view
//	POST   /api/import          replace the whole state with an export
//	                            document in one write (one revision
//	                            raise), read as a stream: validated whole
//	                            (422, paths by position in the document;
//	                            an unknown format_version is 422 too),
//	                            objects it lacks deleted, the rest put as
//	                            given, quota epochs included; its
//	                            revision is not taken → {"revision"}.
//	                            Export, import into an empty control
//	                            plane and export again gives the same
//	                            document but for "revision". See
//	                            importState for epochs and history.
//	GET    /api/revision        → {"revision"}
//	GET    /api/dataplanes      → {"dataplanes": [DataPlane...]}: one
//	                            entry per open sync stream (two with one
//	                            gateway_id are both flagged duplicate),
//	                            and one per gateway whose stream ended,
//	                            until it reconnects or DataPlanes.Expiry
//	                            passes
//	DELETE /api/dataplanes/{id} forget the ended streams of gateway id
//	                            → {"removed", "connected"}; 409 when it
//	                            has only an open stream, 404 when unknown
//	GET    /api/usage/keys/{hash}
//	                            the global-quota ledger's entries of the
//	                            key, from the data planes' reports → Usage
//	                            (404 when the store keeps no ledger)
//	GET    /api/usage/dataplanes
//	                            every data plane's totals over the ledger
//	                            → {"dataplanes": [DataPlaneUsage...]}
//
// {hash} is "sha256:" and 64 hex digits in either case; keys are answered
// with it in lower case. Quota epochs (quota_epoch) are the control
// plane's: values in bodies are ignored (see withEpochs for the rule).
// GET answers carry the revision read in the Limitplane-Revision header.
// Bodies are bounded by MaxBodyBytes, those of :batch and import by
// MaxBulkBytes (413 beyond). While the store's database is unavailable
// (ErrStoreUnavailable), every call that reads or writes the state
// answers 503 with Retry-After: UnavailableRetryAfter, and a write has
// changed nothing.
// A body of JSON null is refused (400) like an empty one; a policy with
// neither rate nor quota is valid (spec.Policy: it limits nothing, and
// may still restrict a key to its apis). A method an existing path does
// not serve answers 405 with an Allow header; an unknown path, 404; a
// path that is not clean ("/api/keys/../policies/x", "//"), 400 (never a
// redirect a client would follow with its PUT or DELETE). A write with a
// body must say Content-Type: application/json (a charset=utf-8
// parameter is fine); anything else, or none, is 415, and so is a
// non-JSON Content-Type on a write without a body.
func Admin(o AdminOptions) (http.Handler, error) {
	if o.Store == nil {
		return nil, errors.New("controlplane: admin: no store")
	}
	if o.Token == "" {
		return nil, errors.New("controlplane: admin: no token (the admin API never runs without one)")
	}
	if err := CheckToken(o.Token); err != nil {
		return nil, fmt.Errorf("controlplane: admin: the token %w", err)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1 << 20
	}
	if o.MaxBulkBytes <= 0 {
		o.MaxBulkBytes = DefaultMaxBulkBytes
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DataPlanes == nil {
		o.DataPlanes = &DataPlanes{}
	}
	a := &admin{o: o, token: sha256.Sum256([]byte(o.Token)), tokenID: TokenID(o.Token),
		refusals: failurelog.New(o.Log, failurelog.Options{Msg: "controlplane: admin call refused: missing or wrong bearer token"}),
		outages:  failurelog.New(o.Log, failurelog.Options{Msg: "controlplane: admin call failed: the store's database is unavailable"})}
	mux := http.NewServeMux()
	routes := []struct {
		method, pattern string
		h               http.HandlerFunc
	}{
		{"GET", "/api/policies", a.listPolicies},
		{"PUT", "/api/policies/{id}", a.putPolicy},
		{"GET", "/api/policies/{id}", a.getPolicy},
		{"DELETE", "/api/policies/{id}", a.deletePolicy},
		{"GET", "/api/apis", a.listAPIs},
		{"PUT", "/api/apis/{id}", a.putAPI},
		{"GET", "/api/apis/{id}", a.getAPI},
		{"DELETE", "/api/apis/{id}", a.deleteAPI},
		{"GET", "/api/keys", a.listKeys},
		{"POST", "/api/keys", a.postKey},
		{"PUT", "/api/keys/{hash}", a.putKey},
		{"GET", "/api/keys/{hash}", a.getKey},
		{"DELETE", "/api/keys/{hash}", a.deleteKey},
		{"POST", "/api/keys/{hash}/reset-quota", a.resetQuota},
		{"POST", "/api/keys:batch", a.postKeysBatch},
		{"GET", "/api/export", a.export},
		{"POST", "/api/import", a.importState},
		{"GET", "/api/revision", a.revision},
		{"GET", "/api/dataplanes", a.dataPlanes},
		{"DELETE", "/api/dataplanes/{id}", a.deleteDataPlane},
		{"GET", "/api/usage/keys/{hash}", a.keyUsage},
		{"GET", "/api/usage/dataplanes", a.dataPlaneUsage},
	}
	allow := map[string][]string{} // pattern → its methods
	for _, rt := range routes {
		mux.HandleFunc(rt.method+" "+rt.pattern, rt.h)
		if rt.method == "GET" {
			allow[rt.pattern] = append(allow[rt.pattern], "HEAD")
		}
		allow[rt.pattern] = append(allow[rt.pattern], rt.method)
	}
	for pattern, methods := range allow {
		slices.Sort(methods)
		allowed := strings.Join(methods, ", ")
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allowed)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allowed), nil)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint", nil)
	})
	return cleanPaths(a.authenticate(onceParams(jsonWrites(mux)))), nil
}

// onceParams answers 400 to a query that does not parse or gives a
// parameter more than once (?limit=1&limit=2): which one was meant is not
// for the control plane to guess.
func onceParams(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			q, err := url.ParseQuery(r.URL.RawQuery)
			if err != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("query %q does not parse: %v", r.URL.RawQuery, err), nil)
				return
			}
			for name, vs := range q {
				if len(vs) > 1 {
					writeError(w, http.StatusBadRequest, fmt.Sprintf("?%s given %d times: give it once", name, len(vs)), nil)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// cleanPaths answers 400 to a path that is not clean (a "." or ".."
// segment, or "//"), which http.ServeMux would answer with a redirect to
// the cleaned path: a client that follows it would send its PUT or DELETE
// to another object than the one it named.
func cleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		clean := path.Clean("/" + p)
		if strings.HasSuffix(p, "/") && clean != "/" {
			clean += "/"
		}
		if p != clean {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q is not clean (no \".\" or \"..\" segments, no \"//\")", p), nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// jsonWrites answers 415 to a write (PUT, POST, PATCH, DELETE) whose
// Content-Type is set and is not JSON (see isJSON); decode also refuses a
// body without one.
func jsonWrites(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete:
			if ct := r.Header.Get("Content-Type"); ct != "" && !isJSON(ct) {
				unsupportedType(w, ct)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// isJSON reports whether the Content-Type ct is application/json, with
// no parameter but charset=utf-8 (any case).
func isJSON(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}

func unsupportedType(w http.ResponseWriter, ct string) {
	w.Header().Set("Accept", "application/json")
	writeError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: writes take application/json", ct), nil)
}

type admin struct {
	o       AdminOptions
	token   [sha256.Size]byte
	tokenID string // TokenID of the token, for audit lines
	// refusals logs refused calls. Its timer runs only for an interval
	// after a line, so it needs no stopping.
	refusals *failurelog.Log
	// outages logs calls failed by ErrStoreUnavailable, like refusals.
	outages *failurelog.Log
}

// authenticate refuses calls without the bearer token with 401: no
// Authorization field, more than one, another scheme than Bearer (in any
// case), or a wrong token (identity.BearerToken parses it as the gateway
// does). The body says which, in the gateway's words ("ambiguous
// credentials: more than one header Authorization", "wrong bearer
// token"); what the caller sent is no secret to the caller. The tokens are
// compared as SHA-256 digests in constant time, so neither the token nor
// its length leaks through timing.
func (a *admin) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, err := identity.BearerToken(r.Header.Values("Authorization"))
		sum := sha256.Sum256([]byte(got))
		if err != nil || subtle.ConstantTimeCompare(sum[:], a.token[:]) != 1 {
			reason := "wrong bearer token"
			var ie *identity.Error
			if errors.As(err, &ie) {
				reason = ie.Reason
			}
			a.o.Metrics.refusedAdmin()
			a.refusals.Failed(fmt.Errorf("%s %q from %s: %s", r.Method, r.URL.Path, r.RemoteAddr, reason))
			w.Header().Set("WWW-Authenticate", `Bearer realm="limitplane control plane"`)
			writeError(w, http.StatusUnauthorized, reason, nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// httpError is an answer other than 200 chosen inside a transaction.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func notFound(format string, args ...any) error {
	return &httpError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

// written is the answer to a successful write.
type written struct {
	KeyHash  string `json:"key_hash,omitempty"`
	Revision uint64 `json:"revision"`
}

// update runs fn in a write and answers {"revision"} (with keyHash when
// not ""), or the error. It writes the audit line: an INFO line
// "controlplane: admin write" with the token's TokenID, the method, the
// path and the new revision, or the error.
func (a *admin) update(w http.ResponseWriter, r *http.Request, status int, keyHash string, fn func(tx Tx) error) {
	rev, err := a.write(r, fn)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, status, written{KeyHash: keyHash, Revision: rev})
}

// write runs fn in one store write for r and accounts for it, whatever
// the endpoint (one object, a batch, an import): the write metrics, the
// revision gauge and the audit line, with the new revision or the error.
func (a *admin) write(r *http.Request, fn func(tx Tx) error) (uint64, error) {
	start := time.Now()
	rev, err := a.o.Store.Update(r.Context(), fn)
	a.o.Metrics.write(time.Since(start), rev, err)
	if err != nil {
		a.o.Log.Info("controlplane: admin write", "token", a.tokenID, "method", r.Method, "path", r.URL.RequestURI(), "error", err)
		return 0, err
	}
	a.o.Log.Info("controlplane: admin write", "token", a.tokenID, "method", r.Method, "path", r.URL.RequestURI(), "revision", rev)
	return rev, nil
}

// UnavailableRetryAfter is the Retry-After, in seconds, of the 503 the
// admin API answers while the store's database is unavailable
// (ErrStoreUnavailable): a database failover takes seconds, and a client
// that retries sooner only adds load to one coming back.
const UnavailableRetryAfter = 2

// fail answers err: its own status for an httpError, 422 with the
// problems for spec.Errors, 503 with Retry-After (UnavailableRetryAfter)
// for ErrStoreUnavailable, whatever the call (a write changed nothing
// and may be retried, unless ErrCommitUnknown says it may have been made;
// a read may be retried), 503 for a call its client
// gave up, 500 (logged) otherwise. Store outages are logged a line per
// failurelog interval, not one per call.
func (a *admin) fail(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	var errs spec.Errors
	switch {
	case errors.As(err, &he):
		writeError(w, he.status, he.msg, nil)
	case errors.As(err, &errs):
		writeError(w, http.StatusUnprocessableEntity, "the change would leave an invalid configuration; nothing was changed", errs)
	case errors.Is(err, ErrStoreUnavailable):
		a.outages.Failed(fmt.Errorf("%s %s: %w", r.Method, r.URL.Path, err))
		what := "nothing was read"
		switch {
		case errors.Is(err, ErrCommitUnknown):
			what = "the change may have been made (the connection was lost during its commit): read the state before making it again"
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			what = "nothing was changed"
		}
		w.Header().Set("Retry-After", strconv.Itoa(UnavailableRetryAfter))
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("the control plane's database is unavailable; %s; retry in a few seconds (%v)", what, err), nil)
	case errors.Is(err, context.Canceled):
		writeError(w, http.StatusServiceUnavailable, err.Error(), nil)
	default:
		a.o.Log.Error("controlplane: admin call failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, err.Error(), nil)
	}
}

// decode reads the body as JSON into v, refusing (415) a Content-Type
// other than application/json (charset=utf-8 allowed) or none, (400) an
// empty body, a
// JSON null, an object that names a member twice (encoding/json would
// keep the last), unknown fields and trailing data, and (422, naming the
// field) a duration that is not a string.
func (a *admin) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return a.decodeLimit(w, r, v, a.o.MaxBodyBytes)
}

// decodeLimit is decode with a body of at most limit bytes.
func (a *admin) decodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	if ct := r.Header.Get("Content-Type"); !isJSON(ct) {
		unsupportedType(w, ct)
		return false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body: %v", err), nil)
		return false
	}
	if !utf8.Valid(body) {
		// encoding/json would put U+FFFD for each bad byte: a key, id or
		// secret other than the one sent.
		writeError(w, http.StatusBadRequest, "body is not valid UTF-8", nil)
		return false
	}
	if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		writeError(w, http.StatusBadRequest, "body is JSON null; want a JSON object", nil)
		return false
	}
	dup, err := duplicateMember(body)
	switch {
	case errors.Is(err, errTooDeep):
		writeError(w, http.StatusBadRequest, "body is "+err.Error()+"; nothing was changed", nil)
		return false
	case err == nil && dup != "":
		writeError(w, http.StatusBadRequest, fmt.Sprintf("body names member %s twice", dup), nil)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if path, problem, ok := spec.DurationTypeProblem(err); ok {
			msg := "body has a duration that is not a string; nothing was changed"
			if spec.RefusedDurationString(err) {
				msg = "body has a string that is not a duration; nothing was changed"
			}
			writeError(w, http.StatusUnprocessableEntity, msg, spec.Errors{{Path: durationPath(body, path, err), Problem: problem}})
			return false
		}
		if path, problem, ok := spec.TypeProblem(err); ok {
			writeError(w, http.StatusUnprocessableEntity, "body has a value of the wrong type; nothing was changed", spec.Errors{{Path: valuePath(body, path), Problem: problem}})
			return false
		}
		if path, problem, ok := timeProblem(body, err); ok {
			writeError(w, http.StatusUnprocessableEntity, "body has a string that is not a time; nothing was changed", spec.Errors{{Path: path, Problem: problem}})
			return false
		}
		writeError(w, http.StatusBadRequest, fmt.Sprintf("body is not valid JSON for this object: %v", err), nil)
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "body has data after the JSON object", nil)
		return false
	}
	return true
}

// sameID checks that a body's ID is empty or the path's.
func sameID(w http.ResponseWriter, field, body, path string) bool {
	if body != "" && body != path {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s %q in the body differs from %q in the path", field, body, path), nil)
		return false
	}
	return true
}

func (a *admin) putPolicy(w http.ResponseWriter, r *http.Request) {
	var p spec.Policy
	id := r.PathValue("id")
	if !a.decode(w, r, &p) || !sameID(w, "id", p.ID, id) {
		return
	}
	p.ID = id
	a.update(w, r, http.StatusOK, "", func(tx Tx) error { return tx.PutPolicy(p) })
}

func (a *admin) getPolicy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.get(w, r, func(rd Reader) (any, error) {
		p, err := rd.Policy(id)
		if p == nil && err == nil {
			return nil, notFound("no policy %q", id)
		}
		return p, err
	})
}

func (a *admin) deletePolicy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.update(w, r, http.StatusOK, "", func(tx Tx) error {
		return deleted(tx.DeletePolicy(id))("no policy %q", id)
	})
}

func (a *admin) putAPI(w http.ResponseWriter, r *http.Request) {
	var api spec.API
	id := r.PathValue("id")
	if !a.decode(w, r, &api) || !sameID(w, "id", api.ID, id) {
		return
	}
	api.ID = id
	a.update(w, r, http.StatusOK, "", func(tx Tx) error { return tx.PutAPI(api) })
}

func (a *admin) getAPI(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.get(w, r, func(rd Reader) (any, error) {
		api, err := rd.API(id)
		if api == nil && err == nil {
			return nil, notFound("no API %q", id)
		}
		return api, err
	})
}

func (a *admin) deleteAPI(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.update(w, r, http.StatusOK, "", func(tx Tx) error {
		return deleted(tx.DeleteAPI(id))("no API %q", id)
	})
}

// deleted turns a Tx delete's result into nil, its error, or a 404 with
// the message it is given.
func deleted(ok bool, err error) func(format string, args ...any) error {
	return func(format string, args ...any) error {
		if err != nil {
			return err
		}
		if !ok {
			return notFound(format, args...)
		}
		return nil
	}
}

// newKey is POST /api/keys's body: a key given in plaintext or by hash.
type newKey struct {
	spec.Key
	// Plain is the key in plaintext; it is hashed at once and never
	// kept.
	Plain string `json:"key,omitempty"`
}

func (a *admin) postKey(w http.ResponseWriter, r *http.Request) {
	var nk newKey
	if !a.decode(w, r, &nk) {
		return
	}
	k := nk.Key
	switch {
	case nk.Plain != "" && k.KeyHash != "":
		writeError(w, http.StatusBadRequest, "give the key in plaintext (key) or by hash (key_hash), not both", nil)
		return
	case nk.Plain != "":
		if !checkKey(w, "key", nk.Plain) {
			return
		}
		k.KeyHash = identity.HashKey(nk.Plain).String()
	case k.KeyHash == "":
		writeError(w, http.StatusBadRequest, "missing key (plaintext) or key_hash", nil)
		return
	}
	h, ok := parseHash(w, k.KeyHash)
	if !ok {
		return
	}
	k.KeyHash = h
	a.update(w, r, http.StatusCreated, h, func(tx Tx) error {
		old, err := tx.Key(h)
		switch {
		case err != nil:
			return err
		case old != nil:
			return &httpError{http.StatusConflict, fmt.Sprintf("key %s exists; PUT /api/keys/%s replaces it", h, h)}
		}
		return tx.PutKey(withEpochs(k, nil, tx.Revision(), false))
	})
}

// checkKey applies the gateway's key rules (identity.CheckKey) to a
// plaintext key, answering 422 with the problem at path when it breaks
// them: the gateway's file refuses such a key with the same words, and
// no gateway could ever authenticate it.
func checkKey(w http.ResponseWriter, path, key string) bool {
	if err := identity.CheckKey(key); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "no gateway would accept this key; nothing was changed",
			spec.Errors{{Path: path, Problem: strings.TrimPrefix(err.Error(), "identity: ")}})
		return false
	}
	return true
}

// parseHash returns hash in lower case, or answers 400.
func parseHash(w http.ResponseWriter, hash string) (string, bool) {
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("key hash %q is not sha256:<64 hex digits>", hash), nil)
		return "", false
	}
	return h.String(), true
}

// flag reads a boolean query parameter: absent is false; 1, true, 0 and
// false (strconv.ParseBool) are accepted; anything else answers 400.
func flag(w http.ResponseWriter, r *http.Request, name string) (value, ok bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, true
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("?%s=%q: want 1 or 0", name, s), nil)
		return false, false
	}
	return v, true
}

func (a *admin) putKey(w http.ResponseWriter, r *http.Request) {
	h, ok := parseHash(w, r.PathValue("hash"))
	if !ok {
		return
	}
	suppress, ok := flag(w, r, "suppress_reset")
	if !ok {
		return
	}
	var k spec.Key
	if !a.decode(w, r, &k) {
		return
	}
	if k.KeyHash != "" {
		bh, err := identity.ParseKeyHash(k.KeyHash)
		if err != nil || bh.String() != h {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("key_hash %q in the body differs from %q in the path", k.KeyHash, h), nil)
			return
		}
	}
	k.KeyHash = h
	a.update(w, r, http.StatusOK, h, func(tx Tx) error {
		old, err := tx.Key(h)
		if err != nil {
			return err
		}
		return tx.PutKey(withEpochs(k, old, tx.Revision(), !suppress))
	})
}

func (a *admin) getKey(w http.ResponseWriter, r *http.Request) {
	h, ok := parseHash(w, r.PathValue("hash"))
	if !ok {
		return
	}
	a.get(w, r, func(rd Reader) (any, error) {
		k, err := rd.Key(h)
		if k == nil && err == nil {
			return nil, notFound("no key %s", h)
		}
		return k, err
	})
}

func (a *admin) deleteKey(w http.ResponseWriter, r *http.Request) {
	h, ok := parseHash(w, r.PathValue("hash"))
	if !ok {
		return
	}
	a.update(w, r, http.StatusOK, h, func(tx Tx) error {
		return deleted(tx.DeleteKey(h))("no key %s", h)
	})
}

func (a *admin) resetQuota(w http.ResponseWriter, r *http.Request) {
	h, ok := parseHash(w, r.PathValue("hash"))
	if !ok {
		return
	}
	api := r.URL.Query().Get("api")
	a.update(w, r, http.StatusOK, h, func(tx Tx) error {
		k, err := tx.Key(h)
		switch {
		case err != nil:
			return err
		case k == nil:
			return notFound("no key %s", h)
		}
		reset, ok := resetEpochs(*k, api, tx.Revision())
		if !ok {
			return &httpError{http.StatusConflict, fmt.Sprintf("key %s has no api_limits entry for API %q; reset its quotas without ?api=", h, api)}
		}
		return tx.PutKey(reset)
	})
}

// DefaultKeysLimit and MaxKeysLimit are GET /api/keys's default and
// largest page sizes (?limit=), in keys.
const (
	DefaultKeysLimit = 100
	MaxKeysLimit     = 1000
)

func (a *admin) listPolicies(w http.ResponseWriter, r *http.Request) {
	a.get(w, r, func(rd Reader) (any, error) {
		ps, err := rd.Policies()
		if ps == nil {
			ps = []spec.Policy{}
		}
		return struct {
			Revision uint64        `json:"revision"`
			Policies []spec.Policy `json:"policies"`
		}{rd.Revision(), ps}, err
	})
}

func (a *admin) listAPIs(w http.ResponseWriter, r *http.Request) {
	a.get(w, r, func(rd Reader) (any, error) {
		as, err := rd.APIs()
		if as == nil {
			as = []spec.API{}
		}
		return struct {
			Revision uint64     `json:"revision"`
			APIs     []spec.API `json:"apis"`
		}{rd.Revision(), as}, err
	})
}

func (a *admin) listKeys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after := q.Get("after")
	if after != "" {
		h, ok := parseHash(w, after)
		if !ok {
			return
		}
		after = h
	}
	limit := DefaultKeysLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxKeysLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("?limit=%q: want 1 to %d", s, MaxKeysLimit), nil)
			return
		}
		limit = n
	}
	a.get(w, r, func(rd Reader) (any, error) {
		ks, err := rd.Keys(after, limit+1)
		if err != nil {
			return nil, err
		}
		next := ""
		if len(ks) > limit {
			ks = ks[:limit]
			next = ks[limit-1].KeyHash
		}
		return struct {
			Revision uint64     `json:"revision"`
			Keys     []spec.Key `json:"keys"`
			Next     string     `json:"next"`
		}{rd.Revision(), ks, next}, nil
	})
}

func (a *admin) revision(w http.ResponseWriter, r *http.Request) {
	var rev uint64
	if err := a.o.Store.View(r.Context(), func(rd Reader) error { rev = rd.Revision(); return nil }); err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, written{Revision: rev})
}

func (a *admin) dataPlanes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		DataPlanes []DataPlane `json:"dataplanes"`
	}{a.o.DataPlanes.List()})
}

// deleteDataPlane forgets the ended streams of a gateway.
func (a *admin) deleteDataPlane(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	removed, connected := a.o.DataPlanes.Remove(id)
	switch {
	case removed == 0 && connected:
		writeError(w, http.StatusConflict, fmt.Sprintf("gateway %q has an open sync stream; its entry stays until the stream ends", id), nil)
		return
	case removed == 0:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no gateway %q", id), nil)
		return
	}
	a.o.Log.Info("controlplane: admin write", "token", a.tokenID, "method", r.Method, "path", r.URL.RequestURI(), "removed", removed)
	writeJSON(w, http.StatusOK, struct {
		Removed   int  `json:"removed"`
		Connected bool `json:"connected"`
	}{removed, connected})
}

// get answers the object fn reads, with the revision read.
func (a *admin) get(w http.ResponseWriter, r *http.Request, fn func(rd Reader) (any, error)) {
	var v any
	var rev uint64
	err := a.o.Store.View(r.Context(), func(rd Reader) error {
		var err error
		v, err = fn(rd)
		rev = rd.Revision()
		return err
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Limitplane-Revision", strconv.FormatUint(rev, 10))
	writeJSON(w, http.StatusOK, v)
}

// problem is one validation problem in an error answer.
type problem struct {
	Path    string `json:"path"`
	Problem string `json:"problem"`
}

// errorBody is every error answer.
type errorBody struct {
	Error    string    `json:"error"`
	Problems []problem `json:"problems,omitempty"`
	// MoreProblems counts the problems left out after MaxProblems.
	MoreProblems int `json:"more_problems,omitempty"`
}

func writeError(w http.ResponseWriter, status int, msg string, errs spec.Errors) {
	b := errorBody{Error: msg}
	for i, e := range errs {
		if i == MaxProblems {
			b.MoreProblems = len(errs) - i
			break
		}
		b.Problems = append(b.Problems, problem{e.Path, e.Problem})
	}
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
