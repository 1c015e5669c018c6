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

// HistoryPersister is a Persister that also keeps the control-plane
// history the configuration belongs to (syncpb's SnapshotChunk.history:
// revisions count within a history, and a restored control plane starts
// a new one), and reads the persisted revision and history without the
// configuration, so that a running agent notices cheaply, every
// SaveDelay, that what it persisted is gone (a data plane's Redis
// restarted empty, a state file deleted) or older than what it runs, and
// persists it again. RedisPersister and FilePersister implement it.
type HistoryPersister interface {
	Persister
	// SaveHistory persists snap as a configuration of history ("" for
	// none). Save(ctx, snap) is SaveHistory(ctx, snap, "").
	SaveHistory(ctx context.Context, snap *spec.Snapshot, history string) error
	// LoadHistory returns the persisted configuration and its history,
	// or nil, "" and no error when none is.
	LoadHistory(ctx context.Context) (*spec.Snapshot, string, error)
	// PersistedRevision returns the revision and the history of the
	// persisted configuration, 0 and "" when none is.
	PersistedRevision(ctx context.Context) (revision uint64, history string, err error)
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
// The field "history" names the control-plane history of the snapshot
// (SaveHistory; "" for none). A save of another, non-empty, history
// replaces the stored configuration whatever the revisions: a restored
// control plane numbers revisions anew, and its lower revisions must win
// over the lost history's higher ones.
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

// saveScript sets the hash to revision ARGV[1], snapshot ARGV[2] and
// history ARGV[3] when the revision is higher than the stored one or the
// history is not "" and not the stored one; revisions are decimal without
// leading zeros, compared by length then text (exact for any uint64). It
// returns 1 when it wrote.
var saveScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'revision')
local curHistory = redis.call('HGET', KEYS[1], 'history') or ''
local new, history = ARGV[1], ARGV[3]
if cur and (history == '' or history == curHistory) and (#cur > #new or (#cur == #new and cur >= new)) then
  return 0
end
redis.call('HSET', KEYS[1], 'revision', new, 'snapshot', ARGV[2], 'history', history)
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

// Save implements Persister: SaveHistory(ctx, snap, "").
func (p *RedisPersister) Save(ctx context.Context, snap *spec.Snapshot) error {
	return p.SaveHistory(ctx, snap, "")
}

// SaveHistory implements HistoryPersister. A snapshot of the stored
// history (or of none) whose revision is not higher than the stored one
// is not written, and that is not an error.
func (p *RedisPersister) SaveHistory(ctx context.Context, snap *spec.Snapshot, history string) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(snap); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: encode: %w", snap.Revision, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: compress: %w", snap.Revision, err)
	}
	err := saveScript.Run(ctx, p.client, []string{p.key}, strconv.FormatUint(snap.Revision, 10), buf.Bytes(), history).Err()
	if err != nil {
		return fmt.Errorf("dataplane: persist revision %d in Redis: %w", snap.Revision, err)
	}
	return nil
}

// PersistedRevision implements HistoryPersister: the hash's "revision"
// and "history" fields (one HMGET).
func (p *RedisPersister) PersistedRevision(ctx context.Context) (uint64, string, error) {
	vals, err := p.client.HMGet(ctx, p.key, "revision", "history").Result()
	if err != nil {
		return 0, "", fmt.Errorf("dataplane: read the persisted revision from Redis: %w", err)
	}
	v, _ := vals[0].(string)
	h, _ := vals[1].(string)
	if vals[0] == nil {
		return 0, "", nil
	}
	rev, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("dataplane: read the persisted revision from Redis: key %s: revision %q: %w", p.key, v, err)
	}
	return rev, h, nil
}

// Load implements Persister.
func (p *RedisPersister) Load(ctx context.Context) (*spec.Snapshot, error) {
	snap, _, err := p.LoadHistory(ctx)
	return snap, err
}

// LoadHistory implements HistoryPersister.
func (p *RedisPersister) LoadHistory(ctx context.Context) (*spec.Snapshot, string, error) {
	snap, history, err := p.load(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("dataplane: load the persisted configuration from Redis: %w", err)
	}
	return snap, history, nil
}

func (p *RedisPersister) load(ctx context.Context) (*spec.Snapshot, string, error) {
	vals, err := p.client.HMGet(ctx, p.key, "revision", "snapshot", "history").Result()
	if err != nil {
		return nil, "", err
	}
	if vals[0] == nil && vals[1] == nil {
		return nil, "", nil
	}
	history, _ := vals[2].(string)
	revText, ok1 := vals[0].(string)
	data, ok2 := vals[1].(string)
	if !ok1 || !ok2 {
		return nil, "", fmt.Errorf("key %s lacks revision or snapshot", p.key)
	}
	zr, err := gzip.NewReader(bytes.NewReader([]byte(data)))
	if err != nil {
		return nil, "", err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, "", err
	}
	snap, err := protocol.DecodeSnapshot(raw)
	if err != nil {
		return nil, "", err
	}
	if rev := strconv.FormatUint(snap.Revision, 10); rev != revText {
		return nil, "", fmt.Errorf("key %s says revision %s, its snapshot %s", p.key, revText, rev)
	}
	return snap, history, nil
}

// FilePersister persists the configuration in a local file, as spec JSON
// (for a gateway without Redis). Save writes a temporary file beside it,
// syncs it and renames it over the old one (then syncs the directory), so
// the file always holds one whole configuration, the old or the new, even
// after a crash.
//
// The last contact with the control plane (SaveContact) is kept in a
// sidecar file, Path + ".contact": one RFC 3339 time with nanoseconds,
// replaced the same way, so the configuration file is not rewritten. The
// configuration's control-plane history (SaveHistory) is kept in another,
// Path + ".history", written after the configuration (absent for none): a
// crash between the two leaves a history that does not match, which the
// control plane answers with a snapshot.
type FilePersister struct {
	// Path is the file's path.
	Path string
}

// Save implements Persister: SaveHistory(ctx, snap, "").
func (p FilePersister) Save(ctx context.Context, snap *spec.Snapshot) error {
	return p.SaveHistory(ctx, snap, "")
}

// SaveHistory implements HistoryPersister: the file is replaced whatever
// it held (one gateway writes it).
func (p FilePersister) SaveHistory(ctx context.Context, snap *spec.Snapshot, history string) error {
	if err := p.save(ctx, snap); err != nil {
		return err
	}
	if history == "" {
		if err := os.Remove(p.historyPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("dataplane: persist revision %d: %w", snap.Revision, err)
		}
		return nil
	}
	if err := replaceFile(p.historyPath(), history+"\n"); err != nil {
		return fmt.Errorf("dataplane: persist revision %d: history: %w", snap.Revision, err)
	}
	return nil
}

// historyPath is the sidecar file of the history.
func (p FilePersister) historyPath() string { return p.Path + ".history" }

// loadHistory reads the history sidecar: "" when it does not exist.
func (p FilePersister) loadHistory() (string, error) {
	data, err := os.ReadFile(p.historyPath())
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("dataplane: load the persisted history: %w", err)
	}
	return string(bytes.TrimSpace(data)), nil
}

// LoadHistory implements HistoryPersister.
func (p FilePersister) LoadHistory(ctx context.Context) (*spec.Snapshot, string, error) {
	snap, err := p.Load(ctx)
	if err != nil || snap == nil {
		return nil, "", err
	}
	h, err := p.loadHistory()
	if err != nil {
		return nil, "", err
	}
	return snap, h, nil
}

func (p FilePersister) save(ctx context.Context, snap *spec.Snapshot) (err error) {
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

// PersistedRevision implements HistoryPersister: 0 and "" when the file
// does not exist.
func (p FilePersister) PersistedRevision(ctx context.Context) (uint64, string, error) {
	rev, err := p.persistedRevision(ctx)
	if err != nil || rev == 0 {
		return rev, "", err
	}
	h, err := p.loadHistory()
	return rev, h, err
}

// persistedRevision returns the file's revision, 0 when it does not
// exist. Save writes the revision first, so only the file's first bytes
// are read; a file that does not start with it (written by hand) is
// loaded whole.
func (p FilePersister) persistedRevision(ctx context.Context) (uint64, error) {
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
	if err := replaceFile(p.contactPath(), t.UTC().Format(time.RFC3339Nano)+"\n"); err != nil {
		return fmt.Errorf("dataplane: persist the last contact: %w", err)
	}
	return nil
}

// replaceFile replaces path with content through a temporary file beside
// it, renamed over it.
func replaceFile(path, content string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
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
	}
	return err
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
	_ ContactPersister = (*RedisPersister)(nil)
	_ ContactPersister = FilePersister{}
	_ HistoryPersister = (*RedisPersister)(nil)
	_ HistoryPersister = FilePersister{}
)
