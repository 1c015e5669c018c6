package controlplane

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/controlplane/quotaledger"
	"github.com/limitplane/limitplane/dataplane/lease"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/failurelog"
	"github.com/limitplane/limitplane/spec"
)

// Defaults of QuotaOptions.
const (
	// DefaultQuotaRetention is how long, at least, a ledger entry is kept
	// after its period ended when QuotaOptions.Retention is 0 (its usage
	// stays readable that long): 24 hours.
	DefaultQuotaRetention = 24 * time.Hour
	// DefaultQuotaPruneInterval is how often a Lease call also prunes the
	// ledger when QuotaOptions.PruneInterval is 0.
	DefaultQuotaPruneInterval = time.Minute
	// DefaultQuotaPruneLimit is the most records one prune deletes when
	// QuotaOptions.PruneLimit is 0.
	DefaultQuotaPruneLimit = 256
	// MaxLeaseBatch is the most grant requests and reports one Lease
	// call may carry together (one transaction); more is
	// InvalidArgument.
	MaxLeaseBatch = 10000
)

// QuotaOptions configure NewQuotaServer.
type QuotaOptions struct {
	// Store holds the configuration (policies and keys, where the
	// quotas are found) and, as a QuotaLedgerStore, the ledger. Required;
	// Bolt and Postgres are both.
	Store Store
	// Tokens are the accepted data-plane tokens: give the sync server's
	// (SyncOptions.Tokens). A LeaseRequest's token and group are checked
	// as a Hello's are. Their groups are the data planes known to the
	// ledger: each gets the quota's floor (GlobalQuota.Floor) in reserved
	// and optimistic modes. Required.
	Tokens []DataPlaneToken
	// Now is the ledger's clock; nil means time.Now. Replicas on one
	// database each use their own: period anchors and lease expiries are
	// in the clock of the replica that wrote them.
	Now func() time.Time
	// Retention is how long an entry is kept after its period ended: an
	// entry, and its period anchor, expire max(Retention, 2 × period)
	// after the period's end (so the last three periods of a consumer are
	// kept whatever the period), and are pruned then. 0 means
	// DefaultQuotaRetention. A request naming a pruned entry is refused
	// (unknown entry).
	Retention time.Duration
	// PruneInterval is how often (at most) a Lease call, after it
	// answered, deletes up to PruneLimit expired records; 0 means
	// DefaultQuotaPruneInterval, negative never.
	PruneInterval time.Duration
	// PruneLimit bounds the records one prune deletes; 0 means
	// DefaultQuotaPruneLimit.
	PruneLimit int
	// Metrics counts grants, reports, refusals and ledger writes; nil
	// counts nothing.
	Metrics *Metrics
	// Log receives calls refused for their token or group
	// (rate-limited: the first at once, then a line per
	// failurelog.DefaultInterval with their count), failed ledger writes
	// and prunes; nil means slog.Default().
	Log *slog.Logger
}

// QuotaServer serves syncpb.QuotaService: the control plane's side of
// global quotas (spec.Quota.Global, issue 22), a quotaledger entry per
// (consumer, scope, policy, quota epoch, period), kept in the store
// (QuotaLedgerStore) and written, with everything a call changed, in one
// transaction before the call is answered. So a repeated request (same
// lease.RequestID) gets the same grant from whichever control plane it
// reaches, after a restart or on another replica, and no budget is
// granted twice.
//
// # Finding the quota
//
// A request's lease.EntryKey names it. Policy set: that policy's quota,
// which must be global. Policy empty: the key whose consumer Consumer is
// (identity.KeyHash.ConsumerID, "key:" and 32 hex digits, as the
// gateway's engine names an API key's counters; "sha256:" and 64 hex
// digits is taken too) and its api_limits entry for Scope (an API's ID),
// whose quota must be global. Anything else is refused (lease.Refused,
// RefusedUnknownEntry, with the reason). The entry is opened with
// Quota = max, Period = renewal, the mode, LeaseDuration, and the floor
// for every data-plane group of Tokens. A change of the quota's
// configuration applies from its next period (or epoch): an open entry
// keeps the configuration it was opened with.
//
// Consumers are kept in the engine's form: a key's hash becomes its
// "key:" form, and the answers name the entry so (with the period start
// resolved): lease holders match answers by request ID and report
// against the entry the Grant names.
//
// # Epochs
//
// For a key's api_limits quota, the request's epoch must be the
// api_limits entry's quota_epoch; for a policy's quota spent by a key
// (Consumer in a key form), the key must have the policy and the epoch
// must be the key's quota_epoch. An epoch below (a reset raised it) or
// above is refused as an unknown entry, so spending of the old epoch
// stops once its leases run out, and the new epoch opens a new entry
// (new anchor, new period). A policy's quota spent by another consumer
// (a JWT subject, a client address) is taken at the epoch the data plane
// runs: the control plane has no record of such consumers.
//
// # Periods
//
// A request with a zero PeriodStart means the period in force now. The
// first grant request of a (consumer, scope, policy, epoch) anywhere sets
// its anchor, kept in the store; periods run back to back from it, each
// the renewal in force when it starts. A request naming a period start
// uses that entry if it exists, or opens it if it is the period in force
// now; any other (a period pruned, never opened, or in the future) is
// refused as an unknown entry. A report with a zero PeriodStart is for
// the period in force (refused when there is no anchor yet). Reports are
// applied to an existing entry whatever the configuration now says, so
// final spends always land.
//
// # Batches
//
// Every request's ID.DataPlane and every report's DataPlane must be the
// call's group (else PermissionDenied: a data plane speaks only for
// itself). A batch's reports are applied before its grants, so a final
// report's unspent budget is there for the same batch's requests.
//
// Errors: Unauthenticated (unknown token), PermissionDenied (group
// outside the token's, or a request for another data plane),
// InvalidArgument (a body that does not decode, or more than
// MaxLeaseBatch items), Unavailable (the store
// is closed or its database unreachable: send the same batch again;
// nothing, or all of it, was written), Internal (a ledger record that
// does not restore).
type QuotaServer struct {
	syncpb.UnimplementedQuotaServiceServer
	o      QuotaOptions
	ledger QuotaLedgerStore
	tokens []token
	groups []string // every token's group, sorted, once

	// refusals logs calls refused as a whole (rate-limited, as the
	// sync server's refused streams). Its timer runs only for an
	// interval after a line, so it needs no stopping.
	refusals *failurelog.Log

	pruneMu   sync.Mutex
	lastPrune time.Time
}

// NewQuotaServer returns a QuotaServer. It fails when Store is nil or not
// a QuotaLedgerStore, or Tokens is empty or invalid (as NewSyncServer).
func NewQuotaServer(o QuotaOptions) (*QuotaServer, error) {
	if o.Store == nil {
		return nil, errors.New("controlplane: quota: no store")
	}
	ls, ok := o.Store.(QuotaLedgerStore)
	if !ok {
		return nil, fmt.Errorf("controlplane: quota: the store (%T) keeps no quota ledger", o.Store)
	}
	if len(o.Tokens) == 0 {
		return nil, errors.New("controlplane: quota: no data-plane tokens")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Retention <= 0 {
		o.Retention = DefaultQuotaRetention
	}
	if o.PruneInterval == 0 {
		o.PruneInterval = DefaultQuotaPruneInterval
	}
	if o.PruneLimit <= 0 {
		o.PruneLimit = DefaultQuotaPruneLimit
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &QuotaServer{o: o, ledger: ls, refusals: failurelog.New(o.Log, failurelog.Options{Msg: "controlplane: quota: Lease call refused"})}
	for i, t := range o.Tokens {
		h, ok := strings.CutPrefix(t.Hash, "sha256:")
		b, err := hex.DecodeString(h)
		if !ok || err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("controlplane: quota: token %d (group %q): hash is not \"sha256:\" and 64 hex digits", i, t.Group)
		}
		if slices.ContainsFunc(s.tokens, func(o token) bool { return o.hash == [sha256.Size]byte(b) }) {
			return nil, fmt.Errorf("controlplane: quota: token %d (group %q): the same token is listed twice", i, t.Group)
		}
		s.tokens = append(s.tokens, token{hash: [sha256.Size]byte(b), group: t.Group})
		if !slices.Contains(s.groups, t.Group) {
			s.groups = append(s.groups, t.Group)
		}
	}
	slices.Sort(s.groups)
	return s, nil
}

// Groups returns the data-plane groups the ledger knows (the tokens'),
// sorted: the data planes that get a floor.
func (s *QuotaServer) Groups() []string { return slices.Clone(s.groups) }

// authenticate checks a LeaseRequest's token (against every hash, in
// constant time) and group, as SyncServer does a Hello's.
func (s *QuotaServer) authenticate(tok, group string) error {
	sum := sha256.Sum256([]byte(tok))
	var found *token
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(sum[:], s.tokens[i].hash[:]) == 1 {
			found = &s.tokens[i]
		}
	}
	if found == nil {
		return status.Error(codes.Unauthenticated, "controlplane: unknown data-plane token")
	}
	if group != found.group {
		return status.Errorf(codes.PermissionDenied, "controlplane: the token is not for group %q", group)
	}
	return nil
}

// Record ids of the ledger in the QuotaLedgerStore. A slot is (consumer,
// scope, policy, epoch), its fields query-escaped (so none holds '|')
// and the epoch in 20 digits: "e/<slot>|<period start, Unix ns, 20
// digits>" is an entry (a quotaledger.State), "a/<slot>" the slot's
// period anchor (quotaAnchor), "d/<group>" a data plane's totals
// (DataPlaneUsage). An entry id sorts after its anchor's, so locking the
// anchors first and then the entries is the order QuotaTx asks for.
const (
	quotaEntryPrefix     = "e/"
	quotaAnchorPrefix    = "a/"
	quotaDataPlanePrefix = "d/"
	quotaThresholdPrefix = "t/"
)

// slot is an entry key without its period start.
type slot struct {
	consumer, scope, policy string
	epoch                   uint64
}

func (sl slot) String() string {
	return url.QueryEscape(sl.consumer) + "|" + url.QueryEscape(sl.scope) + "|" + url.QueryEscape(sl.policy) + "|" + fmt.Sprintf("%020d", sl.epoch)
}

func (sl slot) anchorID() string { return quotaAnchorPrefix + sl.String() }

func (sl slot) entryID(start time.Time) string {
	return quotaEntryPrefix + sl.String() + "|" + fmt.Sprintf("%020d", start.UnixNano())
}

func (sl slot) key(start time.Time) lease.EntryKey {
	return lease.EntryKey{Consumer: sl.consumer, Scope: sl.scope, Policy: sl.policy, PeriodStart: start, Epoch: sl.epoch}
}

// consumerPrefix is the prefix of every entry id of consumer.
func consumerPrefix(consumer string) string {
	return quotaEntryPrefix + url.QueryEscape(consumer) + "|"
}

// thresholdPrefix is the prefix of the ids of consumer's threshold
// events (lease.ThresholdEvent), each kept under its data plane and
// event id.
func thresholdPrefix(consumer string) string {
	return quotaThresholdPrefix + url.QueryEscape(consumer) + "|"
}

// quotaAnchor is a slot's period anchor: the start and length of the
// latest period opened. The periods after it run back to back from its
// end, each as long as the renewal in force when it starts.
type quotaAnchor struct {
	Start  time.Time     `json:"start"`
	Period time.Duration `json:"period"`
}

// at returns the anchor of the period in force at now, period being the
// renewal in force: a itself until its end (and before its start, a
// clock behind the one that wrote it), else the period of the back to
// back run from a's end that holds now.
func (a quotaAnchor) at(now time.Time, period time.Duration) quotaAnchor {
	end := a.Start.Add(a.Period)
	if now.Before(end) {
		return a
	}
	k := now.Sub(end) / period
	return quotaAnchor{Start: end.Add(k * period), Period: period}
}

// keep is how long a record of a period of length p is kept after it
// ends.
func (s *QuotaServer) keep(p time.Duration) time.Duration { return max(s.o.Retention, 2*p) }

// canonicalConsumer returns the engine's name of a consumer: a key's hash
// in either form becomes identity.KeyHash.ConsumerID's ("key:" and 32
// lower-case hex digits), with the key's hash prefix ("sha256:" and 32
// hex digits) to find it by; anything else is returned as it is, with
// isKey false.
func canonicalConsumer(c string) (canon, hashPrefix string, isKey bool) {
	if h, err := identity.ParseKeyHash(c); err == nil {
		return h.ConsumerID(), "sha256:" + hex.EncodeToString(h[:16]), true
	}
	if rest, ok := strings.CutPrefix(c, "key:"); ok && len(rest) == 32 {
		if b, err := hex.DecodeString(rest); err == nil {
			x := hex.EncodeToString(b)
			return "key:" + x, "sha256:" + x, true
		}
	}
	return c, "", false
}

// findKey returns the key whose hash starts with hashPrefix ("sha256:"
// and 32 hex digits), or nil: the first key listed after the prefix.
func findKey(r Reader, hashPrefix string) (*spec.Key, error) {
	ks, err := r.Keys(hashPrefix, 1)
	if err != nil || len(ks) == 0 || !strings.HasPrefix(ks[0].KeyHash, hashPrefix) {
		return nil, err
	}
	return &ks[0], nil
}

// target is what the configuration says of one request's entry: its slot
// and the ledger Config to open it with (Key without period start), or
// why none may be opened (refusal).
type target struct {
	slot    slot
	cfg     quotaledger.Config
	refusal string // non-empty: no entry may be opened or granted from
}

// resolver finds targets from one read of the configuration.
type resolver struct {
	s    *QuotaServer
	r    Reader
	keys map[string]*spec.Key // by hash prefix
}

func (rv *resolver) key(prefix string) (*spec.Key, error) {
	if k, ok := rv.keys[prefix]; ok {
		return k, nil
	}
	k, err := findKey(rv.r, prefix)
	if err != nil {
		return nil, err
	}
	rv.keys[prefix] = k
	return k, nil
}

// target resolves k (an entry key as a request named it).
func (rv *resolver) target(k lease.EntryKey) (target, error) {
	consumer, prefix, isKey := canonicalConsumer(k.Consumer)
	t := target{slot: slot{consumer: consumer, scope: k.Scope, policy: k.Policy, epoch: k.Epoch}}
	refuse := func(format string, args ...any) (target, error) {
		t.refusal = fmt.Sprintf(format, args...)
		return t, nil
	}
	var q *spec.Quota
	var epoch uint64
	checkEpoch := false
	if k.Policy != "" {
		p, err := rv.r.Policy(k.Policy)
		if err != nil {
			return t, err
		}
		if p == nil {
			return refuse("no policy %q", k.Policy)
		}
		q = p.Quota
		if isKey {
			key, err := rv.key(prefix)
			if err != nil {
				return t, err
			}
			if key == nil {
				return refuse("no key of consumer %q", consumer)
			}
			if !slices.Contains(key.Policies, k.Policy) {
				return refuse("key of consumer %q does not have policy %q", consumer, k.Policy)
			}
			epoch, checkEpoch = key.QuotaEpoch, true
		}
		if q == nil || q.Global == nil {
			return refuse("policy %q has no global quota", k.Policy)
		}
	} else {
		if !isKey {
			return refuse("consumer %q is not a key (\"key:\" and 32 hex digits, or \"sha256:\" and 64) and no policy is named", k.Consumer)
		}
		key, err := rv.key(prefix)
		if err != nil {
			return t, err
		}
		if key == nil {
			return refuse("no key of consumer %q", consumer)
		}
		l, ok := key.APILimits[k.Scope]
		if !ok {
			return refuse("key of consumer %q has no api_limits for %q", consumer, k.Scope)
		}
		q, epoch, checkEpoch = l.Quota, l.QuotaEpoch, true
		if q == nil || q.Global == nil {
			return refuse("key of consumer %q: api_limits[%q] has no global quota", consumer, k.Scope)
		}
	}
	if checkEpoch && k.Epoch != epoch {
		return refuse("quota epoch %d is not the control plane's %d (a reset opens a new entry)", k.Epoch, epoch)
	}
	mode, err := lease.ParseMode(q.Global.Mode)
	if err != nil {
		return refuse("%v", err)
	}
	floors := map[string]int64{}
	if mode != lease.Strict && q.Global.Floor > 0 {
		floor := q.Global.Floor
		if n := int64(len(rv.s.groups)); mode == lease.Reserved && n > 0 && floor > q.Max/n {
			// Reserved floors are debited from the quota together: when
			// the configured floor does not fit n times, each data plane
			// gets an equal part of the quota (validation judges one
			// data plane's floor against max; only here is n known).
			floor = q.Max / n
		}
		for _, g := range rv.s.groups {
			floors[g] = floor
		}
	}
	t.cfg = quotaledger.Config{Key: t.slot.key(time.Time{}), Quota: q.Max, Period: time.Duration(q.Renewal), Mode: mode,
		Floors: floors, LeaseDuration: time.Duration(q.Global.LeaseDuration)}
	return t, nil
}

// DataPlaneUsage is one data plane's totals over every entry, since the
// ledger began (pruned entries included): GET /api/usage/dataplanes.
type DataPlaneUsage struct {
	DataPlane string `json:"data_plane"`
	// Leases and Granted are the leases granted and their units.
	Leases  int64 `json:"leases"`
	Granted int64 `json:"granted"`
	// Reports is the reports applied (repeats and stale ones not counted).
	Reports int64 `json:"reports"`
	// Spent, FloorSpent, Admitted and Refused are the sums over entries
	// of quotaledger.Usage's.
	Spent      int64 `json:"spent"`
	FloorSpent int64 `json:"floor_spent"`
	Admitted   int64 `json:"admitted"`
	Refused    int64 `json:"refused"`
}

// work is one item of a batch: a grant request or a report.
type work struct {
	grant  *lease.GrantRequest
	report *lease.Report
	t      target
	// entry is the entry key the item resolved to (set in the
	// transaction); id its record id.
	entry lease.EntryKey
	id    string
	// cur is the period in force now by the slot's anchor (nil: none).
	cur *quotaAnchor
}

func (w *work) named() lease.EntryKey {
	if w.grant != nil {
		return w.grant.Entry
	}
	return w.report.Entry
}

// Lease implements syncpb.QuotaServiceServer.
func (s *QuotaServer) Lease(ctx context.Context, req *syncpb.LeaseRequest) (*syncpb.LeaseResponse, error) {
	group := req.GetGroup()
	if err := s.authenticate(req.GetToken(), group); err != nil {
		s.o.Metrics.quotaCallRefused(status.Code(err))
		from := "unknown"
		if p, ok := peer.FromContext(ctx); ok {
			from = p.Addr.String()
		}
		s.refusals.Failed(fmt.Errorf("%s group=%q peer=%s", status.Convert(err).Message(), group, from))
		return nil, err
	}
	var b lease.Batch
	if err := json.Unmarshal(req.GetBody(), &b); err != nil {
		s.o.Metrics.quotaCallRefused(codes.InvalidArgument)
		return nil, status.Errorf(codes.InvalidArgument, "controlplane: quota: the body is not a lease.Batch in JSON: %v", err)
	}
	if n := len(b.Grants) + len(b.Reports) + len(b.Thresholds); n > MaxLeaseBatch {
		s.o.Metrics.quotaCallRefused(codes.InvalidArgument)
		return nil, status.Errorf(codes.InvalidArgument, "controlplane: quota: %d grant requests and reports in one batch, at most %d", n, MaxLeaseBatch)
	}
	items := make([]*work, 0, len(b.Grants)+len(b.Reports))
	// Reports first: their releases are there for the batch's requests.
	for i := range b.Reports {
		r := &b.Reports[i]
		if r.DataPlane != group {
			s.o.Metrics.quotaCallRefused(codes.PermissionDenied)
			return nil, status.Errorf(codes.PermissionDenied, "controlplane: quota: reports[%d] is of data plane %q, not the call's group %q (a data plane reports only for itself)", i, r.DataPlane, group)
		}
		items = append(items, &work{report: r})
	}
	for i := range b.Grants {
		g := &b.Grants[i]
		if g.ID.DataPlane != group {
			s.o.Metrics.quotaCallRefused(codes.PermissionDenied)
			return nil, status.Errorf(codes.PermissionDenied, "controlplane: quota: grants[%d] is for data plane %q, not the call's group %q (a data plane asks only for itself)", i, g.ID.DataPlane, group)
		}
		items = append(items, &work{grant: g})
	}
	err := s.o.Store.View(ctx, func(r Reader) error {
		rv := &resolver{s: s, r: r, keys: map[string]*spec.Key{}}
		for _, w := range items {
			t, err := rv.target(w.named())
			if err != nil {
				return err
			}
			w.t = t
		}
		return nil
	})
	if err != nil {
		return nil, s.storeError("read the configuration", err)
	}
	start := time.Now()
	now := s.o.Now()
	var res *batchResult
	for i := range b.Thresholds {
		ev := &b.Thresholds[i]
		if ev.ID == "" || ev.Consumer == "" || ev.PeriodEnd.IsZero() {
			s.o.Metrics.quotaCallRefused(codes.InvalidArgument)
			return nil, status.Errorf(codes.InvalidArgument, "controlplane: quota: thresholds[%d] lacks its id, consumer or period end", i)
		}
		ev.DataPlane = group
	}
	err = s.ledger.UpdateQuota(ctx, func(tx QuotaTx) error {
		var err error
		if res, err = s.apply(tx, now, group, items); err != nil {
			return err
		}
		for i := range b.Thresholds {
			ev := &b.Thresholds[i]
			v, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			// Kept as an entry is: max(Retention, 2 periods) after its end.
			keep := s.keep(ev.PeriodEnd.Sub(ev.PeriodStart))
			// Per data plane: each counts a quota that is not global on its
			// own, so two may reach the same event.
			tx.Put(thresholdPrefix(ev.Consumer)+url.QueryEscape(group)+"|"+ev.ID, QuotaRecord{Value: v, Expires: ev.PeriodEnd.Add(keep)})
		}
		res.answer.Thresholds = len(b.Thresholds)
		return nil
	})
	s.o.Metrics.quotaWrite(time.Since(start))
	if err != nil {
		return nil, s.storeError("write the ledger", err)
	}
	res.count(s.o.Metrics, group)
	body, err := json.Marshal(res.answer)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "controlplane: quota: encode the answer: %v", err)
	}
	s.maybePrune(ctx, now)
	return &syncpb.LeaseResponse{Body: body}, nil
}

// storeError maps a store's error to the call's status.
func (s *QuotaServer) storeError(op string, err error) error {
	var ie *internalError
	switch {
	case errors.Is(err, ErrClosed), errors.Is(err, ErrStoreUnavailable):
		s.o.Metrics.quotaCallRefused(codes.Unavailable)
		return status.Errorf(codes.Unavailable, "controlplane: quota: %s: %v; send the same batch again later", op, err)
	case errors.Is(err, context.Canceled):
		return status.FromContextError(err).Err()
	case errors.Is(err, context.DeadlineExceeded):
		s.o.Metrics.quotaCallRefused(codes.Unavailable)
		return status.Errorf(codes.Unavailable, "controlplane: quota: %s: %v; send the same batch again later", op, err)
	case errors.As(err, &ie):
		s.o.Log.Error("controlplane: quota: a ledger record is damaged", "err", err)
		return status.Errorf(codes.Internal, "controlplane: quota: %v", err)
	}
	s.o.Log.Error("controlplane: quota: "+op+" failed", "err", err)
	s.o.Metrics.quotaCallRefused(codes.Unavailable)
	return status.Errorf(codes.Unavailable, "controlplane: quota: %s: %v", op, err)
}

// internalError is a ledger record that does not decode or restore.
type internalError struct{ err error }

func (e *internalError) Error() string { return e.err.Error() }
func (e *internalError) Unwrap() error { return e.err }

// maybePrune prunes up to PruneLimit expired records when PruneInterval
// has passed since the last prune of this server.
func (s *QuotaServer) maybePrune(ctx context.Context, now time.Time) {
	if s.o.PruneInterval < 0 {
		return
	}
	s.pruneMu.Lock()
	due := now.Sub(s.lastPrune) >= s.o.PruneInterval
	if due {
		s.lastPrune = now
	}
	s.pruneMu.Unlock()
	if !due {
		return
	}
	if _, err := s.ledger.PruneQuota(ctx, now, s.o.PruneLimit); err != nil && ctx.Err() == nil {
		s.o.Log.Warn("controlplane: quota: prune the ledger", "err", err)
	}
}

// batchResult is what one run of apply produced.
type batchResult struct {
	answer lease.BatchAnswer
	// per mode: new leases and their units; reports applied
	leases, granted, reports map[lease.Mode]int64
	refusals                 map[lease.Refusal]int64
}

func (r *batchResult) count(m *Metrics, group string) {
	for mode, n := range r.leases {
		m.quotaGranted(group, mode.String(), n, r.granted[mode])
	}
	for mode, n := range r.reports {
		m.quotaReported(group, mode.String(), n)
	}
	for why, n := range r.refusals {
		m.quotaRefused(group, why.String(), n)
	}
}

func (r *batchResult) refuse(w *work, why lease.Refusal, msg string) {
	rf := lease.Refused{Entry: w.named(), Why: why, Error: msg}
	if w.entry.Consumer != "" {
		rf.Entry = w.entry
	}
	if w.grant != nil {
		id := w.grant.ID
		rf.Request = &id
	} else {
		rf.Report = &lease.ReportRef{Token: w.report.Token, Seq: w.report.Seq}
	}
	r.answer.Refusals = append(r.answer.Refusals, rf)
	r.refusals[why]++
}

// apply runs one batch in tx at now: it locks the batch's anchors and
// the data plane's totals, resolves every item's entry, locks the
// entries, applies reports and grants, and writes what changed. It keeps
// no state outside its result (UpdateQuota may run it again).
func (s *QuotaServer) apply(tx QuotaTx, now time.Time, group string, items []*work) (*batchResult, error) {
	res := &batchResult{leases: map[lease.Mode]int64{}, granted: map[lease.Mode]int64{}, reports: map[lease.Mode]int64{}, refusals: map[lease.Refusal]int64{}}
	dpID := quotaDataPlanePrefix + url.QueryEscape(group)
	ids := []string{dpID}
	for _, w := range items {
		w.entry, w.id, w.cur = lease.EntryKey{}, "", nil // a run again starts afresh
		ids = append(ids, w.t.slot.anchorID())
	}
	recs, err := tx.Lock(ids)
	if err != nil {
		return nil, err
	}
	anchors := map[string]*quotaAnchor{}
	for id, r := range recs {
		if id == dpID {
			continue
		}
		var a quotaAnchor
		if err := json.Unmarshal(r.Value, &a); err != nil {
			return nil, &internalError{fmt.Errorf("controlplane: quota: anchor %q: %w", id, err)}
		}
		anchors[id] = &a
	}
	var totals DataPlaneUsage
	if r, ok := recs[dpID]; ok {
		if err := json.Unmarshal(r.Value, &totals); err != nil {
			return nil, &internalError{fmt.Errorf("controlplane: quota: data plane totals %q: %w", dpID, err)}
		}
	}
	totals.DataPlane = group
	changedAnchors := map[string]bool{}

	// Resolve each item's entry: the period start it names, or the
	// period in force now (w.cur, from the anchor; now itself for a
	// slot's first grant request anywhere).
	var entryIDs []string
	for _, w := range items {
		if w.t.refusal != "" && w.grant != nil {
			continue
		}
		if a := anchors[w.t.slot.anchorID()]; a != nil {
			period := a.Period
			if w.t.refusal == "" {
				period = w.t.cfg.Period
			}
			c := a.at(now, period)
			w.cur = &c
		} else if w.grant != nil {
			w.cur = &quotaAnchor{Start: now, Period: w.t.cfg.Period}
		}
		switch named := w.named().PeriodStart; {
		case !named.IsZero():
			w.entry = w.t.slot.key(named)
		case w.cur != nil && w.grant != nil && !w.grant.After.IsZero() && !w.cur.Start.After(w.grant.After):
			// The holder has finished with this period (its clock put the
			// end earlier than ours): it asks again.
			res.refuse(w, lease.RefusedUnknownEntry, fmt.Sprintf("the period after %s has not started", w.grant.After.Format(time.RFC3339Nano)))
			continue
		case w.cur != nil:
			w.entry = w.t.slot.key(w.cur.Start)
		default:
			res.refuse(w, lease.RefusedUnknownEntry, "no period of this entry has been opened (a report names the period start of a grant)")
			continue
		}
		w.id = w.t.slot.entryID(w.entry.PeriodStart)
		entryIDs = append(entryIDs, w.id)
	}
	erecs, err := tx.Lock(entryIDs)
	if err != nil {
		return nil, err
	}
	entries := map[string]*quotaledger.Entry{}
	before := map[string]quotaledger.Usage{}
	for id, r := range erecs {
		var st quotaledger.State
		if err := json.Unmarshal(r.Value, &st); err != nil {
			return nil, &internalError{fmt.Errorf("controlplane: quota: entry %q: %w", id, err)}
		}
		e, err := quotaledger.Restore(st)
		if err != nil {
			return nil, &internalError{fmt.Errorf("controlplane: quota: entry %q: %w", id, err)}
		}
		entries[id] = e
		before[id] = usageOf(e, group)
	}
	touched := map[string]bool{}
	for _, w := range items {
		if w.id == "" {
			if w.t.refusal != "" && w.grant != nil {
				res.refuse(w, lease.RefusedUnknownEntry, w.t.refusal)
			}
			continue
		}
		e := entries[w.id]
		if e == nil {
			// Open it: only the period in force now, from the
			// configuration; the anchor moves to it.
			cur := w.cur
			switch {
			case w.t.refusal != "":
				res.refuse(w, lease.RefusedUnknownEntry, w.t.refusal)
				continue
			case w.entry.PeriodStart.After(now):
				res.refuse(w, lease.RefusedUnknownEntry, fmt.Sprintf("period start %s is in the future", w.entry.PeriodStart.Format(time.RFC3339Nano)))
				continue
			case cur == nil || !w.entry.PeriodStart.Equal(cur.Start):
				res.refuse(w, lease.RefusedUnknownEntry, fmt.Sprintf("period start %s is not the period in force and has no entry (never opened, or pruned)", w.entry.PeriodStart.Format(time.RFC3339Nano)))
				continue
			}
			c := w.t.cfg
			c.Key = w.entry
			// (Open refuses reserved floors that exceed the quota
			// together: validation checks one data plane's floor.)
			var err error
			if e, err = quotaledger.Open(c); err != nil {
				res.refuse(w, lease.RefusedUnknownEntry, err.Error())
				continue
			}
			entries[w.id] = e
			before[w.id] = quotaledger.Usage{DataPlane: group}
			anchors[w.t.slot.anchorID()] = cur
			changedAnchors[w.t.slot.anchorID()] = true
		}
		w.entry = e.Key()
		mode := e.Config().Mode
		if w.report != nil {
			rep := *w.report
			rep.Entry = e.Key()
			ack, err := e.Report(now, rep)
			if err != nil {
				res.refuse(w, refusalOf(err), err.Error())
				continue
			}
			res.answer.Acks = append(res.answer.Acks, ack)
			res.reports[mode]++
			touched[w.id] = true
			continue
		}
		if w.t.refusal != "" {
			res.refuse(w, lease.RefusedUnknownEntry, w.t.refusal)
			continue
		}
		req := *w.grant
		req.Entry = e.Key()
		_, had := e.Lease(req.ID)
		g, err := e.Grant(now, req)
		if err != nil {
			res.refuse(w, refusalOf(err), err.Error())
			continue
		}
		if !had && g.Amount > 0 {
			res.leases[mode]++
			res.granted[mode] += g.Amount
			totals.Leases++
			totals.Granted += g.Amount
		}
		res.answer.Grants = append(res.answer.Grants, g)
		touched[w.id] = true
	}
	for id := range touched {
		e := entries[id]
		st := e.State()
		v, err := json.Marshal(st)
		if err != nil {
			return nil, fmt.Errorf("controlplane: quota: encode entry %q: %w", id, err)
		}
		end := st.Config.Key.PeriodStart.Add(st.Config.Period)
		tx.Put(id, QuotaRecord{Value: v, Expires: end.Add(s.keep(st.Config.Period))})
		b, a := before[id], usageOf(e, group)
		totals.Spent += a.Spent - b.Spent
		totals.FloorSpent += a.FloorSpent - b.FloorSpent
		totals.Admitted += a.Admitted - b.Admitted
		totals.Refused += a.Refused - b.Refused
	}
	for _, n := range res.reports {
		totals.Reports += n
	}
	for aid := range changedAnchors {
		a := anchors[aid]
		if a == nil {
			continue
		}
		v, err := json.Marshal(a)
		if err != nil {
			return nil, fmt.Errorf("controlplane: quota: encode anchor: %w", err)
		}
		tx.Put(aid, QuotaRecord{Value: v, Expires: a.Start.Add(a.Period).Add(s.keep(a.Period))})
	}
	if len(touched) > 0 {
		v, err := json.Marshal(totals)
		if err != nil {
			return nil, fmt.Errorf("controlplane: quota: encode totals: %w", err)
		}
		tx.Put(dpID, QuotaRecord{Value: v})
	}
	return res, nil
}

// usageOf is group's Usage of e (zero when it has none).
func usageOf(e *quotaledger.Entry, group string) quotaledger.Usage {
	for _, u := range e.Usage() {
		if u.DataPlane == group {
			return u
		}
	}
	return quotaledger.Usage{DataPlane: group}
}

// refusalOf is the lease.Refusal of a ledger error.
func refusalOf(err error) lease.Refusal {
	if errors.Is(err, quotaledger.ErrStaleToken) {
		return lease.RefusedStaleToken
	}
	return lease.RefusedUnknownEntry
}
