package controlplane

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// DefaultDataPlaneExpiry is how long an entry of a gateway whose stream
// ended stays listed when DataPlanes.Expiry is 0.
const DefaultDataPlaneExpiry = time.Hour

// DataPlane is what the control plane knows of one sync stream of a
// gateway, as GET /api/dataplanes lists it. The sync server fills it in.
// There is one entry per open stream, and one for a gateway whose last
// open stream ended, until it reconnects, expires or is deleted.
type DataPlane struct {
	// GatewayID names the gateway; it should be unique among all data
	// planes (see Duplicate).
	GatewayID string `json:"gateway_id"`
	// Stream numbers the stream on this control plane (from 1, in the
	// order streams were accepted).
	Stream uint64 `json:"stream"`
	// Peer is the stream's remote address ("" when unknown).
	Peer string `json:"peer,omitempty"`
	// Group is the data plane the gateway belongs to (the gateways
	// sharing one Redis).
	Group string `json:"group"`
	// Tags are the tags the gateway asked for, which select its APIs.
	Tags []string `json:"tags,omitempty"`
	// Connected says whether this stream is open now.
	Connected bool `json:"connected"`
	// Duplicate says that another open stream uses the same GatewayID:
	// two gateways configured with one ID, or a gateway and an impostor.
	// Both entries are listed, both are flagged, and both are warned of.
	Duplicate bool `json:"duplicate,omitempty"`
	// AppliedRevision is the revision the gateway runs: the one its
	// Hello named, then each one it acknowledged. A rejected delivery
	// leaves it alone (the gateway keeps running what it ran).
	AppliedRevision uint64 `json:"applied_revision"`
	// LastSeen is when it last sent anything.
	LastSeen time.Time `json:"last_seen"`
	// DisconnectedAt is when the stream ended; zero while connected.
	DisconnectedAt time.Time `json:"disconnected_at,omitzero"`
	// LastRejection is the last revision it refused to apply, or nil;
	// cleared once it acknowledges that revision or a later one.
	LastRejection *Rejection `json:"last_rejection,omitempty"`
	// NotBuilt are the APIs and policies of its applied revision that it
	// runs without, as its last Ack or DigestReport said: what only its
	// host can fail (a secret's environment variable or file, a JWKS; a
	// policy its counter store cannot enforce). Each API, and each
	// request that needs such a policy, answers 503 there; the rest of
	// the revision is in force. Empty when everything is built.
	NotBuilt []NotBuilt `json:"not_built,omitempty"`
}

// NotBuilt is an API or a policy a gateway could not build, and why.
// Exactly one of API and Policy is set.
type NotBuilt struct {
	// API is the API's id, "" for a policy.
	API string `json:"api,omitempty"`
	// Policy is the policy's id, "" for an API.
	Policy string `json:"policy,omitempty"`
	// Problem is the gateway's reason.
	Problem string `json:"problem"`
}

// clone returns dp with its own copies of the slices and pointers.
func (dp DataPlane) clone() DataPlane {
	dp.Tags = slices.Clone(dp.Tags)
	dp.NotBuilt = slices.Clone(dp.NotBuilt)
	if dp.LastRejection != nil {
		r := *dp.LastRejection
		dp.LastRejection = &r
	}
	return dp
}

// Rejection is a revision a gateway refused, keeping its running
// configuration.
type Rejection struct {
	// Revision is the revision refused.
	Revision uint64 `json:"revision"`
	// Problem is the gateway's reason.
	Problem string `json:"problem"`
	// At is when the control plane received the rejection.
	At time.Time `json:"at"`
}

// DataPlanes is the registry of the gateways' sync streams. It is safe
// for concurrent use; the zero value is empty and ready. Entries of
// ended streams expire Expiry after they ended; expired entries are
// dropped as the registry is used (no goroutine): by List at once, and by
// Connect and Disconnect at most once per Expiry/16, so that it holds at
// most the open streams and the streams that ended within Expiry +
// Expiry/16 even when nobody lists it (gateways restarting with new IDs,
// no metrics scraped).
type DataPlanes struct {
	// Expiry is how long an ended stream's entry stays; 0 means
	// DefaultDataPlaneExpiry. Set it before first use.
	Expiry time.Duration
	// Now is the clock of expiry; nil means time.Now. Set it before
	// first use.
	Now func() time.Time

	mu     sync.Mutex
	m      map[string]map[uint64]DataPlane // gateway ID → stream → entry
	pruned time.Time                       // the last prune of every gateway's entries
}

func (d *DataPlanes) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// pruneDue prunes every gateway's entries when Expiry/16 has passed since
// the last time; d.mu is held.
func (d *DataPlanes) pruneDue() {
	if d.now().Sub(d.pruned) >= cmp.Or(d.Expiry, DefaultDataPlaneExpiry)/16 {
		d.prune()
	}
}

// prune drops the expired entries of the gateways in ids, or of all
// gateways when ids is nil; d.mu is held.
func (d *DataPlanes) prune(ids ...string) {
	expiry := cmp.Or(d.Expiry, DefaultDataPlaneExpiry)
	now := d.now()
	if ids == nil {
		d.pruned = now
		for id := range d.m {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		for n, dp := range d.m[id] {
			if !dp.Connected && now.Sub(dp.DisconnectedAt) >= expiry {
				delete(d.m[id], n)
			}
		}
		if len(d.m[id]) == 0 {
			delete(d.m, id)
		}
	}
}

// markDuplicates sets Duplicate on the open streams of gateway id; d.mu
// is held. It returns the open streams' entries.
func (d *DataPlanes) markDuplicates(id string) []DataPlane {
	live := 0
	for _, dp := range d.m[id] {
		if dp.Connected {
			live++
		}
	}
	var out []DataPlane
	for n, dp := range d.m[id] {
		if dp.Connected {
			dp.Duplicate = live > 1
			d.m[id][n] = dp
			out = append(out, dp.clone())
		}
	}
	return out
}

// openStreams returns the open streams of gateway id.
func (d *DataPlanes) openStreams(id string) []DataPlane {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []DataPlane
	for _, dp := range d.m[id] {
		if dp.Connected {
			out = append(out, dp.clone())
		}
	}
	return out
}

// Connect records a new open stream, dp (GatewayID and Stream set, the
// stream's number unique), replacing the entries of ended streams of the
// same gateway. It returns the other open streams of that gateway: none
// unless the ID is used twice.
func (d *DataPlanes) Connect(dp DataPlane) (others []DataPlane) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]map[uint64]DataPlane{}
	}
	d.pruneDue()
	streams := d.m[dp.GatewayID]
	if streams == nil {
		streams = map[uint64]DataPlane{}
		d.m[dp.GatewayID] = streams
	}
	for n, o := range streams {
		if !o.Connected {
			delete(streams, n)
		}
	}
	dp.Connected, dp.DisconnectedAt = true, time.Time{}
	streams[dp.Stream] = dp.clone()
	for _, o := range d.markDuplicates(dp.GatewayID) {
		if o.Stream != dp.Stream {
			others = append(others, o)
		}
	}
	return others
}

// Update calls fn with the entry of stream n of gateway id and stores
// what fn leaves in it (its GatewayID and Stream are kept). It does
// nothing when the entry is gone (expired or deleted). fn runs under the
// registry's lock: it must not call the registry.
func (d *DataPlanes) Update(id string, n uint64, fn func(dp *DataPlane)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dp, ok := d.m[id][n]
	if !ok {
		return
	}
	fn(&dp)
	dp.GatewayID, dp.Stream = id, n
	d.m[id][n] = dp.clone()
}

// Disconnect marks stream n of gateway id ended at the registry's clock.
// When the gateway has another open stream (it reconnected before this
// one was found dead, or its ID is used twice) the entry goes at once;
// otherwise it stays, replacing any older ended entry of the gateway.
func (d *DataPlanes) Disconnect(id string, n uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pruneDue()
	dp, ok := d.m[id][n]
	if !ok {
		return
	}
	if len(d.markDuplicates(id)) > 1 {
		delete(d.m[id], n)
		d.markDuplicates(id)
		return
	}
	for m := range d.m[id] {
		if m != n {
			delete(d.m[id], m) // ended: the only open stream was n
		}
	}
	dp.Connected, dp.Duplicate, dp.DisconnectedAt = false, false, d.now()
	d.m[id][n] = dp
}

// Remove forgets the ended streams of gateway id. It reports how many
// entries it removed and whether the gateway still has an open stream
// (whose entry stays: it is removed when the stream ends and expires).
func (d *DataPlanes) Remove(id string) (removed int, connected bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.prune(id)
	for n, dp := range d.m[id] {
		if dp.Connected {
			connected = true
			continue
		}
		delete(d.m[id], n)
		removed++
	}
	if len(d.m[id]) == 0 {
		delete(d.m, id)
	}
	return removed, connected
}

// List returns every entry, ordered by group, gateway ID, then stream.
// The result is a copy.
func (d *DataPlanes) List() []DataPlane {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.prune()
	out := []DataPlane{}
	for _, streams := range d.m {
		for _, dp := range streams {
			out = append(out, dp.clone())
		}
	}
	slices.SortFunc(out, func(a, b DataPlane) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.GatewayID, b.GatewayID), cmp.Compare(a.Stream, b.Stream))
	})
	return out
}
