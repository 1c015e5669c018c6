// Package controlplane is limitplane's control plane: it owns the
// policies, API keys, APIs and quota resets that every data plane
// enforces, keeps them durable with a monotonic revision and a bounded
// change log, and serves them through an admin REST API (Admin) and the
// data planes' gRPC sync stream (SyncServer). The sync server keeps each
// data plane at the store's revision with the changes since the revision
// it runs (Store.ChangesSince, filtered to what its tags select), and
// with a Snapshot of what its tags select when changes will not do (see
// SyncServer).
//
// Counters never reach the control plane: it imports spec and nothing
// that talks to a counter store.
//
// The state lives behind Store. Bolt, the default, is an embedded bbolt
// file: a write is acknowledged only after it is fsynced, so it survives
// kill -9. Concurrent writes share one transaction and one fsync.
//
// Quota resets are data: every key carries a quota epoch, and so does
// each of its api_limits entries; a reset raises it (see Admin).
package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	"github.com/limitplane/limitplane/spec"
)

// Store is the control plane's durable state: policies, keys (by hash)
// and APIs, a revision raised by every successful write, and a bounded
// log of the changes of the latest revisions.
//
// Every write is validated as a whole: the state it leaves must pass
// spec's Validate, or Update refuses it with spec.Errors and changes
// nothing.
type Store interface {
	// Update runs fn in a write transaction. When fn returns nil and has
	// written something, the resulting state is validated, the revision
	// is raised by one, one Change per object written is appended to the
	// change log, and Update returns the new revision once the write is
	// durable. When fn writes nothing, Update returns the current
	// revision and changes nothing. An error from fn, or spec.Errors from
	// validation, is returned as is and nothing is written.
	//
	// fn may be called more than once (concurrent writes are batched and
	// a batch is retried without the one that failed): it must act only
	// through tx and keep no effect of a call that did not return last.
	Update(ctx context.Context, fn func(tx Tx) error) (revision uint64, err error)
	// View runs fn with a consistent read-only view of the state.
	View(ctx context.Context, fn func(r Reader) error) error
	// ChangesSince returns the changes of the revisions after rev, in
	// order (empty when rev is the current revision). It returns an
	// error wrapping ErrTooFarBehind when the change log no longer holds
	// them all, or ErrRevisionAhead when rev is above the current
	// revision: either way the caller needs a snapshot.
	ChangesSince(ctx context.Context, rev uint64) ([]Change, error)
	// Snapshot returns the whole state at its current revision, as a
	// data plane with the given tags receives it (see Select).
	Snapshot(ctx context.Context, tags []string) (*spec.Snapshot, error)
	// History returns the id of the store's history: random (from
	// crypto/rand), made when the store is created (or first opened by a
	// version that keeps one) and kept in it, so a restart keeps it.
	// Revisions count within a history: a data plane that names another
	// history, or a revision ahead of the store's in this one, runs
	// something this store never had or no longer has, and is sent a
	// snapshot it applies whatever its revision (see SyncServer).
	History(ctx context.Context) (string, error)
	// ForkHistory replaces the history id with a new random one when it
	// is still from, and returns the id then current (from's successor,
	// or the id another fork made already). The state and its revision
	// do not change. The sync server calls it when a data plane shows a
	// revision of this history above the store's: the store went back
	// (restored from a copy), and the revisions it numbers from now on
	// must not be taken for the lost ones.
	ForkHistory(ctx context.Context, from string) (string, error)
	// Close releases the store. Calls after Close fail.
	Close() error
}

// Reader reads the state. Objects returned are copies the caller may
// keep and change.
type Reader interface {
	// Revision is the revision of the state read (in a Tx: the revision
	// the write commits as).
	Revision() uint64
	// Policy returns the policy with this ID, or nil.
	Policy(id string) (*spec.Policy, error)
	// Key returns the key with this hash ("sha256:" and 64 hex digits, in
	// either case), or nil. Its KeyHash is in lower case.
	Key(hash string) (*spec.Key, error)
	// API returns the API with this ID, or nil.
	API(id string) (*spec.API, error)
	// Policies returns every policy, in ID order (byte-wise).
	Policies() ([]spec.Policy, error)
	// APIs returns every API, in ID order (byte-wise).
	APIs() ([]spec.API, error)
	// Keys returns at most limit keys whose hashes (lower case) come
	// after after ("" for the first), in hash order: one page of a
	// listing too long for one answer.
	Keys(after string, limit int) ([]spec.Key, error)
}

// Tx is a write transaction (see Store.Update). Puts replace the object
// with the same ID or key hash; deletes report whether there was one.
type Tx interface {
	Reader
	// PutPolicy stores p under p.ID.
	PutPolicy(p spec.Policy) error
	// DeletePolicy deletes the policy id.
	DeletePolicy(id string) (bool, error)
	// PutKey stores k under its key hash, written in lower case. An
	// unparsable hash is refused with spec.Errors.
	PutKey(k spec.Key) error
	// DeleteKey deletes the key with this hash.
	DeleteKey(hash string) (bool, error)
	// PutAPI stores a under a.ID.
	PutAPI(a spec.API) error
	// DeleteAPI deletes the API id.
	DeleteAPI(id string) (bool, error)
}

// Op is what a Change did.
type Op string

// Ops.
const (
	// OpPut created or replaced the object; Change.Value holds it.
	OpPut Op = "put"
	// OpDelete deleted it; Change.Value is empty.
	OpDelete Op = "delete"
)

// Object is the kind of object a Change is about.
type Object string

// Objects.
const (
	// ObjectPolicy is a spec.Policy, by ID.
	ObjectPolicy Object = "policy"
	// ObjectKey is a spec.Key, by key hash (lower case).
	ObjectKey Object = "key"
	// ObjectAPI is a spec.API, by ID.
	ObjectAPI Object = "api"
)

// Change is one record of the change log: one object put or deleted by
// the write that made Revision. A write of several objects makes several
// changes with the same revision.
type Change struct {
	// Revision is the revision of the write.
	Revision uint64 `json:"revision"`
	// Op is OpPut or OpDelete.
	Op Op `json:"op"`
	// Object is the kind of object.
	Object Object `json:"object"`
	// ID is the policy or API ID, or the key hash.
	ID string `json:"id"`
	// Value is the object in spec's JSON for OpPut; empty for OpDelete.
	Value json.RawMessage `json:"value,omitempty"`
	// Old is the object in spec's JSON as it was before this change
	// (the Value of the change before it, when one write puts it twice);
	// empty when it did not exist. With it a change can be undone, and a
	// data plane's filtered view of it computed (see SyncServer).
	Old json.RawMessage `json:"old,omitempty"`
}

var (
	// ErrTooFarBehind means the change log no longer reaches back to the
	// revision asked for: send a snapshot instead.
	ErrTooFarBehind = errors.New("controlplane: revision is older than the change log holds; a snapshot is needed")
	// ErrRevisionAhead means the revision asked for is above the store's
	// (the asker followed another control plane, or state was lost):
	// send a snapshot instead.
	ErrRevisionAhead = errors.New("controlplane: revision is ahead of the control plane's; a snapshot is needed")
	// ErrClosed is returned by a store used after Close.
	ErrClosed = errors.New("controlplane: store closed")
	// ErrStoreUnavailable is wrapped by a store's errors when its database
	// cannot be reached (down, failing over, the connection lost
	// mid-transaction): nothing was written, and the call may be retried
	// once it is back, unless the error also wraps ErrCommitUnknown. The
	// admin API answers such a write 503.
	ErrStoreUnavailable = errors.New("controlplane: the store's database is unavailable")
	// ErrCommitUnknown is wrapped, beside ErrStoreUnavailable, by the
	// error of a write whose connection to the database was lost in the
	// round trip that commits it: the write may or may not have been made
	// (PostgreSQL's answer to COMMIT is what was lost), so read the state
	// before making it again. The admin API answers it 503 and says so.
	ErrCommitUnknown = errors.New("controlplane: the connection to the store's database was lost during the commit; the write may have been made")
)

// Selects reports whether an API with apiTags goes to a data plane with
// dpTags. The sharding rule: an API without tags goes to every data
// plane; an API with tags goes to each data plane that has at least one
// of them (a data plane without tags receives only untagged APIs).
func Selects(apiTags, dpTags []string) bool {
	if len(apiTags) == 0 {
		return true
	}
	for _, t := range apiTags {
		if slices.Contains(dpTags, t) {
			return true
		}
	}
	return false
}

// Select returns what a data plane with tags receives of the valid
// snapshot s: the APIs Selects picks, and every policy and key, with
// their references to APIs it left out removed, so the result is valid
// too and enforces exactly what s does on the APIs it keeps:
//
//   - a policy's apis list loses the APIs left out; a policy whose list
//     loses all of them covers nothing there and is left out, and so is
//     it from the keys' policies lists; its endpoint limits lose those
//     at the APIs left out;
//   - a key's api_limits lose the entries of APIs left out; a key left
//     with no policy and no api_limits could pass no API there (core's
//     ErrNoPolicy) and is left out.
//
// When the tags select every API (the view is the identity), the result
// holds s's lists themselves. s is not changed; the result shares
// unchanged objects with it.
func Select(s *spec.Snapshot, tags []string) *spec.Snapshot {
	f := newFilter(s.Policies, s.APIs, tags)
	out := &spec.Snapshot{Revision: s.Revision}
	if f.identity {
		out.Policies, out.Keys, out.APIs = s.Policies, s.Keys, s.APIs
		return out
	}
	for _, a := range s.APIs {
		if f.served[a.ID] {
			out.APIs = append(out.APIs, a)
		}
	}
	for _, p := range s.Policies {
		if p, ok := f.policy(p); ok {
			out.Policies = append(out.Policies, p)
		}
	}
	for _, k := range s.Keys {
		if k, ok := f.key(k); ok {
			out.Keys = append(out.Keys, k)
		}
	}
	return out
}

// filter is Select's rule for one set of policies and APIs and one data
// plane's tags. It is read-only once made, and shared.
type filter struct {
	// identity: the tags select every API, so the view is the state.
	identity bool
	// served are the IDs of the APIs the tags select; kept the IDs of
	// the policies the view holds. Both nil for the identity.
	served, kept map[string]bool
}

// newFilter returns Select's rule for the state with these policies and
// APIs, for tags.
func newFilter(policies []spec.Policy, apis []spec.API, tags []string) *filter {
	served := map[string]bool{}
	for _, a := range apis {
		if Selects(a.Tags, tags) {
			served[a.ID] = true
		}
	}
	if len(served) == len(apis) {
		return &filter{identity: true}
	}
	f := &filter{served: served, kept: map[string]bool{}}
	for _, p := range policies {
		if _, ok := f.policy(p); ok {
			f.kept[p.ID] = true
		}
	}
	return f
}

// policy returns p as the view holds it, or false when the view leaves
// it out (its apis list names only APIs left out).
func (f *filter) policy(p spec.Policy) (spec.Policy, bool) {
	if f.identity {
		return p, true
	}
	if slices.ContainsFunc(p.Endpoints, func(pe spec.PolicyEndpoint) bool { return !f.served[pe.API] }) {
		// Its limits at the endpoints of APIs left out go too.
		var eps []spec.PolicyEndpoint
		for _, pe := range p.Endpoints {
			if f.served[pe.API] {
				eps = append(eps, pe)
			}
		}
		p.Endpoints = eps
	}
	if len(p.APIs) == 0 {
		return p, true
	}
	p.APIs = keep(p.APIs, f.served)
	return p, len(p.APIs) > 0
}

// key returns k as the view holds it, or false when the view leaves it
// out (no policy and no api_limits entry left).
func (f *filter) key(k spec.Key) (spec.Key, bool) {
	if f.identity {
		return k, true
	}
	k.Policies = keep(k.Policies, f.kept)
	if len(k.APILimits) > 0 {
		limits := make(map[string]spec.Limits, len(k.APILimits))
		for id, l := range k.APILimits {
			if f.served[id] {
				limits[id] = l
			}
		}
		k.APILimits = limits
		if len(limits) == 0 {
			k.APILimits = nil
		}
	}
	return k, len(k.Policies) > 0 || len(k.APILimits) > 0
}

// keep returns the ids that in maps to true, in order; ids itself when
// that is all of them.
func keep(ids []string, in map[string]bool) []string {
	n := 0
	for _, id := range ids {
		if in[id] {
			n++
		}
	}
	if n == len(ids) {
		return ids
	}
	out := make([]string, 0, n)
	for _, id := range ids {
		if in[id] {
			out = append(out, id)
		}
	}
	return out
}
