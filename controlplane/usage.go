package controlplane

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/limitplane/limitplane/controlplane/quotaledger"
	"github.com/limitplane/limitplane/dataplane/lease"
	"github.com/limitplane/limitplane/identity"
)

// Usage is what the global-quota ledger knows of a key's use, from its
// data planes' reports (GET /api/usage/keys/{hash}). Only global quotas
// have entries: the counters of other limits stay in their data plane.
// Entries are kept for QuotaOptions.Retention after their period (then
// pruned); usage is not part of GET /api/export or POST /api/import.
type Usage struct {
	KeyHash string `json:"key_hash"`
	// Consumer is the key's consumer ID (identity.KeyHash.ConsumerID),
	// the name of its entries.
	Consumer string `json:"consumer"`
	// Entries are the key's ledger entries, by policy, scope, epoch and
	// period start.
	Entries []EntryUsage `json:"entries"`
	// Totals sums every entry's totals.
	Totals UsageTotals `json:"totals"`
	// Thresholds are the quota thresholds the key reached, per API,
	// endpoint, policy, epoch and period (any quota, global or not: the data
	// planes report them with their lease batches, asynchronously), by
	// period start, API, policy and epoch; left out when none.
	Thresholds []ThresholdUsage `json:"thresholds,omitempty"`
}

// ThresholdUsage is one quota period's thresholds reached.
type ThresholdUsage struct {
	API string `json:"api"`
	// Endpoint is the endpoint's method and canonical path for the
	// quota of one of the API's endpoints ("POST /orders"), left out for
	// the API's own quota.
	Endpoint    string    `json:"endpoint,omitempty"`
	Policy      string    `json:"policy"`
	Epoch       uint64    `json:"epoch"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	// Reached are the thresholds reached, in percent, ascending.
	Reached []int64 `json:"reached"`
	// Events are their events, by threshold.
	Events []lease.ThresholdEvent `json:"events"`
}

// EntryUsage is one ledger entry's use.
type EntryUsage struct {
	Policy      string     `json:"policy,omitempty"`
	Scope       string     `json:"scope"`
	Epoch       uint64     `json:"epoch"`
	PeriodStart time.Time  `json:"period_start"`
	PeriodEnd   time.Time  `json:"period_end"`
	Mode        lease.Mode `json:"mode"`
	// Quota is Q; Committed the units debited (leases, floors by mode);
	// Bound the most the entry guarantees admitting (quotaledger's Bound).
	Quota     int64 `json:"quota"`
	Committed int64 `json:"committed"`
	Bound     int64 `json:"bound"`
	// DataPlanes is quotaledger.Entry.Usage: one per data plane that
	// asked or reported, by name.
	DataPlanes []quotaledger.Usage `json:"data_planes"`
	Totals     UsageTotals         `json:"totals"`
}

// UsageTotals sums data planes' quotaledger.Usage.
type UsageTotals struct {
	Spent      int64 `json:"spent"`
	Leased     int64 `json:"leased"`
	FloorSpent int64 `json:"floor_spent"`
	Admitted   int64 `json:"admitted"`
	Refused    int64 `json:"refused"`
}

func (t *UsageTotals) add(u quotaledger.Usage) {
	t.Spent += u.Spent
	t.Leased += u.Leased
	t.FloorSpent += u.FloorSpent
	t.Admitted += u.Admitted
	t.Refused += u.Refused
}

func (t *UsageTotals) sum(o UsageTotals) {
	t.Spent += o.Spent
	t.Leased += o.Leased
	t.FloorSpent += o.FloorSpent
	t.Admitted += o.Admitted
	t.Refused += o.Refused
}

// quotaLedger returns the store's ledger, or answers 404.
func (a *admin) quotaLedger(w http.ResponseWriter) (QuotaLedgerStore, bool) {
	ls, ok := a.o.Store.(QuotaLedgerStore)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("this store (%T) keeps no quota ledger", a.o.Store), nil)
	}
	return ls, ok
}

// keyUsage answers GET /api/usage/keys/{hash}: Usage; 404 for a hash that
// is no key and has no usage.
func (a *admin) keyUsage(w http.ResponseWriter, r *http.Request) {
	hash, ok := parseHash(w, r.PathValue("hash"))
	if !ok {
		return
	}
	ls, ok := a.quotaLedger(w)
	if !ok {
		return
	}
	h, _ := identity.ParseKeyHash(hash)
	u := Usage{KeyHash: hash, Consumer: h.ConsumerID(), Entries: []EntryUsage{}}
	err := ls.ScanQuota(r.Context(), consumerPrefix(u.Consumer), func(id string, rec QuotaRecord) error {
		var st quotaledger.State
		if err := json.Unmarshal(rec.Value, &st); err != nil {
			return fmt.Errorf("controlplane: usage: entry %q: %w", id, err)
		}
		e, err := quotaledger.Restore(st)
		if err != nil {
			return fmt.Errorf("controlplane: usage: entry %q: %w", id, err)
		}
		c := e.Config()
		eu := EntryUsage{Policy: c.Key.Policy, Scope: c.Key.Scope, Epoch: c.Key.Epoch, PeriodStart: c.Key.PeriodStart,
			PeriodEnd: c.Key.PeriodStart.Add(c.Period), Mode: c.Mode, Quota: c.Quota, Committed: e.Committed(), Bound: e.Bound(),
			DataPlanes: e.Usage()}
		for _, d := range eu.DataPlanes {
			eu.Totals.add(d)
		}
		u.Totals.sum(eu.Totals)
		u.Entries = append(u.Entries, eu)
		return nil
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if u.Thresholds, err = thresholdUsage(r.Context(), ls, u.Consumer); err != nil {
		a.fail(w, r, err)
		return
	}
	if len(u.Entries) == 0 && len(u.Thresholds) == 0 {
		// No use: a key's zeros, or a hash that names nothing (a typo
		// must not read as a key that was never used). A deleted key's
		// use is answered while it is retained.
		err := a.o.Store.View(r.Context(), func(rd Reader) error {
			k, err := rd.Key(hash)
			if k == nil && err == nil {
				return notFound("no key %s and no usage of it", hash)
			}
			return err
		})
		if err != nil {
			a.fail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, u)
}

// thresholdUsage reads consumer's threshold events and groups them by
// period; nil when there are none.
func thresholdUsage(ctx context.Context, ls QuotaLedgerStore, consumer string) ([]ThresholdUsage, error) {
	type period struct {
		api, endpoint, policy string
		epoch                 uint64
		start                 time.Time
	}
	by := map[period]*ThresholdUsage{}
	err := ls.ScanQuota(ctx, thresholdPrefix(consumer), func(id string, rec QuotaRecord) error {
		var ev lease.ThresholdEvent
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			return fmt.Errorf("controlplane: usage: threshold event %q: %w", id, err)
		}
		k := period{ev.API, ev.Endpoint, ev.Policy, ev.Epoch, ev.PeriodStart.UTC()}
		tu := by[k]
		if tu == nil {
			tu = &ThresholdUsage{API: ev.API, Endpoint: ev.Endpoint, Policy: ev.Policy, Epoch: ev.Epoch, PeriodStart: k.start, PeriodEnd: ev.PeriodEnd.UTC()}
			by[k] = tu
		}
		tu.Events = append(tu.Events, ev)
		return nil
	})
	if err != nil || len(by) == 0 {
		return nil, err
	}
	out := make([]ThresholdUsage, 0, len(by))
	for _, tu := range by {
		slices.SortFunc(tu.Events, func(a, b lease.ThresholdEvent) int { return cmp.Compare(a.Threshold, b.Threshold) })
		for _, ev := range tu.Events {
			if !slices.Contains(tu.Reached, ev.Threshold) {
				tu.Reached = append(tu.Reached, ev.Threshold)
			}
		}
		out = append(out, *tu)
	}
	slices.SortFunc(out, func(a, b ThresholdUsage) int {
		return cmp.Or(a.PeriodStart.Compare(b.PeriodStart), cmp.Compare(a.API, b.API), cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Epoch, b.Epoch))
	})
	return out, nil
}

// dataPlaneUsage answers GET /api/usage/dataplanes:
// {"dataplanes": [DataPlaneUsage...]}, by name.
func (a *admin) dataPlaneUsage(w http.ResponseWriter, r *http.Request) {
	ls, ok := a.quotaLedger(w)
	if !ok {
		return
	}
	out := []DataPlaneUsage{}
	err := ls.ScanQuota(r.Context(), quotaDataPlanePrefix, func(id string, rec QuotaRecord) error {
		var d DataPlaneUsage
		if err := json.Unmarshal(rec.Value, &d); err != nil {
			return fmt.Errorf("controlplane: usage: data plane %q: %w", id, err)
		}
		out = append(out, d)
		return nil
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		DataPlanes []DataPlaneUsage `json:"dataplanes"`
	}{out})
}
