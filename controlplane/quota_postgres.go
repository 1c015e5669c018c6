package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var _ QuotaLedgerStore = (*Postgres)(nil)

// pgQuotaRetries is how many times UpdateQuota runs a transaction the
// server broke off (deadlock detected, serialisation failure).
const pgQuotaRetries = 5

// pgQuotaTx is a QuotaTx on one PostgreSQL transaction of table lp_quota
// (migration 0002). Lock first inserts a placeholder row (value NULL)
// for every id not there, in id order, so that an id nobody has written
// yet is held as well as one that exists (two replicas that both find an
// entry missing must not both create it); then it reads the rows with
// SELECT … ORDER BY id FOR UPDATE. Writes are kept until the commit and
// sent with it in one round trip; placeholders not written are deleted
// there.
type pgQuotaTx struct {
	ctx          context.Context
	tx           pgx.Tx
	puts         map[string]QuotaRecord
	dels         map[string]bool
	placeholders map[string]bool
}

func (t *pgQuotaTx) Lock(ids []string) (map[string]QuotaRecord, error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out := make(map[string]QuotaRecord, len(ids))
	// A row that existed at the INSERT (so none was inserted) may be
	// deleted (pruned) before the SELECT locks it: such ids are held
	// again, with a placeholder this time, until every id is a row held.
	for pending, round := ids, 0; len(pending) > 0; round++ {
		if round == 10 {
			return nil, fmt.Errorf("controlplane: postgres: quota records %q vanish as they are locked", pending)
		}
		held, err := t.lockOnce(pending, out)
		if err != nil {
			return nil, err
		}
		pending = slices.DeleteFunc(pending, func(id string) bool { return held[id] })
	}
	// A write of this transaction is what it reads.
	for _, id := range ids {
		if r, ok := t.puts[id]; ok {
			out[id] = r
		} else if t.dels[id] {
			delete(out, id)
		}
	}
	return out, nil
}

// lockOnce inserts placeholders for the ids not in the table and locks
// the rows of ids, adding those with a value to out; it returns the ids
// whose rows it holds.
func (t *pgQuotaTx) lockOnce(ids []string, out map[string]QuotaRecord) (map[string]bool, error) {
	rows, err := t.tx.Query(t.ctx, `INSERT INTO lp_quota (id) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT (id) DO NOTHING RETURNING id`, ids)
	if err != nil {
		return nil, dbErr("hold the quota records", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, dbErr("hold the quota records", err)
		}
		t.placeholders[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("hold the quota records", err)
	}
	rows, err = t.tx.Query(t.ctx, `SELECT id, value, expires FROM lp_quota WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`, ids)
	if err != nil {
		return nil, dbErr("lock the quota records", err)
	}
	defer rows.Close()
	held := make(map[string]bool, len(ids))
	for rows.Next() {
		var id string
		var v []byte
		var exp *time.Time
		if err := rows.Scan(&id, &v, &exp); err != nil {
			return nil, dbErr("lock the quota records", err)
		}
		held[id] = true
		if v == nil {
			continue // our placeholder (others' are never committed)
		}
		r := QuotaRecord{Value: v}
		if exp != nil {
			r.Expires = *exp
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("lock the quota records", err)
	}
	return held, nil
}

func (t *pgQuotaTx) Put(id string, r QuotaRecord) {
	delete(t.dels, id)
	t.puts[id] = QuotaRecord{Value: slices.Clone(r.Value), Expires: r.Expires}
}

func (t *pgQuotaTx) Delete(id string) {
	delete(t.puts, id)
	t.dels[id] = true
}

// commit sends the writes and COMMIT in one round trip.
func (t *pgQuotaTx) commit() error {
	var pb pgx.Batch
	if len(t.puts) > 0 {
		ids := make([]string, 0, len(t.puts))
		for id := range t.puts {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		vs := make([][]byte, len(ids))
		exps := make([]*time.Time, len(ids))
		for i, id := range ids {
			r := t.puts[id]
			vs[i] = r.Value
			if !r.Expires.IsZero() {
				e := r.Expires
				exps[i] = &e
			}
		}
		pb.Queue(`INSERT INTO lp_quota (id, value, expires) SELECT * FROM unnest($1::text[], $2::bytea[], $3::timestamptz[])
			ON CONFLICT (id) DO UPDATE SET value = excluded.value, expires = excluded.expires`, ids, vs, exps)
	}
	var dels []string
	for id := range t.dels {
		dels = append(dels, id)
	}
	for id := range t.placeholders {
		if _, put := t.puts[id]; !put && !t.dels[id] {
			dels = append(dels, id)
		}
	}
	if len(dels) > 0 {
		pb.Queue(`DELETE FROM lp_quota WHERE id = ANY($1::text[])`, dels)
	}
	pb.Queue("COMMIT")
	if err := t.tx.SendBatch(t.ctx, &pb).Close(); err != nil {
		err = dbErr("write the quota ledger and commit", err)
		if errors.Is(err, ErrStoreUnavailable) {
			err = commitUnknown{err}
		}
		return err
	}
	return nil
}

// retryable reports whether err is the server breaking a transaction off
// for another to go on: a deadlock or a serialisation failure.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// UpdateQuota implements QuotaLedgerStore: one READ COMMITTED
// transaction whose Locks are row locks (see pgQuotaTx), so that control
// planes sharing the database serialise per record; bounded by
// PostgresOptions.WriteTimeout. It does not take the revision row's lock
// and does not NOTIFY.
func (p *Postgres) UpdateQuota(ctx context.Context, fn func(tx QuotaTx) error) error {
	if p.closed.Load() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, p.o.WriteTimeout)
	defer cancel()
	var err error
	for range pgQuotaRetries {
		if err = p.updateQuotaOnce(ctx, fn); !retryable(err) {
			return err
		}
	}
	return err
}

func (p *Postgres) updateQuotaOnce(ctx context.Context, fn func(tx QuotaTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		if p.closed.Load() {
			return ErrClosed
		}
		return dbErr("connect", err)
	}
	defer release(ctx, conn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return dbErr("begin", err)
	}
	t := &pgQuotaTx{ctx: ctx, tx: tx, puts: map[string]QuotaRecord{}, dels: map[string]bool{}, placeholders: map[string]bool{}}
	if err := fn(t); err != nil {
		return err // release rolls back
	}
	if err := t.commit(); err != nil {
		return err
	}
	if st := txStatus(conn); st != 'I' {
		return fmt.Errorf("controlplane: quota ledger commit left the transaction in state %q: %w", st, ErrStoreUnavailable)
	}
	return nil
}

// ScanQuota implements QuotaLedgerStore, from one repeatable-read view.
func (p *Postgres) ScanQuota(ctx context.Context, prefix string, fn func(id string, r QuotaRecord) error) error {
	if p.closed.Load() {
		return ErrClosed
	}
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return dbErr("begin", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// id >= prefix and id < prefixEnd: the primary key's range.
	q, args := `SELECT id, value, expires FROM lp_quota WHERE id >= $1 AND value IS NOT NULL ORDER BY id`, []any{prefix}
	if end := prefixEnd(prefix); end != "" {
		q, args = `SELECT id, value, expires FROM lp_quota WHERE id >= $1 AND id < $2 AND value IS NOT NULL ORDER BY id`, []any{prefix, end}
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return dbErr("read the quota ledger", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var v []byte
		var exp *time.Time
		if err := rows.Scan(&id, &v, &exp); err != nil {
			return dbErr("read the quota ledger", err)
		}
		if len(id) < len(prefix) || id[:len(prefix)] != prefix {
			break
		}
		r := QuotaRecord{Value: v}
		if exp != nil {
			r.Expires = *exp
		}
		if err := fn(id, r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return dbErr("read the quota ledger", err)
	}
	return nil
}

// PruneQuota implements QuotaLedgerStore: rows held by another
// transaction are skipped (SKIP LOCKED), so a prune never waits for, nor
// deadlocks with, a ledger write.
func (p *Postgres) PruneQuota(ctx context.Context, now time.Time, limit int) (int, error) {
	if p.closed.Load() {
		return 0, ErrClosed
	}
	tag, err := p.pool.Exec(ctx, `DELETE FROM lp_quota WHERE id IN (
		SELECT id FROM lp_quota WHERE expires < $1 ORDER BY expires LIMIT $2 FOR UPDATE SKIP LOCKED)`, now, limit)
	if err != nil {
		return 0, dbErr("prune the quota ledger", err)
	}
	return int(tag.RowsAffected()), nil
}

// prefixEnd is the least string above every string that starts with
// prefix, for a range scan; "" when there is none (no bound). A last
// byte of 0x7f or above is dropped and the one before it raised, so the
// bound stays valid UTF-8 for prefixes whose bytes are ASCII.
func prefixEnd(prefix string) string {
	b := []byte(prefix)
	for len(b) > 0 {
		if c := b[len(b)-1]; c < 0x7f {
			b[len(b)-1] = c + 1
			return string(b)
		}
		b = b[:len(b)-1]
	}
	return ""
}
