package config

import (
	"fmt"
	"strings"
	"time"
)

// Defaults and bounds of the drl section.
const (
	// DefaultDRLGroup is the DRL group of a gateway with neither
	// drl.group nor control_plane.group.
	DefaultDRLGroup = "default"
	// DefaultDRLInterval is H, the period of demand reports and
	// allocations.
	DefaultDRLInterval = time.Second
	// DefaultDRLMaxGateways is the number of gateways a distributed limit
	// is safe for: each gateway's floor is limit / max_gateways.
	DefaultDRLMaxGateways = 32
	// DefaultDRLJoinReserve is the number of floors kept free for
	// gateways that join between two tables.
	DefaultDRLJoinReserve = 1
	// DefaultDRLHeadroom is the share above smoothed demand given to a
	// gateway that is not saturated, as a fraction (0.02 = 2%).
	DefaultDRLHeadroom = 0.02
	// MinDRLInterval and MaxDRLInterval bound drl.interval: below 10 ms
	// the reports would load Redis more than the requests they save.
	MinDRLInterval = 10 * time.Millisecond
	MaxDRLInterval = time.Minute
	// MaxDRLGateways bounds drl.max_gateways (and so the gateways one
	// allocation table lists per key).
	MaxDRLGateways = 1024
	// MaxDRLHeadroom bounds drl.headroom.
	MaxDRLHeadroom = 10.0
)

// DRL is the drl section: the Distributed Rate Limiter (package
// core/drl). The gateways of one data plane report their demand for
// each distributed policy's hot keys to their shared Redis every Interval;
// one of them, elected with a lease and a fencing token, publishes shares
// that follow demand and never sum above the limit; each gateway enforces
// its share in memory, with no Redis call per request. A key whose share
// per gateway would be too coarse stays with the Redis store, exact.
type DRL struct {
	// Group names the DRL's keys in Redis (limitplane:drl:{group}:…): the
	// gateways that share limits must have the same one, and data planes
	// sharing one Redis different ones. drl.group, else
	// control_plane.group, else DefaultDRLGroup.
	Group string
	// Interval is H: how often each gateway reports its demand and the
	// allocator publishes. A gateway without a table for 2H runs at its
	// floor; a dead allocator is replaced within 2H.
	Interval time.Duration
	// MaxGateways is the most gateways the limit is split between: each
	// gateway's floor is limit/MaxGateways, and the sum of shares stays
	// within the limit for up to this many gateways.
	MaxGateways int
	// JoinReserve is the number of floors kept unallocated for gateways
	// that join between two tables (they start at their floor).
	JoinReserve int
	// Headroom is the share above its smoothed demand a gateway that is
	// not saturated gets, as a fraction of that demand.
	Headroom float64
}

// drl validates the drl section. It needs a Redis store: the gateways
// share their demand and the allocation through it.
func (v *validator) drl(raw *rawConfig, cfg *Config) *DRL {
	r := raw.DRL
	d := &DRL{Group: DefaultDRLGroup}
	if cfg.Redis == nil && !v.refused("store") && !v.failed("store") {
		v.fail("drl", "needs a redis store (store: redis://host:port/db): the gateways of a data plane share their demand and shares through it")
	}
	switch {
	case r.Group != "":
		if strings.ContainsAny(r.Group, "{}") || strings.IndexFunc(r.Group, func(c rune) bool { return c <= ' ' || c == 0x7f }) >= 0 || len(r.Group) > 128 {
			v.fail("drl.group", "%q: want 1 to 128 characters without spaces, control characters, \"{\" or \"}\" (it names a Cluster hash tag)", r.Group)
		} else {
			d.Group = r.Group
		}
	case raw.ControlPlane != nil && raw.ControlPlane.Group != "":
		d.Group = raw.ControlPlane.Group
	}
	d.Interval = duration(v, "drl.interval", r.Interval, DefaultDRLInterval,
		func(iv time.Duration) bool { return iv >= MinDRLInterval && iv <= MaxDRLInterval },
		fmt.Sprintf(": want %v to %v", MinDRLInterval, MaxDRLInterval))
	d.MaxGateways = number(v, "drl.max_gateways", r.MaxGateways, DefaultDRLMaxGateways, within(1, MaxDRLGateways), wantWithin(1, MaxDRLGateways))
	d.JoinReserve = number(v, "drl.join_reserve", r.JoinReserve, DefaultDRLJoinReserve, nonNegative, " must be >= 0")
	if r.JoinReserve != nil && d.JoinReserve >= d.MaxGateways && !v.failed("drl.max_gateways") {
		v.fail("drl.join_reserve", "%d must be below max_gateways (%d): the reserved floors would leave nothing to share", d.JoinReserve, d.MaxGateways)
	}
	d.Headroom = number(v, "drl.headroom", r.Headroom, DefaultDRLHeadroom, func(h float64) bool { return h >= 0 && h <= MaxDRLHeadroom },
		fmt.Sprintf(": want 0 to %v (a fraction of demand: 0.02 is 2%%)", MaxDRLHeadroom))
	return d
}
