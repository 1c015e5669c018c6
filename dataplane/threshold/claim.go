package threshold

import (
	"context"
	"fmt"
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
