package controlplane

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// PostgresOptions configure OpenPostgres. The zero value is usable.
type PostgresOptions struct {
	// Password, when set, is the password to connect with, in place of
	// one in the connection string (so that it need not be in a URL
	// that may be shown).
	Password string
	// ChangeLogRevisions is how many of the latest revisions the change
	// log keeps, as BoltOptions.ChangeLogRevisions; 0 means
	// DefaultChangeLogRevisions. Every replica on one database should
	// use the same value.
	ChangeLogRevisions int
	// BatchSize is the most Updates sharing one transaction (and one
	// commit); 0 means 64.
	BatchSize int
	// BatchDelay is how long a write waits for others to share its
	// transaction and commit, as BoltOptions.BatchDelay; 0 means 2ms,
	// negative means no wait (only the writes already waiting share it).
	BatchDelay time.Duration
	// PollInterval is how often the revision is read as a backstop for
	// a lost notification or a broken LISTEN connection; 0 means one
	// second.
	PollInterval time.Duration
	// DisableListen leaves LISTEN out, so writes through another process
	// are learned by polling alone (for a pooler in transaction mode,
	// such as PgBouncer's, which does not pass notifications on).
	DisableListen bool
	// MaxConns bounds the pool's connections (the LISTEN connection
	// aside); 0 means 10.
	MaxConns int32
	// WriteTimeout bounds one write transaction; 0 means 30s.
	WriteTimeout time.Duration
	// ConnectTimeout bounds one connection attempt when the connection
	// string sets none; 0 means 5s.
	ConnectTimeout time.Duration
}

// SchemaVersion is the schema version this program knows: the number of
// the last of its migrations (controlplane/migrations).
const SchemaVersion = 2

// ErrSchemaTooNew is OpenPostgres's error (wrapped) when the database's
// schema is newer than SchemaVersion: a newer program migrated it, and
// this one would misread it.
var ErrSchemaTooNew = errors.New("controlplane: the database's schema is newer than this program knows (upgrade limitplane-controlplane)")

//go:embed migrations/*.sql
var migrationFS embed.FS

// notifyChannel is the channel every write NOTIFYs, with its revision.
const notifyChannel = "limitplane_revision"

// listenAppName is the application_name of the LISTEN connection (seen in
// pg_stat_activity).
const listenAppName = "limitplane-controlplane-listen"

// Postgres is the Store kept in a PostgreSQL database, which any number of
// control-plane processes may share. A write is one transaction that
// locks the single revision row, raises it, writes the objects and
// appends their changes, so revisions are gap-free and totally ordered
// across processes; it is durable when Update returns (as the server's
// synchronous_commit makes commits). Concurrent Updates of one process
// share one transaction (waiting up to BatchDelay for each other): their
// writes are kept in memory and written, with the change log, the
// revision and the NOTIFY, in one round trip at its end; an Update that
// lists keys first writes the batch's so far, and its own under a
// savepoint of its own, so that it can fail alone.
//
// Every writer of the database waits for the revision row's lock, so a
// batch holds it for as little as it can: it first runs its Updates once
// outside any transaction (speculate) to learn which keys they read and
// write, then sends BEGIN, the lock, and the reads of every policy, API
// and those keys in one round trip, runs the Updates on what it read, and
// sends the writes with COMMIT in one more.
//
// It is a RevisionWatcher for writes of every process on the database: a
// write NOTIFYs, a dedicated connection LISTENs (reconnected with
// backoff), and the revision is polled as a backstop.
//
// Errors of an unreachable database (refused, lost, shut down, a standby
// after a failover) wrap ErrStoreUnavailable; nothing of a failed write is
// written.
type Postgres struct {
	pool    *pgxpool.Pool
	o       PostgresOptions
	logRevs uint64

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	calls  chan *pgCall
	wg     sync.WaitGroup
	closed atomic.Bool

	mu      sync.Mutex
	changed chan struct{} // closed when the revision next rises

	// hintPolicies and hintAPIs are every policy and API as the last
	// committed batch left them, for speculate (the writer's alone).
	hintPolicies, hintAPIs map[string][]byte
}

var (
	_ Store           = (*Postgres)(nil)
	_ RevisionWatcher = (*Postgres)(nil)
)

// pgCall is one Update waiting for the writer.
type pgCall struct {
	ctx  context.Context
	fn   func(Tx) error
	done chan struct{}
	rev  uint64
	err  error
}

// RedactURL returns connString with its password replaced by "xxxxx", for
// logs and errors; a string that is not a URL is returned as "(connection
// string)" unless it holds no password.
func RedactURL(connString string) string {
	if u, err := url.Parse(connString); err == nil && u.Scheme != "" {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	if strings.Contains(connString, "password") {
		return "(connection string)"
	}
	// A URL that does not parse (a password with a stray %, say): its
	// user information is cut by hand, up to the last @ before the path.
	if scheme, rest, ok := strings.Cut(connString, "://"); ok {
		end := len(rest)
		if i := strings.IndexAny(rest, "/?"); i >= 0 {
			end = i
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			user, _, _ := strings.Cut(rest[:at], ":")
			return scheme + "://" + user + ":xxxxx" + rest[at:]
		}
	}
	return connString
}

// OpenPostgres connects to the database of connString (a postgres:// URL
// or key=value string, as pgx takes), creates or migrates its schema
// (versioned migrations in the schema_version table, under an advisory
// lock so that replicas starting together migrate once), and starts the
// writer, the LISTEN connection and the poll. It fails wrapping
// ErrSchemaTooNew when the schema is newer than SchemaVersion, and
// wrapping ErrStoreUnavailable when the database cannot be reached.
// Errors never hold the password.
func OpenPostgres(ctx context.Context, connString string, o PostgresOptions) (*Postgres, error) {
	if o.ChangeLogRevisions <= 0 {
		o.ChangeLogRevisions = DefaultChangeLogRevisions
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 64
	}
	if o.BatchDelay == 0 {
		o.BatchDelay = 2 * time.Millisecond
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 10
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		// pgx's parse errors may quote the string; say only where.
		return nil, fmt.Errorf("controlplane: postgres: parse the connection string %s: %s", RedactURL(connString), redactErr(err, o.Password))
	}
	if o.Password != "" {
		cfg.ConnConfig.Password = o.Password
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = o.ConnectTimeout
	}
	cfg.MaxConns = o.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, wrap("postgres", wrapUnavailable(err))
	}
	lctx, cancel := context.WithCancel(context.Background())
	p := &Postgres{pool: pool, o: o, logRevs: uint64(o.ChangeLogRevisions), ctx: lctx, cancel: cancel,
		calls: make(chan *pgCall), changed: make(chan struct{})}
	if err := p.migrate(ctx); err != nil {
		cancel()
		pool.Close()
		return nil, err
	}
	// The poll's first reading is taken now, so that a write after
	// OpenPostgres returns is a change to it however late the first tick.
	var rev int64
	var hist string
	if err := pool.QueryRow(ctx, "SELECT revision, history FROM lp_meta").Scan(&rev, &hist); err != nil {
		cancel()
		pool.Close()
		return nil, dbErr("read the revision", err)
	}
	p.wg.Add(2)
	go p.writer()
	go p.poll(rev, hist)
	if !o.DisableListen {
		p.wg.Add(1)
		go p.listen()
	}
	return p, nil
}

// migrations returns the embedded migrations in order: migrations[i] is
// version i+1.
func migrations() ([]string, error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]string, len(names))
	for i, n := range names {
		v, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(n, "migrations/"), "_", 2)[0])
		if err != nil || v != i+1 {
			return nil, fmt.Errorf("controlplane: migration %s is out of sequence", n)
		}
		b, err := migrationFS.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out[i] = string(b)
	}
	return out, nil
}

// migrateLock is the advisory lock key taken while migrating.
const migrateLock = 0x6c706c616e65 // "lplane"

// migrate creates or migrates the schema in one transaction and makes the
// meta row.
func (p *Postgres) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	if len(ms) != SchemaVersion {
		return fmt.Errorf("controlplane: %d migrations embedded, SchemaVersion is %d", len(ms), SchemaVersion)
	}
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
			version    int PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var v int
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_version").Scan(&v); err != nil {
			return err
		}
		if v > SchemaVersion {
			return fmt.Errorf("%w: the database is at schema version %d, this program knows up to %d", ErrSchemaTooNew, v, SchemaVersion)
		}
		for ; v < len(ms); v++ {
			if _, err := tx.Exec(ctx, ms[v]); err != nil {
				return fmt.Errorf("migration %d: %w", v+1, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO schema_version (version) VALUES ($1)", v+1); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "INSERT INTO lp_meta (id, revision, history) VALUES (true, 0, $1) ON CONFLICT (id) DO NOTHING", newHistory())
		return err
	})
	if err != nil {
		if errors.Is(err, ErrSchemaTooNew) {
			return err
		}
		return wrap("postgres: create or migrate the schema", wrapUnavailable(err))
	}
	return nil
}

// redactErr returns err's text with password replaced.
func redactErr(err error, password string) string {
	s := err.Error()
	if password != "" {
		s = strings.ReplaceAll(s, password, "xxxxx")
	}
	return s
}

// unavailable reports whether err means the database cannot be reached:
// a connection refused, lost or closed, the server shutting down or
// starting, or a read-only standby (a failover not yet followed).
func unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, ErrStoreUnavailable) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", // admin/crash shutdown, cannot connect now
			pe.Code == "25006", // read-only transaction: a standby
			pe.Code == "53300": // too many connections
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.SafeToRetry(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "closed pool")
}

// wrapUnavailable returns err, wrapping ErrStoreUnavailable too when it
// means the database cannot be reached.
func wrapUnavailable(err error) error {
	if err == nil || errors.Is(err, ErrStoreUnavailable) || !unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}

// dbErr wraps an error of the database doing op.
func dbErr(op string, err error) error {
	return wrap("postgres: "+op, wrapUnavailable(err))
}

// RevisionChanged implements RevisionWatcher: the channel returned is
// closed once a write after this call (through this process or another
// on the database) has raised the revision, or the history was forked.
// It may also be closed when the LISTEN connection comes back, which may
// have missed one.
func (p *Postgres) RevisionChanged() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// announce wakes every RevisionChanged waiter.
func (p *Postgres) announce() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.changed)
	p.changed = make(chan struct{})
}

// Close stops the writer, the listener and the poll and closes the pool.
// Writes already acknowledged are committed.
func (p *Postgres) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.cancel()
	p.wg.Wait()
	p.pool.Close()
	return nil
}

// listen keeps a LISTEN connection, reconnecting with backoff, and
// announces every notification, and once after each (re)connection.
func (p *Postgres) listen() {
	defer p.wg.Done()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 50*time.Millisecond, 5*time.Second
	for p.ctx.Err() == nil {
		if p.listenOnce(b) {
			continue // it ran a while: try again at once
		}
		select {
		case <-p.ctx.Done():
		case <-time.After(b.NextBackOff()):
		}
	}
}

// listenOnce connects, LISTENs and announces until the connection breaks.
// It reports whether it got as far as listening (and reset b).
func (p *Postgres) listenOnce(b *backoff.ExponentialBackOff) bool {
	cfg := p.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = listenAppName
	conn, err := pgx.ConnectConfig(p.ctx, cfg)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(p.ctx))
	if _, err := conn.Exec(p.ctx, "LISTEN "+notifyChannel); err != nil {
		return false
	}
	b.Reset()
	p.announce() // a write may have fallen while it was away
	for {
		if _, err := conn.WaitForNotification(p.ctx); err != nil {
			return true
		}
		p.announce()
	}
}

// poll reads the revision and history every PollInterval and announces
// when either changed from the last reading (at first rev and hist): the
// backstop for a lost notification.
func (p *Postgres) poll(rev int64, hist string) {
	defer p.wg.Done()
	t := time.NewTicker(p.o.PollInterval)
	defer t.Stop()
	last := struct {
		rev  int64
		hist string
	}{rev, hist}
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(p.ctx, p.o.PollInterval+5*time.Second)
		var rev int64
		var hist string
		err := p.pool.QueryRow(ctx, "SELECT revision, history FROM lp_meta").Scan(&rev, &hist)
		cancel()
		if err != nil {
			continue
		}
		if rev != last.rev || hist != last.hist {
			p.announce()
		}
		last.rev, last.hist = rev, hist
	}
}

// Update implements Store. fn runs in the writer's transaction, which
// other Updates may share: a failing fn is dropped alone and the others
// are kept. fn is called again (in a new transaction) only when a read of
// another fn in its transaction failed in the database, which aborts the
// transaction.
func (p *Postgres) Update(ctx context.Context, fn func(tx Tx) error) (uint64, error) {
	if p.closed.Load() {
		return 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c := &pgCall{ctx: ctx, fn: fn, done: make(chan struct{})}
	select {
	case p.calls <- c:
	case <-p.ctx.Done():
		return 0, ErrClosed
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	<-c.done // the transaction is bounded by WriteTimeout
	return c.rev, c.err
}

// writer runs the Updates waiting, up to BatchSize at a time, each batch
// in one transaction.
func (p *Postgres) writer() {
	defer p.wg.Done()
	for {
		var batch []*pgCall
		select {
		case <-p.ctx.Done():
			return
		case c := <-p.calls:
			batch = append(batch, c)
		}
		// Wait up to BatchDelay for more writers to share the
		// transaction and its commit (writers just answered are on their
		// way back).
		timer := time.NewTimer(p.o.BatchDelay)
	more:
		for len(batch) < p.o.BatchSize {
			select {
			case c := <-p.calls:
				batch = append(batch, c)
			case <-timer.C:
				break more
			case <-p.ctx.Done():
				break more
			}
		}
		timer.Stop()
		prefetch := p.speculate(batch)
		for todo := batch; len(todo) > 0; {
			todo = p.runBatch(todo, prefetch)
		}
		for _, c := range batch {
			close(c.done)
		}
	}
}

// pgBatch is the state of one write transaction shared by several
// Updates.
type pgBatch struct {
	ctx context.Context
	// tx is the connection the transaction runs on: BEGIN goes out with
	// load's reads and COMMIT with finish's writes, saving a round trip
	// each (the revision row is locked in between).
	tx *pgxpool.Conn
	// shared: more than one Update runs in it, each under a savepoint.
	shared bool
	// policies and apis are every policy and API (ID → JSON) as the
	// Updates that succeeded so far left them; loaded at the start (they
	// are few, and every write's validation reads them all).
	policies, apis map[string][]byte
	// pend holds, per object kind, the writes of the Updates that
	// succeeded and are not in the database yet (JSON; nil: deleted):
	// written at the end, in the round trip that logs the changes, or
	// before an Update lists keys.
	pend map[Object]map[string][]byte
	// unresolved are the key puts of those Updates whose Old is still to
	// be read; read before pend is written.
	unresolved []oldRef
	// done are the Updates that succeeded, in order: their changes are
	// logged at the end.
	done []*pgTx
	// keys are the keys speculate found the Updates read or write, as
	// the database held them when the revision row was locked (nil:
	// absent); dropped at the first flush, after which the database
	// holds the batch's writes.
	keys map[string][]byte
	// spec: the batch is speculate's, outside any transaction: nothing
	// is written and no more than specKeys keys are read or written.
	spec bool
}

// specKeys bounds the keys one Update's speculation reads or writes (a
// bulk write is not run twice in full), and specTimeout its reads.
const (
	specKeys    = 256
	specTimeout = 500 * time.Millisecond
)

// errSpeculation ends a speculative run of an Update: it lists keys or
// touches more than specKeys of them.
var errSpeculation = errors.New("controlplane: speculation stops here")

// speculate runs each Update of batch once outside any transaction and
// returns the IDs of the keys they read or wrote (sorted, no repeats), so
// that runBatch reads them in the round trip that locks the revision row
// instead of one round trip each while holding it: every writer of the
// database waits for that lock. The runs read keys from the database as
// it is now and policies and APIs from the last batch's copy; what they
// do is discarded (fn may be called more than once: Store.Update), and
// a read that fails ends the speculation. Reads speculation missed, or
// that a batch makes differently once locked, still go to the database.
func (p *Postgres) speculate(batch []*pgCall) []string {
	ctx, cancel := context.WithTimeout(p.ctx, min(specTimeout, p.o.WriteTimeout))
	defer cancel()
	b := &pgBatch{ctx: ctx, spec: true, policies: p.hintPolicies, apis: p.hintAPIs}
	var ids []string
	for _, c := range batch {
		if c.ctx.Err() != nil {
			continue
		}
		t := &pgTx{pgReader: pgReader{ctx: ctx, q: p.pool}, b: b}
		err := c.fn(t)
		for id := range t.seen {
			ids = append(ids, id)
		}
		for id := range t.writes[ObjectKey] {
			ids = append(ids, id)
		}
		if err != nil && !errors.Is(err, errSpeculation) && (unavailable(err) || ctx.Err() != nil) {
			break
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// pendWrite records a write of a successful Update for the end.
func (b *pgBatch) pendWrite(obj Object, id string, v []byte) {
	if b.pend == nil {
		b.pend = map[Object]map[string][]byte{}
	}
	m := b.pend[obj]
	if m == nil {
		m = map[string][]byte{}
		b.pend[obj] = m
	}
	m[id] = v
}

// scanValues returns the function that reads rows of (id, value) into m.
func scanValues(m map[string][]byte) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			var v []byte
			if err := rows.Scan(&id, &v); err != nil {
				return err
			}
			m[id] = v
		}
		return rows.Err()
	}
}

// queueOlds queues the reads of refs' Old values (the keys as the
// database holds them before anything queued after) and returns the
// function that sets them, to call once pb's results are read.
func queueOlds(pb *pgx.Batch, refs []oldRef) func() {
	if len(refs) == 0 {
		return func() {}
	}
	const chunk = 10000
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.id
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	olds := make(map[string][]byte, len(ids))
	for lo := 0; lo < len(ids); lo += chunk {
		pb.Queue("SELECT id, value FROM lp_keys WHERE id = ANY($1)", ids[lo:min(lo+chunk, len(ids))]).Query(scanValues(olds))
	}
	return func() {
		for _, r := range refs {
			r.l.blocks[r.block][r.i].Old = olds[r.id]
		}
	}
}

// queueWrites queues the writes of ids (per kind; repeats allowed) with
// their values in writes (nil: delete), each kind in ID order.
func queueWrites(pb *pgx.Batch, writes map[Object]map[string][]byte, ids map[Object][]string) {
	const chunk = 10000
	for obj, ids := range ids {
		m := writes[obj]
		slices.Sort(ids)
		var putIDs, delIDs []string
		var putVs [][]byte
		for _, id := range slices.Compact(ids) {
			if v := m[id]; v != nil {
				putIDs, putVs = append(putIDs, id), append(putVs, v)
			} else {
				delIDs = append(delIDs, id)
			}
		}
		table := pgTables[obj]
		for lo := 0; lo < len(putIDs); lo += chunk {
			hi := min(lo+chunk, len(putIDs))
			pb.Queue("INSERT INTO "+table+" (id, value) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value",
				putIDs[lo:hi], putVs[lo:hi])
		}
		for lo := 0; lo < len(delIDs); lo += chunk {
			pb.Queue("DELETE FROM "+table+" WHERE id = ANY($1)", delIDs[lo:min(lo+chunk, len(delIDs))])
		}
	}
}

// queuePend queues the reads of the unresolved Old values, then the
// pending writes, and empties both; the function returned sets the Old
// values once pb's results are read.
func (b *pgBatch) queuePend(pb *pgx.Batch) func() {
	set := queueOlds(pb, b.unresolved)
	ids := map[Object][]string{}
	for obj, m := range b.pend {
		for id := range m {
			ids[obj] = append(ids[obj], id)
		}
	}
	queueWrites(pb, b.pend, ids)
	b.unresolved, b.pend = nil, nil
	return set
}

// runBatch runs batch in one transaction and sets each call's result. It
// returns the calls to run again, in a new transaction: those of a shared
// transaction that an Update failed outside its savepoint (a read of its
// fn failed in the database, which aborts the whole transaction).
func (p *Postgres) runBatch(batch []*pgCall, prefetch []string) (again []*pgCall) {
	fail := func(err error) {
		if p.closed.Load() && p.ctx.Err() != nil {
			err = ErrClosed
		}
		for _, c := range batch {
			if c.err == nil {
				c.rev, c.err = 0, err
			}
		}
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.o.WriteTimeout)
	defer cancel()
	tx, err := p.pool.Acquire(ctx)
	if err != nil {
		fail(dbErr("begin", err))
		return nil
	}
	defer release(ctx, tx)
	b := &pgBatch{ctx: ctx, tx: tx, shared: len(batch) > 1, policies: map[string][]byte{}, apis: map[string][]byte{}}
	var cur uint64
	if err := b.load(&cur, prefetch); err != nil {
		fail(err)
		return nil
	}
	start := cur
	for i, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			continue
		}
		t := &pgTx{pgReader: pgReader{ctx: ctx, q: tx, rev: cur + 1}, b: b, savepoint: "u" + strconv.Itoa(i)}
		err := t.run(c.fn)
		if err != nil {
			if unavailable(err) || ctx.Err() != nil {
				fail(err)
				return nil
			}
			if !b.shared {
				c.err = err
				return nil
			}
			if !t.saved && txStatus(tx) == 'E' {
				c.err = err
				for _, o := range batch {
					if o != c && o.err == nil {
						o.rev = 0
						again = append(again, o)
					}
				}
				return again
			}
			if t.saved {
				if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+t.savepoint); rerr != nil {
					c.err = err
					fail(dbErr("roll back to a savepoint", rerr))
					return nil
				}
			}
			c.err = err
			continue
		}
		if t.changes.n > 0 {
			cur++
			t.commitTo(b)
		}
		c.rev = cur
	}
	if cur == start {
		if _, err := tx.Exec(ctx, "COMMIT"); err != nil {
			fail(dbErr("commit", err))
			return nil
		}
		p.hintPolicies, p.hintAPIs = b.policies, b.apis
		return nil
	}
	if err := p.finish(b, cur); err != nil {
		fail(err)
		return nil
	}
	p.hintPolicies, p.hintAPIs = b.policies, b.apis
	p.announce()
	return nil
}

// load locks the revision row (so writers of every process take turns)
// and reads the revision into cur, every policy and API, and the keys
// prefetch names, in one round trip. The reads come after the lock, so
// they see every write committed before it, and none can commit until
// this transaction ends.
func (b *pgBatch) load(cur *uint64, prefetch []string) error {
	var pb pgx.Batch
	pb.Queue("BEGIN")
	pb.Queue("SELECT revision FROM lp_meta FOR UPDATE").QueryRow(func(r pgx.Row) error {
		var rev int64
		err := r.Scan(&rev)
		*cur = uint64(rev)
		return err
	})
	for _, t := range []struct {
		table string
		m     map[string][]byte
	}{{"lp_policies", b.policies}, {"lp_apis", b.apis}} {
		pb.Queue("SELECT id, value FROM " + t.table).Query(scanValues(t.m))
	}
	if len(prefetch) > 0 {
		b.keys = make(map[string][]byte, len(prefetch))
		for _, id := range prefetch {
			b.keys[id] = nil
		}
		pb.Queue("SELECT id, value FROM lp_keys WHERE id = ANY($1)", prefetch).Query(scanValues(b.keys))
	}
	if err := b.tx.SendBatch(b.ctx, &pb).Close(); err != nil {
		return dbErr("lock the revision", err)
	}
	return nil
}

// finish writes the pending writes, appends the batch's changes, trims
// the change log, records the revision rev, notifies and commits: in one
// round trip, or two when Old values are still to be read.
func (p *Postgres) finish(b *pgBatch, rev uint64) error {
	var pb pgx.Batch
	if len(b.unresolved) > 0 {
		set := b.queuePend(&pb)
		if err := b.tx.SendBatch(b.ctx, &pb).Close(); err != nil {
			return dbErr("write", err)
		}
		set()
		pb = pgx.Batch{}
	} else {
		b.queuePend(&pb)
	}
	var revs []int64
	var seqs []int32
	var vs [][]byte
	for _, t := range b.done {
		for i, c := range t.changes.all() {
			c.Revision = t.rev
			v, err := encodeChange(c)
			if err != nil {
				return fmt.Errorf("controlplane: encode change: %w", err)
			}
			revs, seqs, vs = append(revs, int64(t.rev)), append(seqs, int32(i)), append(vs, v)
		}
	}
	const chunk = 10000
	for lo := 0; lo < len(vs); lo += chunk {
		hi := min(lo+chunk, len(vs))
		revs, seqs, vs := revs[lo:hi], seqs[lo:hi], vs[lo:hi]
		pb.Queue("INSERT INTO lp_changes (revision, seq, change) SELECT * FROM unnest($1::bigint[], $2::int[], $3::bytea[])", revs, seqs, vs)
	}
	if rev > p.logRevs {
		pb.Queue("DELETE FROM lp_changes WHERE revision <= $1", int64(rev-p.logRevs))
	}
	pb.Queue("UPDATE lp_meta SET revision = $1", int64(rev))
	pb.Queue("SELECT pg_notify($1, $2)", notifyChannel, strconv.FormatUint(rev, 10))
	pb.Queue("COMMIT")
	if err := b.tx.SendBatch(b.ctx, &pb).Close(); err != nil {
		err = dbErr("log the changes and commit", err)
		if errors.Is(err, ErrStoreUnavailable) {
			// The COMMIT may have run: only its answer is known lost.
			err = commitUnknown{err}
		}
		return err
	}
	if st := txStatus(b.tx); st != 'I' {
		return fmt.Errorf("controlplane: commit left the transaction in state %q: %w", st, ErrStoreUnavailable)
	}
	return nil
}

// commitUnknown is the error of a write whose commit round trip lost its
// connection: err, with ErrCommitUnknown, naming the package once.
type commitUnknown struct{ err error }

func (e commitUnknown) Error() string {
	return ErrCommitUnknown.Error() + ": " + strings.TrimPrefix(e.err.Error(), prefix)
}
func (e commitUnknown) Unwrap() []error { return []error{ErrCommitUnknown, e.err} }

// txStatus is conn's transaction status as the server last reported it:
// 'I' idle, 'T' in a transaction, 'E' in a failed one.
func txStatus(conn *pgxpool.Conn) byte { return conn.Conn().PgConn().TxStatus() }

// release rolls back what conn's transaction left open (a write that
// failed or stopped before its COMMIT) and returns conn to its pool,
// which closes it when the rollback failed too.
func release(ctx context.Context, conn *pgxpool.Conn) {
	if txStatus(conn) != 'I' && !conn.Conn().IsClosed() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		conn.Exec(rctx, "ROLLBACK")
		cancel()
	}
	conn.Release()
}

// History implements Store.
func (p *Postgres) History(ctx context.Context) (string, error) {
	if p.closed.Load() {
		return "", ErrClosed
	}
	var h string
	if err := p.pool.QueryRow(ctx, "SELECT history FROM lp_meta").Scan(&h); err != nil {
		return "", dbErr("read the history", err)
	}
	return h, nil
}

// ForkHistory implements Store. The new id is committed when it returns,
// and every process's RevisionChanged waiters are woken.
func (p *Postgres) ForkHistory(ctx context.Context, from string) (string, error) {
	if p.closed.Load() {
		return "", ErrClosed
	}
	var h string
	forked := false
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT history FROM lp_meta FOR UPDATE").Scan(&h); err != nil {
			return err
		}
		if h != from {
			return nil
		}
		h, forked = newHistory(), true
		if _, err := tx.Exec(ctx, "UPDATE lp_meta SET history = $1", h); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_notify($1, 'fork')", notifyChannel)
		return err
	})
	if err != nil {
		return "", dbErr("fork the history", err)
	}
	if forked {
		p.announce()
	}
	return h, nil
}

// read runs fn in a read-only repeatable-read transaction: one consistent
// view.
func (p *Postgres) read(ctx context.Context, fn func(r *pgReader) error) error {
	if p.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return dbErr("begin", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	r := &pgReader{ctx: ctx, q: tx}
	var rev int64
	if err := tx.QueryRow(ctx, "SELECT revision FROM lp_meta").Scan(&rev); err != nil {
		return dbErr("read the revision", err)
	}
	r.rev = uint64(rev)
	if err := fn(r); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return dbErr("commit", err)
	}
	return nil
}

// View implements Store.
func (p *Postgres) View(ctx context.Context, fn func(r Reader) error) error {
	return p.read(ctx, func(r *pgReader) error { return fn(r) })
}

// ChangesSince implements Store.
func (p *Postgres) ChangesSince(ctx context.Context, rev uint64) ([]Change, error) {
	var out []Change
	err := p.read(ctx, func(r *pgReader) error {
		cur := r.rev
		switch {
		case rev > cur:
			return fmt.Errorf("%w: asked for changes after %d, the control plane is at %d", ErrRevisionAhead, rev, cur)
		case rev == cur:
			return nil
		}
		var first *int64
		if err := r.q.QueryRow(ctx, "SELECT min(revision) FROM lp_changes").Scan(&first); err != nil {
			return dbErr("read the change log", err)
		}
		// As Bolt's: whole revisions are trimmed, so the log is complete
		// after rev iff it starts at rev+1 or earlier.
		if first == nil || uint64(*first) > rev+1 {
			oldest := cur
			if first != nil {
				oldest = uint64(*first) - 1
			}
			return fmt.Errorf("%w: asked for changes after %d, the change log starts after %d", ErrTooFarBehind, rev, oldest)
		}
		rows, err := r.q.Query(ctx, "SELECT revision, change FROM lp_changes WHERE revision > $1 ORDER BY revision, seq", int64(rev))
		if err != nil {
			return dbErr("read the change log", err)
		}
		defer rows.Close()
		for rows.Next() {
			var n int64
			var v []byte
			if err := rows.Scan(&n, &v); err != nil {
				return dbErr("read the change log", err)
			}
			var ch Change
			if err := json.Unmarshal(v, &ch); err != nil {
				return fmt.Errorf("controlplane: decode change %d: %w", n, err)
			}
			out = append(out, ch)
		}
		if err := rows.Err(); err != nil {
			return dbErr("read the change log", err)
		}
		return nil
	})
	return out, err
}

// Snapshot implements Store.
func (p *Postgres) Snapshot(ctx context.Context, tags []string) (*spec.Snapshot, error) {
	s := &spec.Snapshot{}
	err := p.read(ctx, func(r *pgReader) error {
		var err error
		s.Revision = r.rev
		if s.Policies, err = r.Policies(); err != nil {
			return err
		}
		if s.APIs, err = r.APIs(); err != nil {
			return err
		}
		s.Keys, err = r.allKeys()
		return err
	})
	if err != nil {
		return nil, err
	}
	return Select(s, tags), nil
}

// Tables of the objects.
var pgTables = map[Object]string{ObjectPolicy: "lp_policies", ObjectKey: "lp_keys", ObjectAPI: "lp_apis"}

// pgReader reads one transaction.
type pgReader struct {
	ctx context.Context
	q   pgQuerier
	rev uint64
}

// pgQuerier is what a pgReader reads and writes through: its
// transaction, or the pool for speculate.
type pgQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

func (r *pgReader) Revision() uint64 { return r.rev }

// value returns the stored JSON of id in obj's table, nil when absent.
func (r *pgReader) value(obj Object, id string) ([]byte, error) {
	var v []byte
	err := r.q.QueryRow(r.ctx, "SELECT value FROM "+pgTables[obj]+" WHERE id = $1", id).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, dbErr("read "+string(obj)+" "+strconv.Quote(id), err)
	}
	return v, nil
}

func pgGet[T any](r *pgReader, obj Object, id string) (*T, error) {
	v, err := r.value(obj, id)
	if err != nil {
		return nil, err
	}
	return decodeStored[T](v, []byte(pgTables[obj]), id)
}

// pgList returns the rows of query (the values of one table, in ID
// order), decoded.
func pgList[T any](r *pgReader, obj Object, query string, args ...any) ([]T, error) {
	rows, err := r.q.Query(r.ctx, query, args...)
	if err != nil {
		return nil, dbErr("list "+pgTables[obj], err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var o T
		if err := json.Unmarshal(rows.RawValues()[0], &o); err != nil {
			return nil, fmt.Errorf("controlplane: decode %s #%d: %w", pgTables[obj], len(out), err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr("list "+pgTables[obj], err)
	}
	return out, nil
}

func (r *pgReader) Policy(id string) (*spec.Policy, error) {
	return pgGet[spec.Policy](r, ObjectPolicy, id)
}

func (r *pgReader) Key(hash string) (*spec.Key, error) {
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		return nil, nil // no key has that hash
	}
	return pgGet[spec.Key](r, ObjectKey, h.String())
}

func (r *pgReader) API(id string) (*spec.API, error) { return pgGet[spec.API](r, ObjectAPI, id) }

func (r *pgReader) Policies() ([]spec.Policy, error) {
	return pgList[spec.Policy](r, ObjectPolicy, "SELECT value FROM lp_policies ORDER BY id")
}

func (r *pgReader) APIs() ([]spec.API, error) {
	return pgList[spec.API](r, ObjectAPI, "SELECT value FROM lp_apis ORDER BY id")
}

func (r *pgReader) Keys(after string, limit int) ([]spec.Key, error) {
	out := []spec.Key{}
	if limit <= 0 {
		return out, nil
	}
	ks, err := pgList[spec.Key](r, ObjectKey, "SELECT value FROM lp_keys WHERE id > $1 ORDER BY id LIMIT $2", after, limit)
	return append(out, ks...), err
}

// allKeys returns every key, in hash order. The values are decoded on
// every CPU while the next are still arriving: they are read in blocks of
// keyBlock, each copied into one buffer, and each block decoded apart.
func (r *pgReader) allKeys() ([]spec.Key, error) {
	rows, err := r.q.Query(r.ctx, "SELECT value FROM lp_keys ORDER BY id")
	if err != nil {
		return nil, dbErr("list lp_keys", err)
	}
	defer rows.Close()
	type block struct {
		first int    // the index of its first key
		data  []byte // the values, one after the other
		ends  []int  // where each value ends in data
		keys  []spec.Key
		err   error
	}
	work := make(chan *block, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for b := range work {
				b.keys = make([]spec.Key, len(b.ends))
				start := 0
				for i, end := range b.ends {
					if err := json.Unmarshal(b.data[start:end], &b.keys[i]); err != nil {
						b.err = fmt.Errorf("controlplane: decode lp_keys #%d: %w", b.first+i, err)
						break
					}
					start = end
				}
				b.data, b.ends = nil, nil
			}
		})
	}
	var blocks []*block
	cur := &block{ends: make([]int, 0, keyBlock)}
	n := 0
	for rows.Next() {
		cur.data = append(cur.data, rows.RawValues()[0]...)
		cur.ends = append(cur.ends, len(cur.data))
		if n++; len(cur.ends) == keyBlock {
			blocks = append(blocks, cur)
			work <- cur
			// The next block's values are about as long as these.
			cur = &block{first: n, data: make([]byte, 0, len(cur.data)*9/8), ends: make([]int, 0, keyBlock)}
		}
	}
	if len(cur.ends) > 0 {
		blocks = append(blocks, cur)
		work <- cur
	}
	close(work)
	wg.Wait()
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, dbErr("list lp_keys", err)
	}
	out := make([]spec.Key, 0, n)
	for _, b := range blocks {
		if b.err != nil {
			return nil, b.err
		}
		out = append(out, b.keys...)
		b.keys = nil
	}
	return out, nil
}

// keyBlock is how many keys allKeys decodes as one piece of work.
const keyBlock = 4096

// pgTx is one Update's write, within a batch. Its writes are kept in
// memory (writes) and reach the database with the batch's at its end, or
// when it lists keys (flush); policies and APIs are read from the
// batch's copy, keys from its writes, the batch's pending writes, then
// the database.
type pgTx struct {
	pgReader
	b       *pgBatch
	changes changeList
	// writes holds, per object kind, every ID written and its value now
	// (JSON; nil when deleted).
	writes map[Object]map[string][]byte
	// unflushed are the IDs written since the last flush, per kind.
	unflushed map[Object][]string
	// seen are the keys read from the database (nil: absent), so a put
	// after a read knows its Old.
	seen map[string][]byte
	// unknownOld are the key puts whose Old is still to be read (the
	// key was not read or written before): read in bulk later.
	unknownOld []oldRef
	// savepoint is the name of this Update's savepoint in a shared
	// batch, unique in it (so that rolling back to one never reaches an
	// earlier Update's); saved: it is set (before the first flush).
	savepoint string
	saved     bool
}

// oldRef locates a change in a changeList.
type oldRef struct {
	l        *changeList
	block, i int
	id       string
}

// run calls fn and validates what it wrote.
func (t *pgTx) run(fn func(Tx) error) error {
	if err := fn(t); err != nil {
		return err
	}
	if t.changes.n == 0 {
		return nil
	}
	return validateWrite(t, &t.changes)
}

// commitTo hands the successful write's unflushed writes, unknown Old
// values and changes to the batch, and its policies and APIs to the
// batch's copy.
func (t *pgTx) commitTo(b *pgBatch) {
	for obj, ids := range t.unflushed {
		for _, id := range ids {
			b.pendWrite(obj, id, t.writes[obj][id])
		}
	}
	t.unflushed = nil
	b.unresolved = append(b.unresolved, t.unknownOld...)
	t.unknownOld = nil
	b.done = append(b.done, t)
	for obj, m := range map[Object]map[string][]byte{ObjectPolicy: b.policies, ObjectAPI: b.apis} {
		for id, v := range t.writes[obj] {
			if v == nil {
				delete(m, id)
			} else {
				m[id] = v
			}
		}
	}
}

// written returns what the write holds for id: the value put, or nil for
// a delete (ok), or ok false when it has not written id.
func (t *pgTx) written(obj Object, id string) ([]byte, bool) {
	v, ok := t.writes[obj][id]
	return v, ok
}

// known returns the value of id when the write knows it without asking
// the database.
func (t *pgTx) known(obj Object, id string) ([]byte, bool) {
	if v, ok := t.written(obj, id); ok {
		return v, true
	}
	switch obj {
	case ObjectPolicy:
		return t.b.policies[id], true
	case ObjectAPI:
		return t.b.apis[id], true
	}
	if v, ok := t.b.pend[obj][id]; ok {
		return v, true
	}
	if v, ok := t.seen[id]; ok {
		return v, true
	}
	v, ok := t.b.keys[id]
	return v, ok
}

// current returns the value of id as the write sees it, nil when absent.
func (t *pgTx) current(obj Object, id string) ([]byte, error) {
	if v, ok := t.known(obj, id); ok {
		return v, nil
	}
	if t.b.spec && len(t.seen)+len(t.writes[ObjectKey]) >= specKeys {
		return nil, errSpeculation
	}
	v, err := t.value(obj, id)
	if err != nil {
		return nil, err
	}
	if t.seen == nil {
		t.seen = map[string][]byte{}
	}
	t.seen[id] = v
	return v, nil
}

func (t *pgTx) set(obj Object, id string, v []byte) {
	if t.writes == nil {
		t.writes, t.unflushed = map[Object]map[string][]byte{}, map[Object][]string{}
	}
	if t.unflushed == nil {
		t.unflushed = map[Object][]string{}
	}
	m := t.writes[obj]
	if m == nil {
		m = map[string][]byte{}
		t.writes[obj] = m
	}
	m[id] = v
	t.unflushed[obj] = append(t.unflushed[obj], id)
}

func (t *pgTx) put(obj Object, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("controlplane: encode %s %q: %w", obj, id, err)
	}
	old, known := t.known(obj, id)
	if t.b.spec {
		if len(t.seen)+len(t.writes[ObjectKey]) >= specKeys {
			return errSpeculation
		}
		old, known = nil, true // no Old to read: the run is discarded
	}
	t.set(obj, id, b)
	t.changes.add(Change{Revision: t.rev, Op: OpPut, Object: obj, ID: id, Value: b, Old: old})
	if !known {
		last := len(t.changes.blocks) - 1
		t.unknownOld = append(t.unknownOld, oldRef{l: &t.changes, block: last, i: len(t.changes.blocks[last]) - 1, id: id})
	}
	return nil
}

func (t *pgTx) delete(obj Object, id string) (bool, error) {
	old, err := t.current(obj, id)
	if err != nil || old == nil {
		return false, err
	}
	t.set(obj, id, nil)
	t.changes.add(Change{Revision: t.rev, Op: OpDelete, Object: obj, ID: id, Old: old})
	return true, nil
}

// flush brings the database to the state the write sees, in one round
// trip: the batch's pending writes (after reading the Old values still
// unknown), then, after the savepoint in a shared batch, the write's
// own.
func (t *pgTx) flush() error {
	if t.b.spec {
		return errSpeculation
	}
	var pb pgx.Batch
	setBatch := t.b.queuePend(&pb)
	setOwn := queueOlds(&pb, t.unknownOld)
	t.unknownOld = nil
	if len(t.unflushed) > 0 {
		if t.b.shared && !t.saved {
			pb.Queue("SAVEPOINT " + t.savepoint)
			t.saved = true
		}
		queueWrites(&pb, t.writes, t.unflushed)
		t.unflushed = nil
	}
	if pb.Len() == 0 {
		return nil
	}
	t.b.keys = nil
	if err := t.q.SendBatch(t.ctx, &pb).Close(); err != nil {
		return dbErr("write", err)
	}
	setBatch()
	setOwn()
	return nil
}

// writtenKeys implements state.
func (t *pgTx) writtenKeys() map[string][]byte { return t.writes[ObjectKey] }

// eachKey implements state, after a flush.
func (t *pgTx) eachKey(fn func(hash, v []byte) error) error {
	if err := t.flush(); err != nil {
		return err
	}
	rows, err := t.q.Query(t.ctx, "SELECT id, value FROM lp_keys ORDER BY id")
	if err != nil {
		return dbErr("list lp_keys", err)
	}
	defer rows.Close()
	for rows.Next() {
		raw := rows.RawValues()
		if err := fn(slices.Clone(raw[0]), slices.Clone(raw[1])); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return dbErr("list lp_keys", err)
	}
	return nil
}

// The reads of a write see its own writes; policies and APIs come from
// the batch's copy.

// cached returns the policies or APIs as the write sees them, in ID
// order.
func (t *pgTx) cached(obj Object, base map[string][]byte) [][]byte {
	ids := make([]string, 0, len(base)+len(t.writes[obj]))
	for id := range base {
		if _, ok := t.written(obj, id); !ok {
			ids = append(ids, id)
		}
	}
	for id, v := range t.writes[obj] {
		if v != nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([][]byte, len(ids))
	for i, id := range ids {
		if v, ok := t.written(obj, id); ok {
			out[i] = v
		} else {
			out[i] = base[id]
		}
	}
	return out
}

func decodeAll[T any](obj Object, vs [][]byte) ([]T, error) {
	var out []T
	for i, v := range vs {
		var o T
		if err := json.Unmarshal(v, &o); err != nil {
			return nil, fmt.Errorf("controlplane: decode %s #%d: %w", pgTables[obj], i, err)
		}
		out = append(out, o)
	}
	return out, nil
}

func pgTxGet[T any](t *pgTx, obj Object, id string) (*T, error) {
	v, err := t.current(obj, id)
	if err != nil {
		return nil, err
	}
	return decodeStored[T](v, []byte(pgTables[obj]), id)
}

func (t *pgTx) Policy(id string) (*spec.Policy, error) {
	return pgTxGet[spec.Policy](t, ObjectPolicy, id)
}

func (t *pgTx) Key(hash string) (*spec.Key, error) {
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		return nil, nil // no key has that hash
	}
	return pgTxGet[spec.Key](t, ObjectKey, h.String())
}

func (t *pgTx) API(id string) (*spec.API, error) { return pgTxGet[spec.API](t, ObjectAPI, id) }

func (t *pgTx) Policies() ([]spec.Policy, error) {
	return decodeAll[spec.Policy](ObjectPolicy, t.cached(ObjectPolicy, t.b.policies))
}

func (t *pgTx) APIs() ([]spec.API, error) {
	return decodeAll[spec.API](ObjectAPI, t.cached(ObjectAPI, t.b.apis))
}

func (t *pgTx) Keys(after string, limit int) ([]spec.Key, error) {
	if err := t.flush(); err != nil {
		return nil, err
	}
	return t.pgReader.Keys(after, limit)
}

func (t *pgTx) PutPolicy(p spec.Policy) error {
	if p.ID == "" {
		return spec.Errors{{Path: "policies[\"\"].id", Problem: "missing"}}
	}
	return t.put(ObjectPolicy, p.ID, p)
}

func (t *pgTx) DeletePolicy(id string) (bool, error) { return t.delete(ObjectPolicy, id) }

func (t *pgTx) PutKey(k spec.Key) error {
	h, err := identity.ParseKeyHash(k.KeyHash)
	if err != nil {
		return spec.Errors{{Path: "keys[" + strconv.Quote(k.KeyHash) + "].key_hash", Problem: fmt.Sprintf("%q is not sha256:<64 hex digits>", k.KeyHash)}}
	}
	k.KeyHash = h.String()
	return t.put(ObjectKey, k.KeyHash, k)
}

func (t *pgTx) DeleteKey(hash string) (bool, error) {
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		return false, nil
	}
	return t.delete(ObjectKey, h.String())
}

func (t *pgTx) PutAPI(a spec.API) error {
	if a.ID == "" {
		return spec.Errors{{Path: "apis[\"\"].id", Problem: "missing"}}
	}
	return t.put(ObjectAPI, a.ID, a)
}

func (t *pgTx) DeleteAPI(id string) (bool, error) { return t.delete(ObjectAPI, id) }
