// Package drl is limitplane's Distributed Rate Limiter (DRL): the gateways
// of one data plane share a hot key's rate limit in memory, each deciding
// against its own share, with no Redis call on the request path.
//
// The idea comes from Tyk's DRL, where every gateway announces itself over
// Redis pub/sub and takes an equal share R/N. Its users report what that
// costs: with uneven load balancing, 3 gateways with a 50/s limit throttle
// at 40–45/s (Tyk #1244); low rates over many gateways round every share
// to nothing and refuse everything (#1287); and a new gateway admits the
// full limit until it has heard of the others. limitplane's DRL keeps the
// speed and drops the inaccuracy:
//
//   - Shares follow demand. Every interval H each gateway reports its
//     smoothed offered load per hot key (Limiter.Report); one allocator,
//     elected through Redis with a lease and a fencing token, computes
//     max-min fair shares with headroom (Allocator.Step) and publishes them
//     in an epoch-stamped Table.
//   - The sum of the shares never exceeds the limit, rate and burst. Each
//     key keeps floors free for gateways that join (which start at their
//     floor, R/MaxGateways, never at the full limit) and for gateways that
//     departed recently (they may be partitioned from Redis and still
//     serving at their floor). A table lowers shares at once but grants a
//     grow only from capacity that no gateway may still be using: grows
//     wait until the shrinks they need are acknowledged (or the gateways
//     that owe them have gone stale). Switching a key's share inside a
//     gateway carries its tokens exactly.
//   - A limit change keeps the tokens spent, not the time, as the other
//     stores do: the units a key spent from its share stay spent from the
//     share it runs under the new limit. The new limit is a new KeyID, so
//     the key runs that name's share (its floor until the allocator lists
//     it), and the shares of each limit stay within that limit.
//   - A gateway whose table is older than 2H (measured from when it sent the
//     call that returned it) runs every key at its floor, so a Redis outage
//     or a partition keeps the total within the limit; a report lives 2H +
//     H/2 in Redis, so the allocator forgets a gateway's share only after
//     the gateway itself has dropped it. A gateway whose report may have
//     expired comes back on a new run (Report.Run) and runs no share from
//     before it until a table for the new run reaches it.
//   - Keys too slow to split (R/MaxGateways below MinFloorRate, or
//     floor(B/MaxGateways) below 1: #1287's 10/s over 4 gateways) and
//     requests that also spend a quota are left to the exact (Redis) store.
//
// Guarantee: the rate shares the gateways run never sum above R and their
// bursts never above B, so the requests a key admits over all gateways in
// any interval of length t are at most B + R×t. It holds for up to
// MaxGateways gateways, with at most JoinReserve of them joining before
// the shrinks that make room for the previous joiners are acknowledged,
// and with gateways cut off from Redis crashing (or reconnecting) within
// AllocatorOptions.Forget. Beyond MaxGateways every gateway still runs at
// least its floor and the bound is not promised. A gateway whose key table
// is full (LimiterOptions.MaxKeys) leaves new keys to the exact store,
// which counts them apart from the shares.
//
// The simulator in sim_test.go checks this over 100 seeds per scenario
// (skew, Tyk #1244, a load step, churn with partitions, allocator
// failover, a Redis outage): every 1 s window and the sum of the shares
// the gateways run, at every event. With the allocator's unsafe switch
// (grows granted before the shrinks they need are in force: set by this
// package's tests, or by a build with the tag limitplane_drl_unsafe, never
// by an option) the shares run sum above R in nearly every churn run; the admitted windows exceed R + B only where a
// shrink reaches its gateway late (a lost or slow delivery), since a
// gateway cut off from Redis is at its floor (2H) before its report
// expires (2H + H/2) and its share is handed out.
//
// This package holds the pure parts, with time as an argument: KeyID, the
// Allocator and the Limiter. The Redis glue (reports, lease, table
// publication, acknowledgements) builds on them.
package drl
