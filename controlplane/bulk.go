package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// MaxBatchKeys is the most keys one POST /api/keys:batch takes.
const MaxBatchKeys = 10_000

// DefaultMaxBulkBytes bounds the body of POST /api/keys:batch and POST
// /api/import when AdminOptions.MaxBulkBytes is 0: 256 MiB, about a
// million keys of an export.
const DefaultMaxBulkBytes = 256 << 20

// exportPage is how many keys an export reads at a time.
const exportPage = 1000

// batchBody is POST /api/keys:batch's body; each key is decoded on its
// own, so that every problem is reported with its index.
type batchBody struct {
	Keys []json.RawMessage `json:"keys"`
}

// batchAnswer is POST /api/keys:batch's answer: the keys' hashes in the
// order given.
type batchAnswer struct {
	Revision  uint64   `json:"revision"`
	KeyHashes []string `json:"key_hashes"`
}

// postKeysBatch creates or replaces up to MaxBatchKeys keys in one write,
// or none: every problem is reported (422) with the key's index.
func (a *admin) postKeysBatch(w http.ResponseWriter, r *http.Request) {
	suppress, ok := flag(w, r, "suppress_reset")
	if !ok {
		return
	}
	var body batchBody
	if !a.decodeLimit(w, r, &body, a.o.MaxBulkBytes) {
		return
	}
	switch n := len(body.Keys); {
	case n == 0:
		writeError(w, http.StatusBadRequest, "no keys (want {\"keys\": [...]}, 1 to "+strconv.Itoa(MaxBatchKeys)+" of them)", nil)
		return
	case n > MaxBatchKeys:
		writeError(w, http.StatusUnprocessableEntity, "too many keys; nothing was changed",
			spec.Errors{{Path: "keys", Problem: fmt.Sprintf("%d keys; a batch takes at most %d", n, MaxBatchKeys)}})
		return
	}
	keys := make([]spec.Key, len(body.Keys))
	hashes := make([]string, len(body.Keys))
	first := make(map[string]int, len(body.Keys))
	var errs spec.Errors
	for i, raw := range body.Keys {
		at := "keys[" + strconv.Itoa(i) + "]"
		k, problem := batchKey(at, raw)
		if problem != nil {
			errs = append(errs, problem)
			continue
		}
		if j, dup := first[k.KeyHash]; dup {
			errs = append(errs, &spec.Error{Path: at + ".key_hash", Problem: fmt.Sprintf("same key as keys[%d]", j)})
			continue
		}
		first[k.KeyHash] = i
		keys[i], hashes[i] = k, k.KeyHash
	}
	if len(errs) > 0 {
		writeError(w, http.StatusUnprocessableEntity, "the batch has invalid keys; nothing was changed", errs)
		return
	}
	rev, err := a.write(r, func(tx Tx) error {
		policies, apis, err := byID(tx)
		if err != nil {
			return err
		}
		var errs spec.Errors
		for i := range keys {
			var ke spec.Errors
			if err := spec.ValidateKey("keys["+strconv.Itoa(i)+"]", &keys[i], policies, apis); err != nil && !errors.As(err, &ke) {
				return err
			}
			errs = append(errs, ke...)
		}
		if len(errs) > 0 {
			return errs
		}
		for _, k := range keys {
			old, err := tx.Key(k.KeyHash)
			if err != nil {
				return err
			}
			if err := tx.PutKey(withEpochs(k, old, tx.Revision(), !suppress)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, batchAnswer{Revision: rev, KeyHashes: hashes})
}

// batchKey decodes one key of a batch, given in plaintext (key) or by
// hash (key_hash), and returns it with its hash in lower case, or its
// problem at a path under at.
func batchKey(at string, raw json.RawMessage) (spec.Key, *spec.Error) {
	var nk newKey
	if err := decodeStrict(raw, &nk); err != nil {
		if path, problem, ok := spec.DurationTypeProblem(err); ok {
			return spec.Key{}, &spec.Error{Path: at + "." + valuePath(raw, path), Problem: problem}
		}
		return spec.Key{}, &spec.Error{Path: at, Problem: "not a key: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	k := nk.Key
	switch {
	case nk.Plain != "" && k.KeyHash != "":
		return k, &spec.Error{Path: at, Problem: "give the key in plaintext (key) or by hash (key_hash), not both"}
	case nk.Plain != "":
		if err := identity.CheckKey(nk.Plain); err != nil {
			return k, &spec.Error{Path: at + ".key", Problem: strings.TrimPrefix(err.Error(), "identity: ")}
		}
		k.KeyHash = identity.HashKey(nk.Plain).String()
	case k.KeyHash == "":
		return k, &spec.Error{Path: at, Problem: "missing key (plaintext) or key_hash"}
	}
	h, err := identity.ParseKeyHash(k.KeyHash)
	if err != nil {
		return k, &spec.Error{Path: at + ".key_hash", Problem: fmt.Sprintf("%q is not sha256:<64 hex digits>", k.KeyHash)}
	}
	k.KeyHash = h.String()
	return k, nil
}

// decodeStrict decodes the one JSON value b into v, refusing a JSON null,
// unknown fields and trailing data.
func decodeStrict(b []byte, v any) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return errors.New("null; want a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON object")
	}
	return nil
}

// byID returns the state's policies and APIs by ID.
func byID(rd Reader) (map[string]*spec.Policy, map[string]*spec.API, error) {
	ps, err := rd.Policies()
	if err != nil {
		return nil, nil, err
	}
	as, err := rd.APIs()
	if err != nil {
		return nil, nil, err
	}
	policies := make(map[string]*spec.Policy, len(ps))
	for i := range ps {
		policies[ps[i].ID] = &ps[i]
	}
	apis := make(map[string]*spec.API, len(as))
	for i := range as {
		apis[as[i].ID] = &as[i]
	}
	return policies, apis, nil
}

// export writes the whole state as one spec.Snapshot document, read in
// one view: {"revision", "policies", "apis", "keys"}, every list present
// (empty when there is nothing), policies and APIs in ID order, keys in
// hash order, each as GET answers it (quota epochs included). Every API
// is in it, whatever its tags. Keys are written a page at a time, so the
// answer is not held in memory; a failure after the first byte aborts
// the connection, so a truncated document is never a valid one.
func (a *admin) export(w http.ResponseWriter, r *http.Request) {
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
			Revision uint64        `json:"revision"`
			Policies []spec.Policy `json:"policies"`
			APIs     []spec.API    `json:"apis"`
		}{rd.Revision(), policies, apis})
		if err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Limitplane-Revision", strconv.FormatUint(rd.Revision(), 10))
		w.WriteHeader(http.StatusOK)
		started = true
		// head ends in "}": the keys go before it.
		if _, err := w.Write(append(head[:len(head)-1], `,"keys":[`...)); err != nil {
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
			if _, err := w.Write(buf); err != nil {
				return err
			}
			if len(ks) < exportPage {
				break
			}
			after = ks[len(ks)-1].KeyHash
		}
		_, err = w.Write([]byte("]}\n"))
		return err
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

// importState replaces the whole state with a document as export writes
// it, in one write: validated whole first (spec's ValidateSharded, paths
// by position in the document: policies[2].rate.per), then every object
// the document lacks is deleted and every one it holds is put as it is,
// quota epochs included. Its revision is ignored: the write raises the
// store's by one like any other.
func (a *admin) importState(w http.ResponseWriter, r *http.Request) {
	var s spec.Snapshot
	if !a.decodeLimit(w, r, &s, a.o.MaxBulkBytes) {
		return
	}
	var errs spec.Errors
	if err := s.ValidateSharded(); err != nil {
		if !errors.As(err, &errs) {
			a.fail(w, r, err)
			return
		}
		writeError(w, http.StatusUnprocessableEntity, "the document is not a valid configuration; nothing was changed", errs)
		return
	}
	rev, err := a.write(r, func(tx Tx) error { return replaceState(tx, &s) })
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, written{Revision: rev})
}

// replaceState makes tx's state s: it deletes what s lacks and puts what
// it holds.
func replaceState(tx Tx, s *spec.Snapshot) error {
	keep := make(map[string]bool, len(s.Keys))
	for _, k := range s.Keys {
		h, err := identity.ParseKeyHash(k.KeyHash)
		if err != nil {
			return fmt.Errorf("controlplane: import: key_hash %q: %w", k.KeyHash, err)
		}
		keep[h.String()] = true
	}
	var stale []string
	for after := ""; ; {
		ks, err := tx.Keys(after, exportPage)
		if err != nil {
			return err
		}
		for _, k := range ks {
			if !keep[k.KeyHash] {
				stale = append(stale, k.KeyHash)
			}
		}
		if len(ks) < exportPage {
			break
		}
		after = ks[len(ks)-1].KeyHash
	}
	for _, h := range stale {
		if _, err := tx.DeleteKey(h); err != nil {
			return err
		}
	}
	policies, err := tx.Policies()
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(s.Policies))
	for _, p := range s.Policies {
		want[p.ID] = true
	}
	for _, p := range policies {
		if !want[p.ID] {
			if _, err := tx.DeletePolicy(p.ID); err != nil {
				return err
			}
		}
	}
	apis, err := tx.APIs()
	if err != nil {
		return err
	}
	clear(want)
	for _, api := range s.APIs {
		want[api.ID] = true
	}
	for _, api := range apis {
		if !want[api.ID] {
			if _, err := tx.DeleteAPI(api.ID); err != nil {
				return err
			}
		}
	}
	for _, p := range s.Policies {
		if err := tx.PutPolicy(p); err != nil {
			return err
		}
	}
	for _, api := range s.APIs {
		if err := tx.PutAPI(api); err != nil {
			return err
		}
	}
	for _, k := range s.Keys {
		if err := tx.PutKey(k); err != nil {
			return err
		}
	}
	return nil
}
