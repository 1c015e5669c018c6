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

var (
	_ Persister = (*RedisPersister)(nil)
	_ Persister = FilePersister{}
)
