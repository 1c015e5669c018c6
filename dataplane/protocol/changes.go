package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// Change is a decoded syncpb.Change: a PUT carries exactly the object its
// Object names; a DELETE carries none.
type Change struct {
	// Kind is syncpb.Change_KIND_PUT or syncpb.Change_KIND_DELETE.
	Kind syncpb.Change_Kind
	// Object is the kind of object.
	Object syncpb.Change_Object
	// ID is the policy's or API's id, or the key's hash as
	// identity.KeyHash.String writes it ("sha256:" and lower-case hex).
	ID string
	// Policy is the new policy, for a PUT of a policy.
	Policy *spec.Policy
	// Key is the new key, for a PUT of a key.
	Key *spec.Key
	// API is the new API, for a PUT of an API.
	API *spec.API
}

// PutPolicy returns the change that creates or replaces p.
func PutPolicy(p *spec.Policy) (*syncpb.Change, error) {
	return put(syncpb.Change_OBJECT_POLICY, p.ID, p)
}

// PutKey returns the change that creates or replaces k; its id is k's
// key_hash as written.
func PutKey(k *spec.Key) (*syncpb.Change, error) {
	return put(syncpb.Change_OBJECT_KEY, k.KeyHash, k)
}

// PutAPI returns the change that creates or replaces a.
func PutAPI(a *spec.API) (*syncpb.Change, error) {
	return put(syncpb.Change_OBJECT_API, a.ID, a)
}

// Delete returns the change that deletes the object of the given kind and
// id (a policy's or API's id, a key's key_hash).
func Delete(object syncpb.Change_Object, id string) *syncpb.Change {
	return &syncpb.Change{Kind: syncpb.Change_KIND_DELETE, Object: object, Id: id}
}

func put(object syncpb.Change_Object, id string, v any) (*syncpb.Change, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode %s %q: %w", ObjectName(object), id, err)
	}
	return &syncpb.Change{Kind: syncpb.Change_KIND_PUT, Object: object, Id: id, Json: b}, nil
}

// ObjectName names an object kind in messages: "policy", "key", "API",
// or "object N" for a number syncpb does not define.
func ObjectName(o syncpb.Change_Object) string {
	switch o {
	case syncpb.Change_OBJECT_POLICY:
		return "policy"
	case syncpb.Change_OBJECT_KEY:
		return "key"
	case syncpb.Change_OBJECT_API:
		return "API"
	}
	return fmt.Sprintf("object %d", int32(o))
}

// DecodeChanges decodes and checks the changes of ch, in order: each has
// a known kind and object and a non-empty id (a key's a valid key hash);
// a PUT's JSON decodes strictly (unknown fields are errors) into the
// object its Object names, whose id equals the change's; a DELETE has no
// JSON. Errors start with "protocol: " and name the change's index.
func DecodeChanges(ch *syncpb.Changes) ([]Change, error) {
	out := make([]Change, len(ch.GetChanges()))
	for i, c := range ch.GetChanges() {
		d, err := decodeChange(c)
		if err != nil {
			return nil, fmt.Errorf("protocol: changes %d→%d: change %d: %w", ch.GetFromRevision(), ch.GetRevision(), i, err)
		}
		out[i] = d
	}
	return out, nil
}

func decodeChange(c *syncpb.Change) (Change, error) {
	d := Change{Kind: c.GetKind(), Object: c.GetObject(), ID: c.GetId()}
	if d.ID == "" {
		return d, errors.New("empty id")
	}
	if d.Object == syncpb.Change_OBJECT_KEY {
		h, err := identity.ParseKeyHash(d.ID)
		if err != nil {
			return d, fmt.Errorf("key id: %w", err)
		}
		d.ID = h.String()
	}
	switch d.Object {
	case syncpb.Change_OBJECT_POLICY, syncpb.Change_OBJECT_KEY, syncpb.Change_OBJECT_API:
	default:
		return d, fmt.Errorf("unknown object %d", int32(d.Object))
	}
	switch d.Kind {
	case syncpb.Change_KIND_DELETE:
		if len(c.GetJson()) != 0 {
			return d, fmt.Errorf("delete of %s %q carries JSON", ObjectName(d.Object), d.ID)
		}
		return d, nil
	case syncpb.Change_KIND_PUT:
	default:
		return d, fmt.Errorf("unknown kind %d", int32(d.Kind))
	}
	var gotID string
	var err error
	switch d.Object {
	case syncpb.Change_OBJECT_POLICY:
		d.Policy = new(spec.Policy)
		err = decodeStrict(c.GetJson(), d.Policy)
		gotID = d.Policy.ID
	case syncpb.Change_OBJECT_KEY:
		d.Key = new(spec.Key)
		err = decodeStrict(c.GetJson(), d.Key)
		if h, perr := identity.ParseKeyHash(d.Key.KeyHash); perr == nil {
			gotID = h.String()
		} else {
			gotID = d.Key.KeyHash
		}
	case syncpb.Change_OBJECT_API:
		d.API = new(spec.API)
		err = decodeStrict(c.GetJson(), d.API)
		gotID = d.API.ID
	}
	if err != nil {
		return d, fmt.Errorf("put %s %q: %w", ObjectName(d.Object), d.ID, err)
	}
	if gotID != d.ID {
		return d, fmt.Errorf("put %s %q: its JSON has id %q", ObjectName(d.Object), d.ID, gotID)
	}
	return d, nil
}

// ErrRevisionMismatch is wrapped by ApplyChanges when the changes do not
// start at the snapshot's revision: the gateway Nacks them and the
// control plane answers with a snapshot.
var ErrRevisionMismatch = errors.New("protocol: changes do not start at the running revision")

// ApplyChanges returns the snapshot that ch makes of base: base with
// every change applied in order and Revision set to ch's revision. It
// refuses (with an error starting "protocol: ") changes whose
// from_revision is not base's revision (wrapping ErrRevisionMismatch), a
// revision not above from_revision, anything DecodeChanges refuses, and
// the delete of an object base does not hold (that is drift, which a
// fresh snapshot repairs). It does not validate the result as a whole
// (references between objects, unique listen paths): gateway.Apply does.
//
// base is not modified. The result shares with base every list no change
// touches and every object in it; a touched list is copied once, with the
// replaced objects in their places, deleted ones left out and new ones
// appended in the order they were first put. The cost is one pass over
// each touched list plus the decoding of the changes: for one key among a
// million, a scan and a copy of the key list (see BenchmarkApplyChanges).
func ApplyChanges(base *spec.Snapshot, ch *syncpb.Changes) (*spec.Snapshot, error) {
	if base == nil {
		return nil, errors.New("protocol: apply changes: nil snapshot")
	}
	if ch.GetFromRevision() != base.Revision {
		return nil, fmt.Errorf("%w: changes %d→%d, running %d", ErrRevisionMismatch, ch.GetFromRevision(), ch.GetRevision(), base.Revision)
	}
	if ch.GetRevision() <= ch.GetFromRevision() {
		return nil, fmt.Errorf("protocol: changes %d→%d: the revision must rise", ch.GetFromRevision(), ch.GetRevision())
	}
	changes, err := DecodeChanges(ch)
	if err != nil {
		return nil, err
	}
	var pols []op[spec.Policy]
	var keys []op[spec.Key]
	var apis []op[spec.API]
	for i, c := range changes {
		switch c.Object {
		case syncpb.Change_OBJECT_POLICY:
			pols = append(pols, op[spec.Policy]{i, c.ID, c.Policy})
		case syncpb.Change_OBJECT_KEY:
			keys = append(keys, op[spec.Key]{i, c.ID, c.Key})
		case syncpb.Change_OBJECT_API:
			apis = append(apis, op[spec.API]{i, c.ID, c.API})
		}
	}
	next := &spec.Snapshot{Revision: ch.GetRevision()}
	wrap := func(err error) error {
		return fmt.Errorf("protocol: changes %d→%d: %w", ch.GetFromRevision(), ch.GetRevision(), err)
	}
	if next.Policies, err = patch(base.Policies, pols, policyID, exactID()); err != nil {
		return nil, wrap(err)
	}
	if next.Keys, err = patch(base.Keys, keys, keyID, keyIDMatch()); err != nil {
		return nil, wrap(err)
	}
	if next.APIs, err = patch(base.APIs, apis, apiID, exactID()); err != nil {
		return nil, wrap(err)
	}
	return next, nil
}

// op is one change to a list: put val (nil: delete) under id. index is
// the change's place in its message, for errors.
type op[T any] struct {
	index int
	id    string
	val   *T
}

func policyID(p *spec.Policy) string { return p.ID }
func keyID(k *spec.Key) string       { return k.KeyHash }
func apiID(a *spec.API) string       { return a.ID }

// idMatch says how a listed id is matched with a change's canonical id:
// same compares the two (the fast path for a few changes), canon maps the
// listed one onto a canonical id (for a map, for many).
type idMatch struct {
	same  func(listed, id string) bool
	canon func(listed string) string
}

// exactID matches policy and API ids: exactly.
func exactID() idMatch {
	return idMatch{
		same:  func(listed, id string) bool { return listed == id },
		canon: func(listed string) string { return listed },
	}
}

// keyIDMatch matches key hashes: in either case.
func keyIDMatch() idMatch { return idMatch{same: keyIDEqual, canon: strings.ToLower} }

// keyIDEqual compares a listed key_hash with a canonical (lower-case) id:
// identity reads the hex digits in either case.
func keyIDEqual(listed, id string) bool {
	return len(listed) == len(id) && (listed == id || strings.EqualFold(listed, id))
}

// smallOps is the most changes to one list matched by comparing each
// listed id with each change's; more use a map.
const smallOps = 8

// patch applies ops to base (see ApplyChanges). base itself is returned
// when ops is empty.
func patch[T any](base []T, ops []op[T], idOf func(*T) string, match idMatch) ([]T, error) {
	if len(ops) == 0 {
		return base, nil
	}
	// The distinct ids touched, in order of first appearance.
	type target struct {
		id     string
		pos    int // in base, or -1
		val    *T  // final value; nil when absent at the end
		exists bool
	}
	var targets []target
	byID := make(map[string]int, len(ops))
	for _, o := range ops {
		if _, ok := byID[o.id]; !ok {
			byID[o.id] = len(targets)
			targets = append(targets, target{id: o.id, pos: -1})
		}
	}
	// Where each touched id is in base: one pass.
	found := 0
	for i := range base {
		listed := idOf(&base[i])
		t := -1
		if len(targets) <= smallOps {
			for j := range targets {
				if match.same(listed, targets[j].id) {
					t = j
					break
				}
			}
		} else if j, ok := byID[match.canon(listed)]; ok {
			t = j
		}
		if t >= 0 && targets[t].pos < 0 {
			targets[t].pos, targets[t].exists = i, true
			targets[t].val = &base[i]
			if found++; found == len(targets) {
				break
			}
		}
	}
	// Play the changes in order.
	for _, o := range ops {
		t := &targets[byID[o.id]]
		if o.val == nil && !t.exists {
			return nil, fmt.Errorf("change %d: delete of %q, which is not there", o.index, o.id)
		}
		t.val, t.exists = o.val, o.val != nil
	}
	// Copy base once, replacing and dropping in place, then append.
	var at []int // targets in base, by position
	for j := range targets {
		if targets[j].pos >= 0 {
			at = append(at, j)
		}
	}
	slices.SortFunc(at, func(a, b int) int { return targets[a].pos - targets[b].pos })
	out := make([]T, 0, len(base)+len(targets)-len(at))
	prev := 0
	for _, j := range at {
		t := &targets[j]
		out = append(out, base[prev:t.pos]...)
		if t.exists {
			out = append(out, *t.val)
		}
		prev = t.pos + 1
	}
	out = append(out, base[prev:]...)
	for j := range targets {
		if t := &targets[j]; t.pos < 0 && t.exists {
			out = append(out, *t.val)
		}
	}
	return out, nil
}
