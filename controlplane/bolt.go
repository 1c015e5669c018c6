package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/parallel"
	"github.com/limitplane/limitplane/spec"
)

// BoltOptions configure OpenBolt. The zero value is usable.
type BoltOptions struct {
	// ChangeLogRevisions is how many of the latest revisions the change
	// log keeps; a data plane further behind gets a snapshot. 0 means
	// DefaultChangeLogRevisions.
	ChangeLogRevisions int
	// BatchDelay is how long a write waits for others to share its
	// transaction and fsync (bbolt's MaxBatchDelay). 0 means 2ms; under
	// load a batch also starts once BatchSize writes wait.
	BatchDelay time.Duration
	// BatchSize is the most writes in one transaction; 0 means 64.
	BatchSize int
	// LockTimeout is how long OpenBolt waits for another process holding
	// the file to let go; 0 means 1s.
	LockTimeout time.Duration
	// InitialMmapSize is how many bytes of address space the file is
	// mapped with from the start (bbolt's InitialMmapSize); 0 means
	// DefaultInitialMmapSize. It reserves address space, not memory. A
	// file that outgrows the map is mapped again, which waits for every
	// read transaction (a Snapshot being sent) and copies every node the
	// write holds: a write of a million keys into a small map remaps a
	// dozen times.
	InitialMmapSize int
}

// DefaultInitialMmapSize is BoltOptions.InitialMmapSize when 0: 1 GiB,
// room for a few million keys.
const DefaultInitialMmapSize = 1 << 30

// DefaultChangeLogRevisions is the change log's length when
// BoltOptions.ChangeLogRevisions is 0.
const DefaultChangeLogRevisions = 10000

// Buckets of the bbolt file.
var (
	bucketPolicies = []byte("policies") // ID → spec.Policy JSON
	bucketKeys     = []byte("keys")     // lower-case key hash → spec.Key JSON
	bucketAPIs     = []byte("apis")     // ID → spec.API JSON
	bucketChanges  = []byte("changes")  // revision (8 bytes BE) + sequence (4 bytes BE) → Change JSON
	bucketMeta     = []byte("meta")     // metaRevision → revision (8 bytes BE); metaHistory → history id
	metaRevision   = []byte("revision")
	metaHistory    = []byte("history")
)

// Bolt is the Store kept in one bbolt file. Writes are durable when
// Update returns: bbolt fsyncs each transaction, and concurrent Updates
// share one transaction (bbolt's Batch), so many writers share each
// fsync.
type Bolt struct {
	db      *bolt.DB
	logRevs uint64

	mu      sync.Mutex
	changed chan struct{} // closed when the revision next rises
}

var _ Store = (*Bolt)(nil)

// ErrFileInUse is OpenBolt's error (wrapped) when another process (or
// another OpenBolt in this one) holds the file's lock for longer than
// LockTimeout.
var ErrFileInUse = errors.New("the file is in use by another process (another control plane?)")

// OpenBolt opens or creates the store in the bbolt file path (mode 0600).
// It fails, wrapping ErrFileInUse, when the file is held by another
// process for longer than LockTimeout, or wrapping bbolt's error when it
// cannot be opened.
func OpenBolt(path string, o BoltOptions) (*Bolt, error) {
	if o.ChangeLogRevisions <= 0 {
		o.ChangeLogRevisions = DefaultChangeLogRevisions
	}
	if o.BatchDelay <= 0 {
		o.BatchDelay = 2 * time.Millisecond
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 64
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = time.Second
	}
	if o.InitialMmapSize <= 0 {
		o.InitialMmapSize = DefaultInitialMmapSize
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.LockTimeout, InitialMmapSize: o.InitialMmapSize})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("controlplane: open %s: %w", path, ErrFileInUse)
	}
	if pe, ok := err.(*fs.PathError); ok && pe.Path == path {
		// "open x: open x: is a directory": say the path once.
		err = pe.Err
	}
	if err != nil {
		return nil, fmt.Errorf("controlplane: open %s: %w", path, err)
	}
	db.MaxBatchDelay, db.MaxBatchSize = o.BatchDelay, o.BatchSize
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketPolicies, bucketKeys, bucketAPIs, bucketChanges, bucketMeta, bucketQuota, bucketQuotaExpiry} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		// A store made before histories existed gets one now.
		if meta := tx.Bucket(bucketMeta); meta.Get(metaHistory) == nil {
			return meta.Put(metaHistory, []byte(newHistory()))
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("controlplane: open %s: %w", path, err)
	}
	return &Bolt{db: db, logRevs: uint64(o.ChangeLogRevisions), changed: make(chan struct{})}, nil
}

// RevisionChanged implements RevisionWatcher: the channel returned is
// closed once a write after this call has raised the revision (and is
// durable). Take the channel before reading the state, so no write falls
// between the read and the wait.
func (b *Bolt) RevisionChanged() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// announce wakes every RevisionChanged waiter.
func (b *Bolt) announce() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changed)
	b.changed = make(chan struct{})
}

// Close closes the file. Writes already acknowledged are on disk.
func (b *Bolt) Close() error { return b.db.Close() }

// Update implements Store.
func (b *Bolt) Update(ctx context.Context, fn func(tx Tx) error) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var rev uint64
	var wrote bool
	err := b.db.Batch(func(btx *bolt.Tx) error {
		cur := readRevision(btx)
		tx := &boltTx{boltReader: boltReader{btx: btx, rev: cur + 1}}
		if err := fn(tx); err != nil {
			return err
		}
		if err := tx.flush(); err != nil {
			return err
		}
		if tx.changes.n == 0 {
			rev, wrote = cur, false
			return nil
		}
		if err := validateWrite(tx, &tx.changes); err != nil {
			return err
		}
		if err := b.appendChanges(btx, tx.rev, &tx.changes); err != nil {
			return err
		}
		rev, wrote = tx.rev, true
		return nil
	})
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return 0, ErrClosed
	}
	if err == nil && wrote {
		b.announce()
	}
	return rev, err
}

// appendChanges logs changes as revision rev, drops the revisions that
// fall out of the log, and records rev.
func (b *Bolt) appendChanges(btx *bolt.Tx, rev uint64, changes *changeList) error {
	log := btx.Bucket(bucketChanges)
	log.FillPercent = 1 // appended in key order, trimmed from the front
	for i, c := range changes.all() {
		c.Revision = rev
		v, err := encodeChange(c)
		if err != nil {
			return fmt.Errorf("controlplane: encode change: %w", err)
		}
		if err := log.Put(changeKey(rev, uint32(i)), v); err != nil {
			return fmt.Errorf("controlplane: log change: %w", err)
		}
	}
	if rev > b.logRevs {
		// Delete the revisions up to rev - logRevs.
		cur := log.Cursor()
		for k, _ := cur.First(); k != nil && binary.BigEndian.Uint64(k) <= rev-b.logRevs; k, _ = cur.First() {
			if err := log.Delete(k); err != nil {
				return fmt.Errorf("controlplane: trim change log: %w", err)
			}
		}
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], rev)
	if err := btx.Bucket(bucketMeta).Put(metaRevision, v[:]); err != nil {
		return fmt.Errorf("controlplane: record revision: %w", err)
	}
	return nil
}

// encodeChange returns json.Marshal(c), faster: c.Value and c.Old, which
// the store made with json.Marshal, are copied as they are instead of
// being checked and compacted again.
func encodeChange(c Change) ([]byte, error) {
	b := make([]byte, 0, 64+len(c.Op)+len(c.Object)+len(c.ID)+len(c.Value)+len(c.Old))
	b = append(b, `{"revision":`...)
	b = strconv.AppendUint(b, c.Revision, 10)
	var err error
	for _, f := range []struct{ name, v string }{{`,"op":`, string(c.Op)}, {`,"object":`, string(c.Object)}, {`,"id":`, c.ID}} {
		b = append(b, f.name...)
		if b, err = appendJSONString(b, f.v); err != nil {
			return nil, err
		}
	}
	if len(c.Value) > 0 {
		b = append(append(b, `,"value":`...), c.Value...)
	}
	if len(c.Old) > 0 {
		b = append(append(b, `,"old":`...), c.Old...)
	}
	return append(b, '}'), nil
}

// appendJSONString appends s as json.Marshal writes it.
func appendJSONString(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			v, err := json.Marshal(s)
			return append(b, v...), err
		}
	}
	return append(append(append(b, '"'), s...), '"'), nil
}

func changeKey(rev uint64, seq uint32) []byte {
	k := make([]byte, 12)
	binary.BigEndian.PutUint64(k, rev)
	binary.BigEndian.PutUint32(k[8:], seq)
	return k
}

func readRevision(btx *bolt.Tx) uint64 {
	if v := btx.Bucket(bucketMeta).Get(metaRevision); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// newHistory returns a new random history id (26 base32 characters: 130
// random bits).
func newHistory() string { return rand.Text() }

// History implements Store.
func (b *Bolt) History(ctx context.Context) (string, error) {
	var h string
	err := b.View(ctx, func(r Reader) error {
		h = string(r.(*boltReader).btx.Bucket(bucketMeta).Get(metaHistory))
		return nil
	})
	return h, err
}

// ForkHistory implements Store. The new id is durable when it returns,
// and RevisionChanged waiters are woken (the revision itself does not
// change), so every stream sends its data plane a snapshot of the new
// history.
func (b *Bolt) ForkHistory(ctx context.Context, from string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	var h string
	forked := false
	err := b.db.Update(func(btx *bolt.Tx) error {
		meta := btx.Bucket(bucketMeta)
		h = string(meta.Get(metaHistory))
		if h != from {
			return nil
		}
		h, forked = newHistory(), true
		return meta.Put(metaHistory, []byte(h))
	})
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return "", ErrClosed
	}
	if err != nil {
		return "", fmt.Errorf("controlplane: fork the history: %w", err)
	}
	if forked {
		b.announce()
	}
	return h, nil
}

// View implements Store.
func (b *Bolt) View(ctx context.Context, fn func(r Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := b.db.View(func(btx *bolt.Tx) error {
		return fn(&boltReader{btx: btx, rev: readRevision(btx)})
	})
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// ChangesSince implements Store.
func (b *Bolt) ChangesSince(ctx context.Context, rev uint64) ([]Change, error) {
	var out []Change
	err := b.View(ctx, func(r Reader) error {
		cur := r.Revision()
		switch {
		case rev > cur:
			return fmt.Errorf("%w: asked for changes after %d, the control plane is at %d", ErrRevisionAhead, rev, cur)
		case rev == cur:
			return nil
		}
		c := r.(*boltReader).btx.Bucket(bucketChanges).Cursor()
		first, _ := c.First()
		// Every revision logs at least one change and whole revisions
		// are trimmed, so the log is complete after rev iff it starts at
		// rev+1 or earlier.
		if first == nil || binary.BigEndian.Uint64(first) > rev+1 {
			return fmt.Errorf("%w: asked for changes after %d, the change log starts after %d", ErrTooFarBehind, rev, oldest(first, cur))
		}
		for k, v := c.Seek(changeKey(rev+1, 0)); k != nil; k, v = c.Next() {
			var ch Change
			if err := json.Unmarshal(v, &ch); err != nil {
				return fmt.Errorf("controlplane: decode change %d: %w", binary.BigEndian.Uint64(k), err)
			}
			out = append(out, ch)
		}
		return nil
	})
	return out, err
}

// oldest returns the revision after which the change log is complete.
func oldest(first []byte, cur uint64) uint64 {
	if first == nil {
		return cur
	}
	return binary.BigEndian.Uint64(first) - 1
}

// Snapshot implements Store.
func (b *Bolt) Snapshot(ctx context.Context, tags []string) (*spec.Snapshot, error) {
	s := &spec.Snapshot{}
	err := b.View(ctx, func(r Reader) error {
		br := r.(*boltReader)
		var err error
		s.Revision = br.rev
		if s.Policies, err = br.Policies(); err != nil {
			return err
		}
		if s.APIs, err = br.APIs(); err != nil {
			return err
		}
		s.Keys, err = br.keys()
		return err
	})
	if err != nil {
		return nil, err
	}
	return Select(s, tags), nil
}

// boltReader reads a bbolt transaction.
type boltReader struct {
	btx *bolt.Tx
	rev uint64
}

func (r *boltReader) Revision() uint64 { return r.rev }

func (r *boltReader) Policy(id string) (*spec.Policy, error) {
	return get[spec.Policy](r.btx, bucketPolicies, id)
}

func (r *boltReader) Key(hash string) (*spec.Key, error) {
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		return nil, nil // no key has that hash
	}
	return get[spec.Key](r.btx, bucketKeys, h.String())
}

func (r *boltReader) API(id string) (*spec.API, error) { return get[spec.API](r.btx, bucketAPIs, id) }

func (r *boltReader) Policies() ([]spec.Policy, error) {
	return all[spec.Policy](r.btx, bucketPolicies)
}
func (r *boltReader) APIs() ([]spec.API, error) { return all[spec.API](r.btx, bucketAPIs) }

func (r *boltReader) Keys(after string, limit int) ([]spec.Key, error) {
	out := []spec.Key{}
	c := r.btx.Bucket(bucketKeys).Cursor()
	k, v := c.First()
	if after != "" {
		k, v = c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = c.Next()
		}
	}
	for ; k != nil && len(out) < limit; k, v = c.Next() {
		var o spec.Key
		if err := json.Unmarshal(v, &o); err != nil {
			return nil, fmt.Errorf("controlplane: decode %s %q: %w", bucketKeys, k, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// keys returns every key, in hash order. The JSON values are listed
// first (by reference: cheaper than counting them with Bucket.Stats),
// then decoded on every CPU into a list of the right size.
func (r *boltReader) keys() ([]spec.Key, error) {
	var raw [][]byte
	if err := r.btx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
		raw = append(raw, v) // valid until the transaction ends
		return nil
	}); err != nil {
		return nil, err
	}
	out := make([]spec.Key, len(raw))
	err := parallel.Ranges(len(raw), runtime.GOMAXPROCS(0), func(lo, hi int) error {
		for i := lo; i < hi; i++ {
			if err := json.Unmarshal(raw[i], &out[i]); err != nil {
				return fmt.Errorf("controlplane: decode %s #%d: %w", bucketKeys, i, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func get[T any](btx *bolt.Tx, bucket []byte, id string) (*T, error) {
	return decodeStored[T](btx.Bucket(bucket).Get([]byte(id)), bucket, id)
}

// decodeStored decodes an object's stored JSON v (nil: none, and nil is
// returned).
func decodeStored[T any](v, bucket []byte, id string) (*T, error) {
	if v == nil {
		return nil, nil
	}
	var o T
	if err := json.Unmarshal(v, &o); err != nil {
		return nil, fmt.Errorf("controlplane: decode %s %q: %w", bucket, id, err)
	}
	return &o, nil
}

func all[T any](btx *bolt.Tx, bucket []byte) ([]T, error) {
	b := btx.Bucket(bucket)
	var out []T
	err := b.ForEach(func(k, v []byte) error {
		var o T
		if err := json.Unmarshal(v, &o); err != nil {
			return fmt.Errorf("controlplane: decode %s %q: %w", bucket, k, err)
		}
		out = append(out, o)
		return nil
	})
	return out, err
}

// boltTx is a write transaction that records its changes.
//
// Its writes are kept in writes and reach bbolt sorted by ID when the
// transaction lists a bucket or ends (flush). bbolt splits nodes only at
// commit, so random keys put one by one into a bucket pile into few
// nodes that grow with each put, and every put moves half a node: a
// write of n keys cost O(n²). Sorted, each put appends.
type boltTx struct {
	boltReader
	changes changeList
	// writes holds, per bucket, every ID the transaction wrote and its
	// value now (JSON; nil when deleted).
	writes map[string]map[string][]byte
	// unflushed are, per bucket, the IDs written since the last flush
	// (repeats included).
	unflushed map[string][]string
}

// changeList is a write's changes in order, kept in blocks (of 8, 16, …
// up to 4096) so that a write of a million objects does not copy its
// list each time it grows. The zero value is empty.
type changeList struct {
	blocks [][]Change
	n      int
}

func (l *changeList) add(c Change) {
	if len(l.blocks) == 0 || len(l.blocks[len(l.blocks)-1]) == cap(l.blocks[len(l.blocks)-1]) {
		l.blocks = append(l.blocks, make([]Change, 0, 8<<min(len(l.blocks), 9)))
	}
	last := &l.blocks[len(l.blocks)-1]
	*last = append(*last, c)
	l.n++
}

// all yields each change with its position, in order.
func (l *changeList) all() iter.Seq2[int, Change] {
	return func(yield func(int, Change) bool) {
		i := 0
		for _, b := range l.blocks {
			for _, c := range b {
				if !yield(i, c) {
					return
				}
				i++
			}
		}
	}
}

// written returns what the transaction holds for id in bucket: the
// value put, or nil for a delete (ok), or ok false when it has not
// written id.
func (t *boltTx) written(bucket []byte, id string) (v []byte, ok bool) {
	v, ok = t.writes[string(bucket)][id]
	return v, ok
}

// current returns the value id has in bucket as the transaction sees
// it, nil when absent. The bytes are the caller's to keep, not to change.
func (t *boltTx) current(bucket []byte, id string) []byte {
	if v, ok := t.written(bucket, id); ok {
		return v
	}
	return bytes.Clone(t.btx.Bucket(bucket).Get([]byte(id)))
}

// set records id's new value (nil: deleted) for the next flush.
func (t *boltTx) set(bucket []byte, id string, v []byte) {
	if t.writes == nil {
		t.writes, t.unflushed = map[string]map[string][]byte{}, map[string][]string{}
	}
	m := t.writes[string(bucket)]
	if m == nil {
		m = map[string][]byte{}
		t.writes[string(bucket)] = m
	}
	m[id] = v
	t.unflushed[string(bucket)] = append(t.unflushed[string(bucket)], id)
}

// flush writes the values written since the last flush into bbolt, each
// bucket in ID order.
func (t *boltTx) flush() error {
	for name, ids := range t.unflushed {
		b, m := t.btx.Bucket([]byte(name)), t.writes[name]
		slices.Sort(ids)
		for _, id := range slices.Compact(ids) {
			var err error
			if v := m[id]; v != nil {
				err = b.Put([]byte(id), v)
			} else {
				err = b.Delete([]byte(id))
			}
			if err != nil {
				return fmt.Errorf("controlplane: write %s %q: %w", name, id, err)
			}
		}
		delete(t.unflushed, name)
	}
	return nil
}

// writtenKeys returns the keys the transaction wrote: hash → JSON, nil
// when deleted.
func (t *boltTx) writtenKeys() map[string][]byte { return t.writes[string(bucketKeys)] }

// eachKey calls fn with every key of the state, in hash order, after a
// flush. The bytes are valid until the transaction ends.
func (t *boltTx) eachKey(fn func(hash, v []byte) error) error {
	if err := t.flush(); err != nil {
		return err
	}
	return t.btx.Bucket(bucketKeys).ForEach(fn)
}

func (t *boltTx) put(bucket []byte, obj Object, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("controlplane: encode %s %q: %w", obj, id, err)
	}
	old := t.current(bucket, id)
	t.set(bucket, id, b)
	t.changes.add(Change{Revision: t.rev, Op: OpPut, Object: obj, ID: id, Value: b, Old: old})
	return nil
}

func (t *boltTx) delete(bucket []byte, obj Object, id string) (bool, error) {
	old := t.current(bucket, id)
	if old == nil {
		return false, nil
	}
	t.set(bucket, id, nil)
	t.changes.add(Change{Revision: t.rev, Op: OpDelete, Object: obj, ID: id, Old: old})
	return true, nil
}

// The reads of a write transaction see its own writes.

func (t *boltTx) Policy(id string) (*spec.Policy, error) {
	return getTx[spec.Policy](t, bucketPolicies, id)
}

func (t *boltTx) Key(hash string) (*spec.Key, error) {
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		return nil, nil // no key has that hash
	}
	return getTx[spec.Key](t, bucketKeys, h.String())
}

func (t *boltTx) API(id string) (*spec.API, error) { return getTx[spec.API](t, bucketAPIs, id) }

func (t *boltTx) Policies() ([]spec.Policy, error) {
	if err := t.flush(); err != nil {
		return nil, err
	}
	return t.boltReader.Policies()
}

func (t *boltTx) APIs() ([]spec.API, error) {
	if err := t.flush(); err != nil {
		return nil, err
	}
	return t.boltReader.APIs()
}

func (t *boltTx) Keys(after string, limit int) ([]spec.Key, error) {
	if err := t.flush(); err != nil {
		return nil, err
	}
	return t.boltReader.Keys(after, limit)
}

func getTx[T any](t *boltTx, bucket []byte, id string) (*T, error) {
	v, ok := t.written(bucket, id)
	if !ok {
		return get[T](t.btx, bucket, id)
	}
	return decodeStored[T](v, bucket, id)
}

func (t *boltTx) PutPolicy(p spec.Policy) error {
	if p.ID == "" {
		return spec.Errors{{Path: "policies[\"\"].id", Problem: "missing"}}
	}
	return t.put(bucketPolicies, ObjectPolicy, p.ID, p)
}

func (t *boltTx) DeletePolicy(id string) (bool, error) {
	return t.delete(bucketPolicies, ObjectPolicy, id)
}

func (t *boltTx) PutKey(k spec.Key) error {
	h, err := identity.ParseKeyHash(k.KeyHash)
	if err != nil {
		return spec.Errors{{Path: "keys[" + strconv.Quote(k.KeyHash) + "].key_hash", Problem: fmt.Sprintf("%q is not sha256:<64 hex digits>", k.KeyHash)}}
	}
	k.KeyHash = h.String()
	return t.put(bucketKeys, ObjectKey, k.KeyHash, k)
}

func (t *boltTx) DeleteKey(hash string) (bool, error) {
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		return false, nil
	}
	return t.delete(bucketKeys, ObjectKey, h.String())
}

func (t *boltTx) PutAPI(a spec.API) error {
	if a.ID == "" {
		return spec.Errors{{Path: "apis[\"\"].id", Problem: "missing"}}
	}
	return t.put(bucketAPIs, ObjectAPI, a.ID, a)
}

func (t *boltTx) DeleteAPI(id string) (bool, error) { return t.delete(bucketAPIs, ObjectAPI, id) }
