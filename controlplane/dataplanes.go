package controlplane

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// DataPlane is what the control plane knows of one gateway of a data
// plane, as GET /api/dataplanes lists it. The sync server fills it in.
type DataPlane struct {
	// GatewayID names the gateway; unique among all data planes.
	GatewayID string `json:"gateway_id"`
	// Group is the data plane the gateway belongs to (the gateways
	// sharing one Redis).
	Group string `json:"group"`
	// Tags are the tags the gateway asked for, which select its APIs.
	Tags []string `json:"tags,omitempty"`
	// Connected says whether its sync stream is open now.
	Connected bool `json:"connected"`
	// AppliedRevision is the last revision it acknowledged.
	AppliedRevision uint64 `json:"applied_revision"`
	// LastSeen is when it last sent anything.
	LastSeen time.Time `json:"last_seen"`
	// LastRejection is the last revision it refused to apply, or nil.
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

// DataPlanes is the registry of gateways the control plane has heard
// from. It is safe for concurrent use; the zero value is empty and ready.
type DataPlanes struct {
	mu sync.Mutex
	m  map[string]DataPlane
}

// Update calls fn with the entry of gateway id (a zero DataPlane with
// only GatewayID set when it is new) and stores what fn leaves in it.
// fn runs under the registry's lock: it must not call the registry.
func (d *DataPlanes) Update(id string, fn func(dp *DataPlane)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]DataPlane{}
	}
	dp, ok := d.m[id]
	if !ok {
		dp.GatewayID = id
	}
	fn(&dp)
	dp.GatewayID = id
	dp.Tags = slices.Clone(dp.Tags)
	dp.NotBuilt = slices.Clone(dp.NotBuilt)
	if dp.LastRejection != nil {
		r := *dp.LastRejection
		dp.LastRejection = &r
	}
	d.m[id] = dp
}

// Remove forgets gateway id; it reports whether it was known.
func (d *DataPlanes) Remove(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.m[id]
	delete(d.m, id)
	return ok
}

// List returns every gateway, ordered by group then gateway ID. The
// result is a copy.
func (d *DataPlanes) List() []DataPlane {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]DataPlane, 0, len(d.m))
	for _, dp := range d.m {
		dp.Tags = slices.Clone(dp.Tags)
		dp.NotBuilt = slices.Clone(dp.NotBuilt)
		if dp.LastRejection != nil {
			r := *dp.LastRejection
			dp.LastRejection = &r
		}
		out = append(out, dp)
	}
	slices.SortFunc(out, func(a, b DataPlane) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.GatewayID, b.GatewayID))
	})
	return out
}
