package threshold

import (
	"encoding/json"

	"context"
	"fmt"
	"github.com/limitplane/limitplane/dataplane/lease"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// MemoryClaimer is an in-process Claimer: a set of ids with their
// expiries, bounded.
type MemoryClaimer struct {
	max int
	now func() time.Time
	mu  sync.Mutex
	ids map[string]time.Time
}

// NewMemoryClaimer returns a Claimer holding at most max ids (0 means
// 100,000): when full, expired ids are dropped, then (should none have
// expired) an arbitrary one, so at worst an old event could be sent
// again, never a new one held back. now is the wall clock (nil:
// time.Now).
func NewMemoryClaimer(max int, now func() time.Time) *MemoryClaimer {
	if max <= 0 {
		max = 100_000
	}
	if now == nil {
		now = time.Now
	}
	return &MemoryClaimer{max: max, now: now, ids: map[string]time.Time{}}
}

// Claim implements Claimer.
func (m *MemoryClaimer) Claim(_ context.Context, id string, until time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if exp, ok := m.ids[id]; ok && exp.After(now) {
		return false, nil
	}
	if len(m.ids) >= m.max {
		for k, exp := range m.ids {
			if !exp.After(now) {
				delete(m.ids, k)
			}
		}
		for k := range m.ids {
			if len(m.ids) < m.max {
				break
			}
			delete(m.ids, k)
		}
	}
	m.ids[id] = until
	return true, nil
}

// Release implements Claimer.
func (m *MemoryClaimer) Release(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.ids, id)
	return nil
}

// Len returns how many ids are held.
func (m *MemoryClaimer) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ids)
}

// RedisClaimer claims ids in Redis with SET NX and an expiry at the
// quota period's end, so every gateway of a data plane (and a gateway
// restarted) agrees: key <prefix>threshold:<id>.
type RedisClaimer struct {
	c      redis.UniversalClient
	prefix string
	// Reports, when set, also appends each event claimed to the data
	// plane's report list (ReportKey), which its quota runner
	// (dataplane.QuotaRunner, run with a control plane) sends to the
	// control plane's usage and trims. Set it only where a runner runs:
	// the list is capped (maxReports, the oldest dropped) but read by
	// nothing else.
	Reports bool
}

// maxReports caps the report list; reportTTL is its expiry, renewed by
// each event.
const (
	maxReports = 10_000
	reportTTL  = 24 * time.Hour
)

// ReportKey is the Redis list of threshold events a data plane's quota
// runner reports: <prefix>{gq}:thresholds, in the slot of the runner's
// other keys.
func ReportKey(prefix string) string { return prefix + "{gq}:thresholds" }

// Record implements Recorder: with Reports set, it appends e (as a
// lease.ThresholdEvent) to ReportKey, keeping the newest 10,000, the
// list expiring a day after its last event.
func (r *RedisClaimer) Record(ctx context.Context, e Event) error {
	if !r.Reports {
		return nil
	}
	v, err := json.Marshal(lease.ThresholdEvent{ID: e.ID, DataPlane: e.DataPlane, Consumer: e.Consumer, API: e.API, Endpoint: e.Endpoint, Policy: e.Policy,
		Threshold: e.Threshold, Epoch: e.Epoch, PeriodStart: e.PeriodStart, PeriodEnd: e.PeriodEnd, At: e.At})
	if err != nil {
		return err
	}
	k := ReportKey(r.prefix)
	pipe := r.c.TxPipeline()
	pipe.RPush(ctx, k, v)
	pipe.LTrim(ctx, k, -maxReports, -1)
	// Every key has a TTL: a list no runner reads goes in a day.
	pipe.Expire(ctx, k, reportTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("threshold: redis report: %w", err)
	}
	return nil
}

// NewRedisClaimer returns a Claimer on c; prefix is the store's key
// prefix ("limitplane:").
func NewRedisClaimer(c redis.UniversalClient, prefix string) *RedisClaimer {
	return &RedisClaimer{c: c, prefix: prefix}
}

// Claim implements Claimer: SET NX with PXAT until (at least a second
// from now).
func (r *RedisClaimer) Claim(ctx context.Context, id string, until time.Time) (bool, error) {
	ttl := time.Until(until)
	if ttl < time.Second {
		ttl = time.Second
	}
	ok, err := r.c.SetNX(ctx, r.prefix+"threshold:"+id, "1", ttl).Result()
	if err != nil {
		return false, fmt.Errorf("threshold: redis claim: %w", err)
	}
	return ok, nil
}

// Release implements Claimer.
func (r *RedisClaimer) Release(ctx context.Context, id string) error {
	if err := r.c.Del(ctx, r.prefix+"threshold:"+id).Err(); err != nil {
		return fmt.Errorf("threshold: redis release: %w", err)
	}
	return nil
}
