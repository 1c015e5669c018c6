package controlplane

import (
	"context"
	"time"
)

// QuotaRecord is one record of the global-quota ledger's durable state
// (QuotaLedgerStore): a value the quota server wrote (a ledger entry's
// quotaledger.State, a period anchor, a data plane's totals, as JSON) and
// when it may be pruned.
type QuotaRecord struct {
	// Value is the record's bytes; never empty for a stored record.
	Value []byte
	// Expires is when PruneQuota may delete the record; zero: never.
	Expires time.Time
}

// QuotaTx is one transaction of QuotaLedgerStore.UpdateQuota.
//
// Deadlock freedom across transactions (and, on PostgreSQL, across
// control-plane processes) rests on one rule: Lock sorts the ids of each
// call, and every transaction locks in phases whose records another
// transaction can only reach after locking a record of an earlier phase
// (the quota server locks a batch's period anchors and its data plane's
// totals first, then the entries of those anchors).
type QuotaTx interface {
	// Lock reads the records of ids and holds them until the
	// transaction ends: no other transaction (of this process or, on
	// PostgreSQL, another on the same database) reads them to write, or
	// writes them, meanwhile. Records that do not exist are absent from
	// the result, and are held too: a concurrent transaction that would
	// create one waits. Locking an id twice is harmless.
	Lock(ids []string) (map[string]QuotaRecord, error)
	// Put writes r under id when the transaction commits.
	Put(id string, r QuotaRecord)
	// Delete deletes id when the transaction commits.
	Delete(id string)
}

// QuotaLedgerStore keeps the global-quota ledger's state (the quota
// server's, see QuotaServer) beside a Store's configuration but outside
// it: a ledger write raises no revision, appends nothing to the change
// log, wakes no RevisionChanged waiter, and is not part of GET
// /api/export or POST /api/import (the ledger is state of the data
// planes' spending, not configuration: an import neither carries nor
// clears it). Bolt and Postgres implement it.
type QuotaLedgerStore interface {
	// UpdateQuota runs fn in one read-write transaction and commits what
	// it put and deleted; it returns once that is durable (fsynced by
	// bbolt, committed by PostgreSQL). An error from fn is returned as is
	// and nothing is written. fn may be run again when the database
	// breaks the transaction off to resolve a deadlock or a
	// serialisation failure: it must act only through tx and keep no
	// effect of a run that did not return last. Errors: ErrClosed after
	// Close; errors wrapping ErrStoreUnavailable (and ErrCommitUnknown
	// when the commit's answer was lost) when the database cannot be
	// reached.
	UpdateQuota(ctx context.Context, fn func(tx QuotaTx) error) error
	// ScanQuota calls fn for every record whose id starts with prefix, in
	// id order (byte-wise), from one consistent view, until fn returns
	// an error (returned as is).
	ScanQuota(ctx context.Context, prefix string, fn func(id string, r QuotaRecord) error) error
	// PruneQuota deletes at most limit records whose Expires is before
	// now (skipping, on PostgreSQL, records another transaction holds)
	// and returns how many it deleted.
	PruneQuota(ctx context.Context, now time.Time, limit int) (int, error)
}
