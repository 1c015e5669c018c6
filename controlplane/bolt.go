package controlplane

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/limitplane/limitplane/identity"
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
	// the file to let go; 0 means 5s.
	LockTimeout time.Duration
}

// DefaultChangeLogRevisions is the change log's length when
// BoltOptions.ChangeLogRevisions is 0.
const DefaultChangeLogRevisions = 10000

// Buckets of the bbolt file.
var (
	bucketPolicies = []byte("policies") // ID → spec.Policy JSON
	bucketKeys     = []byte("keys")     // lower-case key hash → spec.Key JSON
	bucketAPIs     = []byte("apis")     // ID → spec.API JSON
	bucketChanges  = []byte("changes")  // revision (8 bytes BE) + sequence (4 bytes BE) → Change JSON
	bucketMeta     = []byte("meta")     // metaRevision → revision (8 bytes BE)
	metaRevision   = []byte("revision")
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

// OpenBolt opens or creates the store in the bbolt file path (mode 0600).
// It fails, wrapping bbolt's error, when the file cannot be opened or is
// held by another process for longer than LockTimeout.
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
		o.LockTimeout = 5 * time.Second
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.LockTimeout})
	if err != nil {
		return nil, fmt.Errorf("controlplane: open %s: %w", path, err)
	}
	db.MaxBatchDelay, db.MaxBatchSize = o.BatchDelay, o.BatchSize
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketPolicies, bucketKeys, bucketAPIs, bucketChanges, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
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
		tx := &boltTx{boltReader{btx: btx, rev: cur + 1}, nil}
		if err := fn(tx); err != nil {
			return err
		}
		if len(tx.changes) == 0 {
			rev, wrote = cur, false
			return nil
		}
		if err := validateWrite(tx, tx.changes); err != nil {
			return err
		}
		if err := b.appendChanges(btx, tx.rev, tx.changes); err != nil {
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
func (b *Bolt) appendChanges(btx *bolt.Tx, rev uint64, changes []Change) error {
	log := btx.Bucket(bucketChanges)
	for i, c := range changes {
		c.Revision = rev
		v, err := json.Marshal(c)
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
func (r *boltReader) keys() ([]spec.Key, error) { return all[spec.Key](r.btx, bucketKeys) }

func get[T any](btx *bolt.Tx, bucket []byte, id string) (*T, error) {
	v := btx.Bucket(bucket).Get([]byte(id))
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
type boltTx struct {
	boltReader
	changes []Change
}

func (t *boltTx) put(bucket []byte, obj Object, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("controlplane: encode %s %q: %w", obj, id, err)
	}
	bk := t.btx.Bucket(bucket)
	old := bytes.Clone(bk.Get([]byte(id))) // valid only until the Put
	if err := bk.Put([]byte(id), b); err != nil {
		return fmt.Errorf("controlplane: put %s %q: %w", obj, id, err)
	}
	t.changes = append(t.changes, Change{Revision: t.rev, Op: OpPut, Object: obj, ID: id, Value: b, Old: old})
	return nil
}

func (t *boltTx) delete(bucket []byte, obj Object, id string) (bool, error) {
	b := t.btx.Bucket(bucket)
	old := bytes.Clone(b.Get([]byte(id))) // valid only until the Delete
	if old == nil {
		return false, nil
	}
	if err := b.Delete([]byte(id)); err != nil {
		return false, fmt.Errorf("controlplane: delete %s %q: %w", obj, id, err)
	}
	t.changes = append(t.changes, Change{Revision: t.rev, Op: OpDelete, Object: obj, ID: id, Old: old})
	return true, nil
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
