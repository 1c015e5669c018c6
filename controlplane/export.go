package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// ExportFormatVersion is the version of the document GET /api/export
// writes and POST /api/import reads:
//
//	{"format_version": 1, "revision": N,
//	 "policies": [Policy...], "apis": [API...], "keys": [Key...]}
//
// revision is the revision the export was read at (informational: an
// import does not take it). An import refuses any other format_version
// (422); a document without one is read as version 1, the shape exports
// had before the field existed. A later version that changes the shape
// raises the number, so an older control plane refuses its documents
// instead of misreading them.
const ExportFormatVersion = 1

// exportPage is how many keys an export, and an import's walk over the
// keys it replaces, read at a time.
const exportPage = 1000

// ioDeadline is how long one read of an import's body, or one write of
// an export's answer, may take: the server's ReadTimeout and WriteTimeout
// bound a whole request, which a million keys may outlast, so these
// handlers move the deadline forward as the document flows.
const ioDeadline = 30 * time.Second

// export writes the whole state as one document of ExportFormatVersion,
// read in one view: policies and APIs in ID order, keys in hash order,
// each as GET answers it (quota epochs included; keys by hash, never in
// plaintext; JWT secrets as spec keeps them: references, or an inline
// secret only when an operator wrote one). Every API is in it, whatever
// its tags. Keys are written a page (exportPage) at a time, so the
// document is never held in memory; each write may take ioDeadline. A
// store failure before the first byte is answered like any read (503
// for ErrStoreUnavailable); after it, the connection is aborted, so a
// truncated document is never a valid one (an import refuses it).
func (a *admin) export(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	started := false
	err := a.o.Store.View(r.Context(), func(rd Reader) error {
		policies, err := rd.Policies()
		if err != nil {
			return err
		}
		apis, err := rd.APIs()
		if err != nil {
			return err
		}
		if policies == nil {
			policies = []spec.Policy{}
		}
		if apis == nil {
			apis = []spec.API{}
		}
		head, err := json.Marshal(struct {
			FormatVersion int           `json:"format_version"`
			Revision      uint64        `json:"revision"`
			Policies      []spec.Policy `json:"policies"`
			APIs          []spec.API    `json:"apis"`
		}{ExportFormatVersion, rd.Revision(), policies, apis})
		if err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Limitplane-Revision", strconv.FormatUint(rd.Revision(), 10))
		w.WriteHeader(http.StatusOK)
		started = true
		write := func(b []byte) error {
			_ = rc.SetWriteDeadline(time.Now().Add(ioDeadline)) // ErrNotSupported: the server's own
			_, err := w.Write(b)
			return err
		}
		// head ends in "}": the keys go before it.
		if err := write(append(head[:len(head)-1], `,"keys":[`...)); err != nil {
			return err
		}
		after, n := "", 0
		var buf []byte
		for {
			ks, err := rd.Keys(after, exportPage)
			if err != nil {
				return err
			}
			buf = buf[:0]
			for _, k := range ks {
				if n > 0 {
					buf = append(buf, ',')
				}
				b, err := json.Marshal(k)
				if err != nil {
					return err
				}
				buf = append(buf, b...)
				n++
			}
			if err := write(buf); err != nil {
				return err
			}
			if len(ks) < exportPage {
				break
			}
			after = ks[len(ks)-1].KeyHash
		}
		return write([]byte("]}\n"))
	})
	switch {
	case err == nil:
	case !started:
		a.fail(w, r, err)
	default:
		a.o.Log.Error("controlplane: export failed after it started; connection aborted", "err", err)
		panic(http.ErrAbortHandler)
	}
}

// importState replaces the whole state with an export document, in one
// write (one revision):
//
//   - the body is read as a stream (bounded by MaxBulkBytes: 413
//     beyond), one object at a time, so the document is never held in
//     memory as one piece: only the decoded objects are;
//   - a body that is not one JSON object, is truncated, names a member
//     twice or one an export does not have, or is not UTF-8 is 400; a
//     format_version other than ExportFormatVersion, and objects that do
//     not decode (unknown fields, a duration that is not a string), are
//     422 listing every problem by position (keys[5].api_limits.eu.rate.per);
//   - the whole document is validated (spec's ValidateSharded, paths by
//     position: 422, nothing changed), and the store validates the state
//     it leaves again, as every write;
//   - then, in one Store.Update, every object the document lacks is
//     deleted and every one it holds that differs from the store's is
//     put as given. An import that changes nothing leaves the revision
//     alone.
//
// What travels and what does not: keys keep their quota epochs (the
// data planes' counters are named with them, so quota periods continue
// when data planes move to the target); later resets on the target
// raise an epoch above the imported one whatever the target's revision
// (see withEpochs). The document's revision is not taken: the target
// numbers on from its own, and keeps its own history id (Store.History),
// so a data plane that followed the source is sent a snapshot when it
// connects to the target.
func (a *admin) importState(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); !isJSON(ct) {
		unsupportedType(w, ct)
		return
	}
	rc := http.NewResponseController(w)
	body := &deadlineReader{r: http.MaxBytesReader(w, r.Body, a.o.MaxBulkBytes), rc: rc}
	s, err := decodeExport(body)
	var ip *importProblems
	var errs spec.Errors
	switch {
	case errors.As(err, &ip):
		writeError(w, http.StatusUnprocessableEntity, ip.msg, ip.errs)
		return
	case errors.As(err, &errs):
		writeError(w, http.StatusUnprocessableEntity, "the document is not a valid configuration; nothing was changed", errs)
		return
	case err != nil:
		a.fail(w, r, err)
		return
	}
	// The body is read. net/http cleared the read deadline for its read
	// of the idle connection (which cancels the request when it fails),
	// but a read of the decoder after the body's end set it again: clear
	// it, or a write longer than ioDeadline would be canceled.
	_ = rc.SetReadDeadline(time.Time{})
	rev, err := a.write(r, func(tx Tx) error { return replaceState(tx, s) })
	_ = rc.SetWriteDeadline(time.Now().Add(ioDeadline))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, written{Revision: rev})
}

// deadlineReader moves the connection's read deadline ioDeadline ahead
// of every read.
type deadlineReader struct {
	r  io.Reader
	rc *http.ResponseController
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	_ = d.rc.SetReadDeadline(time.Now().Add(ioDeadline)) // ErrNotSupported: the server's own
	return d.r.Read(p)
}

// importProblems is the 422 of a document whose objects do not decode.
type importProblems struct {
	msg  string
	errs spec.Errors
}

func (e *importProblems) Error() string { return e.msg + ": " + e.errs.Error() }

// badDocument is a 400 of an import.
func badDocument(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// readFailure turns an error of the JSON decoder over an import's body
// into its answer: 413 beyond the body's bound, 400 otherwise.
func readFailure(err error) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("body: larger than %d bytes (AdminOptions.MaxBulkBytes); nothing was changed", mbe.Limit)}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return badDocument("body ends before the document does (truncated?); nothing was changed")
	}
	return badDocument("body is not valid JSON: %v; nothing was changed", strings.TrimPrefix(err.Error(), "json: "))
}

// exportMembers are the members of an export document, by their name
// folded as encoding/json matches names (see duplicateMember).
var exportMembers = []string{"format_version", "revision", "policies", "apis", "keys"}

// decodeExport reads one export document from body, an object at a
// time, and returns it as a snapshot whose keys' hashes are in lower
// case (when they parse), validated whole. Errors are answers:
// *httpError (400, 413), *importProblems and spec.Errors (422).
func decodeExport(body io.Reader) (*spec.Snapshot, error) {
	dec := json.NewDecoder(body)
	dec.UseNumber()
	tok, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return nil, badDocument("body is empty; want an export document (GET /api/export)")
	case err != nil:
		return nil, readFailure(err)
	case tok == nil:
		return nil, badDocument("body is JSON null; want a JSON object")
	case tok != json.Delim('{'):
		return nil, badDocument("body is not a JSON object; want an export document (GET /api/export)")
	}
	s := &spec.Snapshot{}
	var problems spec.Errors
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, readFailure(err)
		}
		name, _ := tok.(string)
		folded := strings.ToLower(strings.ToUpper(name))
		if seen[folded] {
			return nil, badDocument("body names member %s twice", memberPath("", name))
		}
		seen[folded] = true
		if !slices.Contains(exportMembers, folded) {
			return nil, badDocument("body has member %s, which an export document does not (it has %s)", memberPath("", name), strings.Join(exportMembers, ", "))
		}
		switch folded {
		case "format_version":
			var n json.RawMessage
			if err := dec.Decode(&n); err != nil {
				return nil, readFailure(err)
			}
			if v, err := strconv.Atoi(string(n)); err != nil || v != ExportFormatVersion {
				return nil, &importProblems{"the document's format version is unknown; nothing was changed", spec.Errors{{Path: "format_version",
					Problem: fmt.Sprintf("%.40s: this control plane reads version %d; export with a control plane of this version or an older one", n, ExportFormatVersion)}}}
			}
		case "revision":
			var n json.RawMessage
			if err := dec.Decode(&n); err != nil {
				return nil, readFailure(err)
			}
			if _, err := strconv.ParseUint(string(n), 10, 64); err != nil {
				problems = append(problems, &spec.Error{Path: "revision", Problem: fmt.Sprintf("%.40s is not a revision (a whole number from 0)", n)})
			}
		case "policies":
			err = eachElement(dec, "policies", &problems, func(at string, raw json.RawMessage) *spec.Error {
				var p spec.Policy
				if e := decodeObject(at, "policy", raw, &p); e != nil {
					return e
				}
				s.Policies = append(s.Policies, p)
				return nil
			})
		case "apis":
			err = eachElement(dec, "apis", &problems, func(at string, raw json.RawMessage) *spec.Error {
				var api spec.API
				if e := decodeObject(at, "API", raw, &api); e != nil {
					return e
				}
				s.APIs = append(s.APIs, api)
				return nil
			})
		case "keys":
			err = eachElement(dec, "keys", &problems, func(at string, raw json.RawMessage) *spec.Error {
				var k spec.Key
				if e := decodeObject(at, "key", raw, &k); e != nil {
					return e
				}
				if h, err := identity.ParseKeyHash(k.KeyHash); err == nil {
					k.KeyHash = h.String() // as the store keeps it; a bad one is Validate's
				}
				s.Keys = append(s.Keys, k)
				return nil
			})
		}
		if err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, readFailure(err)
	}
	switch _, err := dec.Token(); {
	case errors.Is(err, io.EOF):
	case err == nil:
		return nil, badDocument("body has data after the JSON object")
	default:
		return nil, readFailure(err)
	}
	// An import replaces the whole state, so a document that leaves a list
	// out (a hand-written {"policies": [...]} meant as a partial update, or
	// {}) would delete all of it: each list must be there, [] to empty it.
	var missing spec.Errors
	for _, m := range []string{"policies", "apis", "keys"} {
		if !seen[m] {
			missing = append(missing, &spec.Error{Path: m, Problem: "missing: give every list (an empty list, [], deletes them all)"})
		}
	}
	if len(missing) > 0 {
		return nil, &importProblems{"the document leaves a list out, and an import replaces the whole state; nothing was changed", missing}
	}
	if len(problems) > 0 {
		return nil, &importProblems{"the document has objects that cannot be read; nothing was changed", problems}
	}
	if err := s.ValidateSharded(); err != nil {
		return nil, err
	}
	return s, nil
}

// eachElement reads the array (or null) that is the value of member and
// calls fn with each element's JSON and path (keys[3]), each element
// checked to be UTF-8 and to name no member twice first. fn's problems,
// and those of those checks that do not end the read, go to problems.
func eachElement(dec *json.Decoder, member string, problems *spec.Errors, fn func(at string, raw json.RawMessage) *spec.Error) error {
	tok, err := dec.Token()
	switch {
	case err != nil:
		return readFailure(err)
	case tok == nil:
		return nil
	case tok != json.Delim('['):
		return &importProblems{"the document cannot be read; nothing was changed", spec.Errors{{Path: member, Problem: "not a list"}}}
	}
	for i := 0; dec.More(); i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return readFailure(err)
		}
		at := member + "[" + strconv.Itoa(i) + "]"
		if !utf8.Valid(raw) {
			// encoding/json would put U+FFFD for each bad byte: an id, a
			// key hash or a secret other than the one sent.
			return badDocument("body is not valid UTF-8 (in %s)", at)
		}
		dup, err := duplicateMember(raw)
		switch {
		case errors.Is(err, errTooDeep):
			return badDocument("%s is %v", at, err)
		case err == nil && dup != "":
			return badDocument("body names member %s twice", at+"."+dup)
		}
		if e := fn(at, raw); e != nil {
			*problems = append(*problems, e)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return readFailure(err)
	}
	return nil
}

// decodeObject decodes the element at path at into v (a spec object,
// what names it in problems), or returns its problem: a duration that is
// not a string at its exact path, anything else at the element's.
func decodeObject(at, what string, raw json.RawMessage, v any) *spec.Error {
	err := decodeStrict(raw, v)
	if err == nil {
		return nil
	}
	if path, problem, ok := spec.DurationTypeProblem(err); ok {
		return &spec.Error{Path: at + "." + durationPath(raw, path, err), Problem: problem}
	}
	if path, problem, ok := timeProblem(raw, err); ok {
		return &spec.Error{Path: at + "." + path, Problem: problem}
	}
	return &spec.Error{Path: at, Problem: "not a " + what + ": " + strings.TrimPrefix(err.Error(), "json: ")}
}

// replaceState makes tx's state s (valid, its keys' hashes in lower
// case): it deletes what s lacks and puts what it holds and tx holds
// otherwise. Keys are walked in hash order beside s's, a page at a
// time, so no second index of a million hashes is built. s's keys are
// sorted by hash.
func replaceState(tx Tx, s *spec.Snapshot) error {
	slices.SortFunc(s.Keys, func(a, b spec.Key) int { return strings.Compare(a.KeyHash, b.KeyHash) })
	// changed[i] says whether s.Keys[i] differs from the stored key.
	changed := make([]bool, len(s.Keys))
	for i := range changed {
		changed[i] = true
	}
	i := 0
	for after := ""; ; {
		ks, err := tx.Keys(after, exportPage)
		if err != nil {
			return err
		}
		for _, k := range ks {
			for i < len(s.Keys) && s.Keys[i].KeyHash < k.KeyHash {
				i++
			}
			if i < len(s.Keys) && s.Keys[i].KeyHash == k.KeyHash {
				same, err := sameJSON(k, s.Keys[i])
				if err != nil {
					return err
				}
				changed[i] = !same
				continue
			}
			if _, err := tx.DeleteKey(k.KeyHash); err != nil {
				return err
			}
		}
		if len(ks) < exportPage {
			break
		}
		after = ks[len(ks)-1].KeyHash
	}
	policies, err := tx.Policies()
	if err != nil {
		return err
	}
	if err := replaceObjects(policies, s.Policies, func(p spec.Policy) string { return p.ID }, tx.DeletePolicy, tx.PutPolicy); err != nil {
		return err
	}
	apis, err := tx.APIs()
	if err != nil {
		return err
	}
	if err := replaceObjects(apis, s.APIs, func(a spec.API) string { return a.ID }, tx.DeleteAPI, tx.PutAPI); err != nil {
		return err
	}
	for i, k := range s.Keys {
		if !changed[i] {
			continue
		}
		if err := tx.PutKey(k); err != nil {
			return err
		}
	}
	return nil
}

// replaceObjects makes the stored objects have the wanted ones: it
// deletes those want lacks and puts those that differ or are new.
func replaceObjects[T any](have, want []T, id func(T) string, del func(string) (bool, error), put func(T) error) error {
	wanted := make(map[string]bool, len(want))
	for _, o := range want {
		wanted[id(o)] = true
	}
	stored := make(map[string]T, len(have))
	for _, o := range have {
		if !wanted[id(o)] {
			if _, err := del(id(o)); err != nil {
				return err
			}
			continue
		}
		stored[id(o)] = o
	}
	for _, o := range want {
		if old, ok := stored[id(o)]; ok {
			if same, err := sameJSON(old, o); err != nil || same {
				if err != nil {
					return err
				}
				continue
			}
		}
		if err := put(o); err != nil {
			return err
		}
	}
	return nil
}

// sameJSON reports whether a and b have the same JSON: the same object as
// the store keeps it.
func sameJSON(a, b any) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, err
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, err
	}
	return string(ja) == string(jb), nil
}
