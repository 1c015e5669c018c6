package drl

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/limitplane/limitplane/core"
)

// KeyID names one distributed key the same way on every gateway of a data
// plane: the lowercase hex of the first 16 bytes of
//
//	SHA-256(consumer ‖ 0x00 ‖ scope ‖ 0x00 ‖ Rate ‖ 0x00 ‖ Period ‖ 0x00 ‖ Burst)
//
// with Rate, Period (in nanoseconds) and Burst (the effective burst: Rate
// when Burst is 0) written in decimal. The limit is part of the name, so
// no table mixes two limits: when a policy changes a key's limit, the
// Limiter keeps the key (its units spent carry over) under the new name,
// which the allocator sees as a new key, and stops reporting the old one,
// which the allocator forgets once no gateway reports it (see
// Limiter). The consumer is hashed: the name reaches Redis and never
// carries a raw credential. A Limiter computes it once per key and limit.
type KeyID string

// MakeKeyID returns the KeyID of (consumer, scope) under the rate limit l.
func MakeKeyID(consumer, scope string, l core.Limit) KeyID {
	var buf [96]byte
	h := sha256.New()
	h.Write([]byte(consumer))
	b := append(buf[:0], 0)
	h.Write(b)
	h.Write([]byte(scope))
	b = append(buf[:0], 0)
	b = strconv.AppendInt(b, l.Rate, 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, int64(l.Period), 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, l.EffectiveBurst(), 10)
	h.Write(b)
	var sum [sha256.Size]byte
	return KeyID(hex.EncodeToString(h.Sum(sum[:0])[:16]))
}

// LimitOf returns the KeyLimit of the core.Limit l (a valid, enforced GCRA
// limit): its rate in requests per second and its effective burst.
func LimitOf(l core.Limit) KeyLimit {
	return KeyLimit{Rate: float64(l.Rate) * float64(time.Second) / float64(l.Period), Burst: l.EffectiveBurst()}
}
