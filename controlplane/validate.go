package controlplane

import (
	"errors"
	"regexp"
	"strconv"

	"github.com/limitplane/limitplane/spec"
)

// state is the state a write leaves, as validateWrite reads it. Lists are
// in ID (key hash) order.
type state interface {
	Policies() ([]spec.Policy, error)
	APIs() ([]spec.API, error)
	keys() ([]spec.Key, error)
	Key(hash string) (*spec.Key, error)
}

// validateWrite checks that the state st, left by a write that made
// changes, passes spec's Validate. It returns nil or spec.Errors whose
// paths name objects by ID instead of position: policies["gold"].rate.per,
// keys["sha256:…"].policies[0].
//
// Every policy and API is checked each time. Keys are checked all only
// when an API changed or a policy was deleted, the changes that can break
// a key that was valid; otherwise only the keys written are (a key's
// validity depends only on itself, the policies and the APIs), so writing
// one key among a million stays cheap.
func validateWrite(st state, changes []Change) error {
	allKeys := false
	var written []string
	for _, c := range changes {
		switch {
		case c.Object == ObjectAPI, c.Object == ObjectPolicy && c.Op == OpDelete:
			allKeys = true
		case c.Object == ObjectKey && c.Op == OpPut:
			written = append(written, c.ID)
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
	if allKeys {
		if s.Keys, err = st.keys(); err != nil {
			return err
		}
	} else {
		seen := map[string]bool{}
		for _, h := range written {
			if seen[h] {
				continue
			}
			seen[h] = true
			k, err := st.Key(h)
			if err != nil {
				return err
			}
			if k != nil {
				s.Keys = append(s.Keys, *k)
			}
		}
	}
	var errs spec.Errors
	if err := s.Validate(); !errors.As(err, &errs) {
		return err
	}
	out := make(spec.Errors, len(errs))
	for i, e := range errs {
		out[i] = &spec.Error{Path: pathByID(&s, e.Path), Problem: e.Problem}
	}
	return out
}

var positionRE = regexp.MustCompile(`^(policies|apis|keys)\[(\d+)\]`)

// pathByID rewrites the leading position of a Validate path over s into
// the object's ID: policies[2].rate → policies["gold"].rate.
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
