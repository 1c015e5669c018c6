package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/limitplane/limitplane/internal/parallel"
	"github.com/limitplane/limitplane/spec"
)

// state is the state a write leaves, as validateWrite reads it. Lists are
// in ID (key hash) order.
type state interface {
	Policies() ([]spec.Policy, error)
	APIs() ([]spec.API, error)
	// eachKey calls fn with every key's hash and JSON, in hash order.
	eachKey(fn func(hash, v []byte) error) error
	// writtenKeys returns the keys the write put or deleted: hash →
	// JSON as the write leaves it, nil when deleted.
	writtenKeys() map[string][]byte
}

// validateWrite checks that the state st, left by a write that made
// changes, passes spec's ValidateSharded (Validate, except that APIs whose
// tags are disjoint may share a listen path). It returns nil or
// spec.Errors whose paths name objects by ID instead of position:
// policies["gold"].rate.per, keys["sha256:…"].policies[0]; the policies'
// and APIs' problems come first (in Validate's order), then the keys', in
// hash order.
//
// Every policy and API is checked each time. Keys are checked all only
// when an API changed or a policy was deleted, the changes that can break
// a key that was valid; otherwise only the keys written are (a key's
// validity depends only on itself, the policies and the APIs: hashes are
// unique, being the store's keys), so writing one key among a million
// stays cheap. Keys are decoded and checked on every CPU; the cost is
// linear in the keys checked.
func validateWrite(st state, changes *changeList) error {
	allKeys := false
	for _, c := range changes.all() {
		if c.Object == ObjectAPI || c.Object == ObjectPolicy && c.Op == OpDelete {
			allKeys = true
			break
		}
	}
	var s spec.Snapshot
	var err error
	if s.Policies, err = st.Policies(); err != nil {
		return err
	}
	if s.APIs, err = st.APIs(); err != nil {
		return err
	}
	var out spec.Errors
	var errs spec.Errors
	if err := s.ValidateSharded(); err != nil && !errors.As(err, &errs) {
		return err
	}
	for _, e := range errs {
		out = append(out, &spec.Error{Path: pathByID(&s, e.Path), Problem: refsByID(&s, e.Problem)})
	}

	var keys []rawKey
	if allKeys {
		err = st.eachKey(func(h, v []byte) error {
			keys = append(keys, rawKey{string(h), v})
			return nil
		})
		if err != nil {
			return err
		}
	} else {
		for h, v := range st.writtenKeys() {
			if v != nil {
				keys = append(keys, rawKey{h, v})
			}
		}
		slices.SortFunc(keys, func(a, b rawKey) int { return strings.Compare(a.hash, b.hash) })
	}
	keyErrs, err := validateKeys(&s, keys)
	if err != nil {
		return err
	}
	out = append(out, keyErrs...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// rawKey is a stored key: its hash and its JSON.
type rawKey struct {
	hash string
	v    []byte
}

// validateKeys decodes and checks keys, in order, against s's policies
// and APIs, as Validate checks a snapshot's keys (but for the uniqueness
// of their hashes). Paths name each key by its hash. It splits the keys
// among GOMAXPROCS goroutines, all done when it returns.
func validateKeys(s *spec.Snapshot, keys []rawKey) (spec.Errors, error) {
	policies := make(map[string]*spec.Policy, len(s.Policies))
	for i := range s.Policies {
		policies[s.Policies[i].ID] = &s.Policies[i]
	}
	apis := make(map[string]*spec.API, len(s.APIs))
	for i := range s.APIs {
		apis[s.APIs[i].ID] = &s.APIs[i]
	}
	check := func(keys []rawKey) (spec.Errors, error) {
		var out spec.Errors
		for _, rk := range keys {
			var k spec.Key
			if err := json.Unmarshal(rk.v, &k); err != nil {
				return nil, fmt.Errorf("controlplane: decode %s %q: %w", bucketKeys, rk.hash, err)
			}
			var errs spec.Errors
			// Paths are made only for the keys that have problems.
			if err := spec.ValidateKey("", &k, policies, apis); err != nil && !errors.As(err, &errs) {
				return nil, err
			}
			for _, e := range errs {
				out = append(out, &spec.Error{Path: "keys[" + strconv.Quote(rk.hash) + "]" + e.Path, Problem: e.Problem})
			}
		}
		return out, nil
	}
	errs := make([]spec.Errors, len(keys)/parallel.MinPart+1)
	err := parallel.Ranges(len(keys), runtime.GOMAXPROCS(0), func(lo, hi int) error {
		var err error
		errs[lo/parallel.MinPart], err = check(keys[lo:hi])
		return err
	})
	if err != nil {
		return nil, err
	}
	return slices.Concat(errs...), nil
}

var positionRE = regexp.MustCompile(`^(policies|apis|keys)\[(\d+)\]`)

// pathByID rewrites the leading position of a Validate path over s into
// the object's ID: policies[2].rate → policies["gold"].rate.
// refRE finds a reference to another policy or API by position in a
// problem ("... the same path as apis[1].listen_path").
var refRE = regexp.MustCompile(`\b(policies|apis)\[[0-9]+\]`)

// refsByID rewrites the references by position in a problem as pathByID
// does paths.
func refsByID(s *spec.Snapshot, problem string) string {
	return refRE.ReplaceAllStringFunc(problem, func(ref string) string { return pathByID(s, ref) })
}

func pathByID(s *spec.Snapshot, path string) string {
	m := positionRE.FindStringSubmatchIndex(path)
	if m == nil {
		return path
	}
	i, err := strconv.Atoi(path[m[4]:m[5]])
	if err != nil {
		return path
	}
	var id string
	switch kind := path[m[2]:m[3]]; {
	case kind == "policies" && i < len(s.Policies):
		id = s.Policies[i].ID
	case kind == "apis" && i < len(s.APIs):
		id = s.APIs[i].ID
	case kind == "keys" && i < len(s.Keys):
		id = s.Keys[i].KeyHash
	default:
		return path
	}
	return path[m[2]:m[3]] + "[" + strconv.Quote(id) + "]" + path[m[1]:]
}
