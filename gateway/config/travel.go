package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// travelling checks the file's policies, keys and APIs and returns them
// as the snapshot a control plane would send (keys by hash, listen paths
// clean). spec.Validate judges them, as it judges a control plane's; the
// file adds what only a file has (plaintext keys, an APIs list that
// must not be empty, routes that need both a path and a target, the
// memory store's one algorithm) and loads the JWT keys it names, so a
// missing secret is reported at its line.
func (v *loader) travelling(raw *rawConfig) spec.Snapshot {
	s := spec.Snapshot{Policies: raw.Policies, APIs: raw.APIs}
	if len(raw.Keys) > 0 {
		s.Keys = make([]spec.Key, len(raw.Keys))
	}
	if len(s.APIs) == 0 {
		v.require("apis", "at least one API is required")
	}
	for i, a := range s.APIs {
		at := fmt.Sprintf("apis[%d]", i)
		if _, err := spec.CleanListenPath(a.ListenPath); a.ListenPath == "" {
			v.require(at+".listen_path", "%s", specProblem(err))
		}
		if _, err := spec.ParseTarget(a.Target); a.Target == "" {
			v.require(at+".target", "%s", specProblem(err))
		}
	}
	// Where spec's key_hash problems belong: at key for a plaintext key,
	// nowhere when the file's own check spoke.
	keyHashAt := map[string]string{}
	for i, k := range raw.Keys {
		at := fmt.Sprintf("keys[%d]", i)
		s.Keys[i] = k.Key
		switch {
		case k.Plain != "" && k.KeyHash != "":
			v.fail(at, "set key or key_hash, not both")
			keyHashAt[at+".key_hash"] = ""
		case k.Plain != "":
			if err := identity.CheckKey(k.Plain); err != nil {
				v.fail(at+".key", "%s", strings.TrimPrefix(err.Error(), "identity: "))
			}
			s.Keys[i].KeyHash = identity.HashKey(k.Plain).String()
			keyHashAt[at+".key_hash"] = at + ".key"
		case k.KeyHash == "":
			v.require(at, "needs key (plaintext) or key_hash (sha256:<hex>)")
			keyHashAt[at+".key_hash"] = ""
		}
	}
	if v.memory {
		v.gcraOnly(&s)
	}

	var errs spec.Errors
	if err := s.Validate(); err != nil && !errors.As(err, &errs) {
		v.fail("", "%v", err)
	}
	for _, e := range errs {
		path, ok := keyHashAt[e.Path]
		if !ok {
			path = e.Path
		}
		if path == "" || v.failed(path) || authRefused(v, path) {
			continue
		}
		problem := e.Problem
		if first, _ := v.Place(e.First); e.First != "" {
			problem = strings.Replace(problem, e.First, fmt.Sprintf("%s on line %d", e.First, first.At.Line), 1)
		}
		v.Report(path, problem, e.Missing, e.Unknown)
	}
	for i, a := range s.APIs {
		at := fmt.Sprintf("apis[%d].jwt", i)
		valid := !slices.ContainsFunc(errs, func(e *spec.Error) bool { return e.Path == at || strings.HasPrefix(e.Path, at+".") })
		if a.JWT != nil && a.Auth == spec.AuthJWT && valid && !v.Refused(at) {
			v.jwtKeys(at, &a)
		}
		if lp, err := spec.CleanListenPath(a.ListenPath); err == nil {
			s.APIs[i].ListenPath = lp
		}
	}
	return s
}

// authRefused reports whether path is a field of an API whose auth did
// not decode and whose rules depend on it: what was meant is not known.
func authRefused(v *loader, path string) bool {
	var i int
	var rest string
	if n, _ := fmt.Sscanf(path, "apis[%d].%s", &i, &rest); n < 2 || !v.Refused(fmt.Sprintf("apis[%d].auth", i)) {
		return false
	}
	for _, f := range []string{"policies", "jwt", "strip_auth_data", "failure_limit"} {
		if rest == f || strings.HasPrefix(rest, f+".") || strings.HasPrefix(rest, f+"[") {
			return true
		}
	}
	return false
}

// gcraOnly refuses the rates the memory store cannot enforce.
func (v *loader) gcraOnly(s *spec.Snapshot) {
	check := func(at string, r *spec.Rate) {
		if r == nil {
			return
		}
		if alg, err := core.ParseAlgorithm(r.Algorithm); err == nil && alg != core.GCRA {
			v.fail(at+".algorithm", "%s is not supported by the memory store (only gcra)", alg)
		}
	}
	for i, p := range s.Policies {
		check(fmt.Sprintf("policies[%d].rate", i), p.Rate)
		for j, pe := range p.Endpoints {
			check(fmt.Sprintf("policies[%d].endpoints[%d].rate", i, j), pe.Rate)
		}
	}
	for i, k := range s.Keys {
		for _, id := range slices.Sorted(maps.Keys(k.APILimits)) {
			check(fmt.Sprintf("keys[%d].api_limits.%s.rate", i, id), k.APILimits[id].Rate)
		}
	}
}

// jwtKeys loads the keys of a jwt API's jwt section (at) that spec found
// valid, as the gateway will, and checks that identity accepts them:
// files relative to the file's directory, secrets from the environment.
func (v *loader) jwtKeys(at string, a *spec.API) {
	o, jwks, err := a.JWT.Options(a.ID, v.files)
	var errs spec.Errors
	if err != nil && !errors.As(err, &errs) {
		v.fail(at, "%v", err)
	}
	for _, e := range errs {
		v.fail(at+"."+e.Path, "%s", e.Problem)
	}
	// identity has the last word on what it accepts.
	if err == nil && jwks == nil {
		if _, err := identity.NewJWT(o); err != nil {
			v.fail(at, "%s", strings.TrimPrefix(strings.TrimPrefix(err.Error(), "identity: "), "JWT: "))
		}
	}
}

// failed reports whether a problem was already reported at path.
func (v *loader) failed(path string) bool {
	return slices.ContainsFunc(v.Errs, func(e *Error) bool { return e.Field == path })
}
