package dataplane

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/spec"
)

// Persister keeps a data plane's last applied configuration, so that a
// gateway started while the control plane is away enforces it (see
// AgentOptions.StartTimeout). Implementations must be safe for concurrent
// use.
type Persister interface {
	// Load returns the persisted configuration, or nil and no error when
	// none is.
	Load(ctx context.Context) (*spec.Snapshot, error)
	// Save persists snap. The agent calls it from one goroutine, with
	// rising revisions; snap must not be changed.
	Save(ctx context.Context, snap *spec.Snapshot) error
}

// ContactPersister is a Persister that also keeps when the data plane
// last had contact with its control plane, so that a gateway started from
// the persisted configuration counts its staleness (AgentOptions.MaxStale)
// from that contact, not from its own start. RedisPersister and
// FilePersister implement it. Implementations must be safe for
// concurrent use.
type ContactPersister interface {
	Persister
	// SaveContact records t as the last contact. It must not rewrite
	// the configuration (the agent calls it every few seconds while
	// connected).
	SaveContact(ctx context.Context, t time.Time) error
	// LoadContact returns the recorded last contact, or the zero time
	// and no error when none is.
	LoadContact(ctx context.Context) (time.Time, error)
}

// RevisionPersister is a Persister that reads the persisted revision
// without the configuration, so that a running agent notices cheaply,
// every SaveDelay, that what it persisted is gone (a data plane's Redis
// restarted empty, a state file deleted) or older than what it runs, and
// persists it again. RedisPersister and FilePersister implement it.
type RevisionPersister interface {
	Persister
	// PersistedRevision returns the revision of the persisted
	// configuration, 0 when none is.
	PersistedRevision(ctx context.Context) (uint64, error)
}

// RedisConfigKey returns the Redis key a data-plane group's configuration
// is persisted under: "limitplane:dataplane:{<group>}:config" (the group
// is a Cluster hash tag).
func RedisConfigKey(group string) string { return "limitplane:dataplane:{" + group + "}:config" }

// RedisPersister persists the configuration in the data plane's Redis,
// shared by all of its gateways: a gateway that starts during a control
// plane outage enforces what its group last ran, even on a new machine.
//
// The key (RedisConfigKey) is a hash: "revision" (decimal) and "snapshot"
// (the snapshot's spec JSON, gzip-compressed: a million keys take about
// 20 MB). A save replaces it only when its revision is higher than the
// stored one (a Lua script compares and writes in one step), so gateways
// of one group saving concurrently, or one that lags, never bring back an
// older configuration. The key has no TTL: it must outlive any outage.
//
// The hash's third field, "contact", is the last contact with the control
// plane of any gateway of the group, in Unix milliseconds (decimal): it
// is written alone (SaveContact), so the snapshot is not rewritten, and
// only ever rises.
type RedisPersister struct {
	client redis.UniversalClient
	key    string
}

// NewRedisPersister returns a RedisPersister for group over client (which
// the caller closes).
func NewRedisPersister(client redis.UniversalClient, group string) *RedisPersister {
	return &RedisPersister{client: client, key: RedisConfigKey(group)}
}

// saveScript sets the hash when ARGV[1] is a higher revision than the
// stored one; revisions are decimal without leading zeros, compared by
// length then text (exact for any uint64). It returns 1 when it wrote.
var saveScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'revision')
local new = ARGV[1]
if cur and (#cur > #new or (#cur == #new and cur >= new)) then
  return 0
end
redis.call('HSET', KEYS[1], 'revision', new, 'snapshot', ARGV[2])
return 1
`)

// contactScript sets the hash's contact field to ARGV[1] (Unix ms) when
// that is later than the stored one.
var contactScript = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], 'contact') or '0')
if cur >= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'contact', ARGV[1])
return 1
`)

// SaveContact implements ContactPersister: the "contact" field, in Unix
// milliseconds, kept when it is later already.
func (p *RedisPersister) SaveContact(ctx context.Context, t time.Time) error {
	if err := contactScript.Run(ctx, p.client, []string{p.key}, strconv.FormatInt(t.UnixMilli(), 10)).Err(); err != nil {
		return fmt.Errorf("dataplane: persist the last contact in Redis: %w", err)
	}
	return nil
}

// LoadContact implements ContactPersister.
func (p *RedisPersister) LoadContact(ctx context.Context) (time.Time, error) {
	v, err := p.client.HGet(ctx, p.key, "contact").Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("dataplane: load the last contact from Redis: %w", err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("dataplane: load the last contact from Redis: key %s: contact %q: %w", p.key, v, err)
	}
	return time.UnixMilli(ms), nil
}

// Save implements Persister. A snapshot whose revision is not higher than
// the stored one is not written, and that is not an error.
func (p *RedisPersister) Save(ctx context.Context, snap *spec.Snapshot) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(snap); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: encode: %w", snap.Revision, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: compress: %w", snap.Revision, err)
	}
	err := saveScript.Run(ctx, p.client, []string{p.key}, strconv.FormatUint(snap.Revision, 10), buf.Bytes()).Err()
	if err != nil {
		return fmt.Errorf("dataplane: persist revision %d in Redis: %w", snap.Revision, err)
	}
	return nil
}

// PersistedRevision implements RevisionPersister: the hash's "revision"
// field (one HGET).
func (p *RedisPersister) PersistedRevision(ctx context.Context) (uint64, error) {
	v, err := p.client.HGet(ctx, p.key, "revision").Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("dataplane: read the persisted revision from Redis: %w", err)
	}
	rev, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("dataplane: read the persisted revision from Redis: key %s: revision %q: %w", p.key, v, err)
	}
	return rev, nil
}

// Load implements Persister.
func (p *RedisPersister) Load(ctx context.Context) (*spec.Snapshot, error) {
	vals, err := p.client.HMGet(ctx, p.key, "revision", "snapshot").Result()
	if err != nil {
		return nil, fmt.Errorf("dataplane: load the persisted configuration from Redis: %w", err)
	}
	if vals[0] == nil && vals[1] == nil {
		return nil, nil
	}
	revText, ok1 := vals[0].(string)
	data, ok2 := vals[1].(string)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("dataplane: load the persisted configuration from Redis: key %s lacks revision or snapshot", p.key)
	}
	zr, err := gzip.NewReader(bytes.NewReader([]byte(data)))
	if err != nil {
		return nil, fmt.Errorf("dataplane: load the persisted configuration from Redis: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("dataplane: load the persisted configuration from Redis: %w", err)
	}
	snap, err := protocol.DecodeSnapshot(raw)
	if err != nil {
		return nil, fmt.Errorf("dataplane: load the persisted configuration from Redis: %w", err)
	}
	if rev := strconv.FormatUint(snap.Revision, 10); rev != revText {
		return nil, fmt.Errorf("dataplane: load the persisted configuration from Redis: key %s says revision %s, its snapshot %s", p.key, revText, rev)
	}
	return snap, nil
}

// FilePersister persists the configuration in a local file, as spec JSON
// (for a gateway without Redis). Save writes a temporary file beside it,
// syncs it and renames it over the old one (then syncs the directory), so
// the file always holds one whole configuration, the old or the new, even
// after a crash.
//
// The last contact with the control plane (SaveContact) is kept in a
// sidecar file, Path + ".contact": one RFC 3339 time with nanoseconds,
// replaced the same way, so the configuration file is not rewritten.
type FilePersister struct {
	// Path is the file's path.
	Path string
}

// Save implements Persister.
func (p FilePersister) Save(ctx context.Context, snap *spec.Snapshot) (err error) {
	dir := filepath.Dir(p.Path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(p.Path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("dataplane: persist revision %d: %w", snap.Revision, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	if err := json.NewEncoder(w).Encode(snap); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: encode: %w", snap.Revision, err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: %w", snap.Revision, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: %w", snap.Revision, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: %w", snap.Revision, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: %w", snap.Revision, err)
	}
	if err := os.Rename(f.Name(), p.Path); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: %w", snap.Revision, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // the rename survives a power cut; best effort
		d.Close()
	}
	return nil
}

// Load implements Persister: nil when the file does not exist.
func (p FilePersister) Load(context.Context) (*spec.Snapshot, error) {
	data, err := os.ReadFile(p.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dataplane: load the persisted configuration: %w", err)
	}
	snap, err := protocol.DecodeSnapshot(data)
	if err != nil {
		return nil, fmt.Errorf("dataplane: load the persisted configuration from %s: %w", p.Path, err)
	}
	return snap, nil
}

// PersistedRevision implements RevisionPersister: 0 when the file does
// not exist. Save writes the revision first, so only the file's first
// bytes are read; a file that does not start with it (written by hand) is
// loaded whole.
func (p FilePersister) PersistedRevision(ctx context.Context) (uint64, error) {
	f, err := os.Open(p.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("dataplane: read the persisted revision: %w", err)
	}
	defer f.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(f, 256))
	dec.UseNumber()
	var toks [3]json.Token
	for i := range toks {
		if toks[i], err = dec.Token(); err != nil {
			break
		}
	}
	if d, ok := toks[0].(json.Delim); ok && d == '{' && toks[1] == "revision" {
		if n, ok := toks[2].(json.Number); ok {
			if rev, err := strconv.ParseUint(n.String(), 10, 64); err == nil {
				return rev, nil
			}
		}
	}
	snap, err := p.Load(ctx)
	if err != nil || snap == nil {
		return 0, err
	}
	return snap.Revision, nil
}

// contactPath is the sidecar file of the last contact.
func (p FilePersister) contactPath() string { return p.Path + ".contact" }

// SaveContact implements ContactPersister: Path + ".contact".
func (p FilePersister) SaveContact(_ context.Context, t time.Time) error {
	path := p.contactPath()
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("dataplane: persist the last contact: %w", err)
	}
	_, err = f.WriteString(t.UTC().Format(time.RFC3339Nano) + "\n")
	if err == nil {
		err = f.Close()
	} else {
		f.Close()
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("dataplane: persist the last contact: %w", err)
	}
	return nil
}

// LoadContact implements ContactPersister: the zero time when the
// sidecar file does not exist.
func (p FilePersister) LoadContact(context.Context) (time.Time, error) {
	data, err := os.ReadFile(p.contactPath())
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("dataplane: load the last contact: %w", err)
	}
	t, err := time.Parse(time.RFC3339Nano, string(bytes.TrimSpace(data)))
	if err != nil {
		return time.Time{}, fmt.Errorf("dataplane: load the last contact from %s: %w", p.contactPath(), err)
	}
	return t, nil
}

var (
	_ ContactPersister  = (*RedisPersister)(nil)
	_ ContactPersister  = FilePersister{}
	_ RevisionPersister = (*RedisPersister)(nil)
	_ RevisionPersister = FilePersister{}
)
