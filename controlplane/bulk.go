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
			return spec.Key{}, &spec.Error{Path: at + "." + durationPath(raw, path, err), Problem: problem}
		}
		if path, problem, ok := timeProblem(raw, err); ok {
			return spec.Key{}, &spec.Error{Path: at + "." + path, Problem: problem}
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
