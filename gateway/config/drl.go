package config

import (
	"cmp"
	"fmt"
	"time"

	"github.com/limitplane/limitplane/core/drl"
	"github.com/limitplane/limitplane/dataplane"
)

// Bounds of the drl section; its defaults are drl's (drl.DefaultGroup,
// drl.DefaultInterval...).
const (
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

// DRL is the drl section: the options of the Distributed Rate Limiter
// (package core/drl, drl.New). The gateways of one data plane report
// their demand for each distributed policy's hot keys to their shared
// Redis every Interval; one of them, elected with a lease and a fencing
// token, publishes shares that follow demand and never sum above the
// limit; each gateway enforces its share in memory, with no Redis call
// per request. A key whose share per gateway would be too coarse stays
// with the Redis store, exact. Group is drl.group, else
// control_plane.group, else drl.DefaultGroup; a join_reserve or headroom
// of 0 (none) is -1 here, as drl.Options says none; GatewayID,
// MinFloorRate, MaxKeys and Logger are left zero (the defaults).
type DRL = drl.Options

// drl validates the drl section. It needs a Redis store: the gateways
// share their demand and the allocation through it.
func (v *loader) drl(raw *rawConfig, cfg *Config) *DRL {
	r := raw.DRL
	d := &DRL{Group: drl.DefaultGroup}
	if cfg.Redis == nil && !v.Refused("store") && !v.failed("store") {
		v.fail("drl", "needs a redis store (store: redis://host:port/db): the gateways of a data plane share their demand and shares through it")
	}
	switch {
	case r.Group != "":
		if !dataplane.ValidGroup(r.Group) {
			v.fail("drl.group", "%q: want %s", r.Group, dataplane.GroupRule)
		} else {
			d.Group = r.Group
		}
	case raw.ControlPlane != nil && raw.ControlPlane.Group != "":
		d.Group = raw.ControlPlane.Group
	}
	d.Interval = number(v, "drl.interval", r.Interval, drl.DefaultInterval,
		func(iv time.Duration) bool { return iv >= MinDRLInterval && iv <= MaxDRLInterval },
		fmt.Sprintf(": want %v to %v", MinDRLInterval, MaxDRLInterval))
	d.MaxGateways = number(v, "drl.max_gateways", r.MaxGateways, drl.DefaultMaxGateways, within(1, MaxDRLGateways), wantWithin(1, MaxDRLGateways))
	d.JoinReserve = number(v, "drl.join_reserve", r.JoinReserve, drl.DefaultJoinReserve, nonNegative, " must be >= 0")
	if r.JoinReserve != nil && d.JoinReserve >= d.MaxGateways && !v.failed("drl.max_gateways") {
		v.fail("drl.join_reserve", "%d must be below max_gateways (%d): the reserved floors would leave nothing to share", d.JoinReserve, d.MaxGateways)
	}
	d.JoinReserve = cmp.Or(d.JoinReserve, -1)
	d.Headroom = number(v, "drl.headroom", r.Headroom, drl.DefaultHeadroom, func(h float64) bool { return h >= 0 && h <= MaxDRLHeadroom },
		fmt.Sprintf(": want 0 to %v (a fraction of demand: 0.02 is 2%%)", MaxDRLHeadroom))
	d.Headroom = cmp.Or(d.Headroom, -1)
	return d
}
