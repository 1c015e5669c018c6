package controlplane

import "github.com/limitplane/limitplane/spec"

// withEpochs returns k, written at revision rev over old (nil for a new
// key), with its quota epochs set. The epochs belong to the control
// plane: those in k are ignored.
//
// A quota is reset by setting its epoch to the revision of the write that
// resets it. Revisions only grow, so that raises the epoch, and a key
// deleted and created again never reuses an epoch whose counters may not
// have expired yet. An epoch imported from another store (POST
// /api/import) may be above this store's revisions: a reset then sets it
// to one above the epoch it replaces, since a data plane takes a counter
// of a lower epoch for the same one (core/memory keeps the higher). So:
//
//   - a new key, and each new api_limits entry, starts at rev;
//   - reset (a key updated without suppress_reset, or a key-wide quota
//     reset) sets the key's epoch and every api_limits entry's to rev, or
//     one above the epoch it had when that is not below rev, so every
//     quota counter of the key is renamed whichever epochs a data plane
//     names it with;
//   - otherwise epochs are kept as old has them.
func withEpochs(k spec.Key, old *spec.Key, rev uint64, reset bool) spec.Key {
	if len(k.APILimits) > 0 {
		limits := make(map[string]spec.Limits, len(k.APILimits))
		for id, l := range k.APILimits {
			prev, ok := entry(old, id)
			switch {
			case !ok:
				l.QuotaEpoch = rev
			case reset:
				l.QuotaEpoch = raised(prev.QuotaEpoch, rev)
			default:
				l.QuotaEpoch = prev.QuotaEpoch
			}
			limits[id] = l
		}
		k.APILimits = limits
	}
	switch {
	case old == nil:
		k.QuotaEpoch = rev
	case reset:
		k.QuotaEpoch = raised(old.QuotaEpoch, rev)
	default:
		k.QuotaEpoch = old.QuotaEpoch
	}
	return k
}

// raised is the epoch that replaces prev in a reset at revision rev: rev,
// or prev+1 when rev is not above prev (an imported epoch).
func raised(prev, rev uint64) uint64 {
	return max(rev, prev+1)
}

// resetEpochs returns k with the quota of api reset at revision rev: its
// api_limits entry's epoch is set to rev, or, for api "", the whole key's
// (see withEpochs). ok is false when api is not "" and k has no
// api_limits entry for it.
func resetEpochs(k spec.Key, api string, rev uint64) (_ spec.Key, ok bool) {
	if api == "" {
		return withEpochs(k, &k, rev, true), true
	}
	l, ok := k.APILimits[api]
	if !ok {
		return k, false
	}
	limits := make(map[string]spec.Limits, len(k.APILimits))
	for id, v := range k.APILimits {
		limits[id] = v
	}
	l.QuotaEpoch = raised(l.QuotaEpoch, rev)
	limits[api] = l
	k.APILimits = limits
	return k, true
}

// entry returns k's api_limits entry for api; false for a nil k.
func entry(k *spec.Key, api string) (spec.Limits, bool) {
	if k == nil {
		return spec.Limits{}, false
	}
	l, ok := k.APILimits[api]
	return l, ok
}
