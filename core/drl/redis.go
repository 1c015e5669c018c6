package drl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The DRL's Redis layout, for one group (one data plane's gateways). Every
// key carries the hash tag {<group>}, so one script may touch them all on
// a Redis Cluster:
//
//	limitplane:drl:{g}:lease          string "<token>:<nonce>", PX 1.5H: the allocator's lease
//	limitplane:drl:{g}:fence          counter (INCR): the fencing tokens; no TTL (a token is never reused)
//	limitplane:drl:{g}:table          string, the JSON of the Table in force, PX Forget (kept alive by the lease's renewal)
//	limitplane:drl:{g}:tablever       string "<epoch>:<token>:<line, hex>" of that table (its version), PX Forget
//	limitplane:drl:{g}:report:<gw>    string, the JSON of gateway gw's Report, PX 2H + H/2
//	limitplane:drl:{g}:gateways       ZSET gateway → time of its last report (ms, Redis TIME), PX Forget
//	limitplane:drl:{g}:ack            HASH gateway → epoch of the table it applied, PX Forget
//	limitplane:drl:{g}:tables         pub/sub channel: the version of each table published
//	limitplane:drl:{g}:acks           pub/sub channel: the gateway that acknowledged a table
//
// The lease's value carries a random nonce beside the token: a Redis that
// lost its data (a restart without persistence) counts tokens from 1
// again, and the nonce keeps an allocator elected before the loss from
// passing the lease check of one elected after it.

// keyPrefix is the start of every DRL key.
const keyPrefix = "limitplane:drl:"

// keys are the Redis names of one group.
type keys struct {
	lease, fence, table, tablever, gateways, ack string
	left                                         string // hash: gateways that left cleanly
	tables, acks                                 string // channels
	report                                       string // + gateway ID
}

func keysFor(group string) keys {
	p := keyPrefix + "{" + group + "}:"
	return keys{
		lease: p + "lease", fence: p + "fence", table: p + "table", tablever: p + "tablever",
		gateways: p + "gateways", ack: p + "ack", left: p + "left", tables: p + "tables", acks: p + "acks", report: p + "report:",
	}
}

// electScript: KEYS lease, fence; ARGV lease PX (ms), nonce. Returns the
// new fencing token, or 0 when a lease is held.
var electScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], t .. ':' .. ARGV[2], 'PX', ARGV[1])
return t
`)

// renewScript: KEYS lease, table, tablever; ARGV lease value, lease PX,
// keep PX. Extends the lease (and the table's life) when it is still
// ours; returns 1, or 0 when it is not.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
`)

// publishScript: KEYS lease, table, tablever; ARGV lease value, table
// JSON, version, tables channel, keep PX. Publishes the table only under
// our lease: an allocator whose lease lapsed can never publish. Returns 1,
// or 0 when the lease is not ours.
var publishScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[5])
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[5])
redis.call('PUBLISH', ARGV[4], ARGV[3])
return 1
`)

// reportScript: KEYS report, gateways, tablever, table; ARGV report JSON,
// report PX, gateway, known version, forget ms, keep PX. Writes the
// report, stamps the gateway in the ZSET (dropping gateways silent for
// Forget), and returns the table in force: {0} none, {1, version} the
// known one, {2, version, JSON} another.
var reportScript = redis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], ms, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ms - tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[2], ARGV[6])
local v = redis.call('GET', KEYS[3])
if not v then return {0} end
if v == ARGV[4] then return {1, v} end
local j = redis.call('GET', KEYS[4])
if not j then return {0} end
return {2, v, j}
`)

// ackScript: KEYS ack; ARGV gateway, epoch, acks channel, keep PX.
var ackScript = redis.NewScript(`
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
`)

// leaveScript: KEYS report, gateways, ack, lease, left; ARGV gateway,
// lease value ("" when not the allocator), keep PX. A gateway's graceful
// leave: its report, its place in the ZSET and its acknowledgement go at
// once, and so does the lease if it holds it, so the next allocator need
// not wait for it to expire; the left hash tells the allocator not to keep
// its floor for Forget (it decides nothing any more).
var leaveScript = redis.NewScript(`
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[2] ~= '' and redis.call('GET', KEYS[4]) == ARGV[2] then redis.call('DEL', KEYS[4]) end
redis.call('HSET', KEYS[5], ARGV[1], 1)
redis.call('PEXPIRE', KEYS[5], ARGV[3])
return 1
`)

// wire is the DRL's Redis client side for one gateway of one group: each
// method is one round trip (two for readState).
type wire struct {
	c       redis.UniversalClient
	k       keys
	gateway string
	h       time.Duration // the interval H
	keep    time.Duration // TTL of the shared keys (Forget)
}

func ms(d time.Duration) int64 { return max(int64(d/time.Millisecond), 1) }

// leasePX is the lease's TTL, 1.5H.
func (w *wire) leasePX() int64 { return ms(w.h + w.h/2) }

// reportPX is a report's TTL, 2H + H/2 rounded up to the millisecond:
// longer than the 2H a gateway keeps a table fresh after the call that
// wrote its report, and never shorter than the 2H + H/2 its Limiter
// counts on before it starts a new run (rounding down would let a report
// expire while the gateway still ran its run's shares).
func (w *wire) reportPX() int64 {
	d := 2*w.h + w.h/2
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// elect tries to take the lease; it returns the token and the lease's
// value, or token 0 when another gateway holds it.
func (w *wire) elect(ctx context.Context, nonce string) (uint64, string, error) {
	t, err := electScript.Run(ctx, w.c, []string{w.k.lease, w.k.fence}, w.leasePX(), nonce).Uint64()
	if err != nil {
		return 0, "", fmt.Errorf("drl: elect: %w", err)
	}
	if t == 0 {
		return 0, "", nil
	}
	return t, strconv.FormatUint(t, 10) + ":" + nonce, nil
}

// renew extends the lease held with value; false: it is not ours any more.
func (w *wire) renew(ctx context.Context, value string) (bool, error) {
	n, err := renewScript.Run(ctx, w.c, []string{w.k.lease, w.k.table, w.k.tablever}, value, w.leasePX(), ms(w.keep)).Int()
	if err != nil {
		return false, fmt.Errorf("drl: renew lease: %w", err)
	}
	return n == 1, nil
}

// version is a table's identity in Redis: "<epoch>:<token>:<line, hex>"
// (a Redis that lost its data numbers epochs and tokens from 1 again).
func version(t *Table) string {
	return strconv.FormatUint(t.Epoch, 10) + ":" + strconv.FormatUint(t.Token, 10) + ":" + strconv.FormatUint(t.Line, 16)
}

// publish stores t and announces it, under the lease held with value;
// false: the lease is not ours (nothing was written).
func (w *wire) publish(ctx context.Context, value string, t *Table) (bool, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return false, fmt.Errorf("drl: encode table: %w", err)
	}
	n, err := publishScript.Run(ctx, w.c, []string{w.k.lease, w.k.table, w.k.tablever}, value, b, version(t), w.k.tables, ms(w.keep)).Int()
	if err != nil {
		return false, fmt.Errorf("drl: publish table: %w", err)
	}
	return n == 1, nil
}

// report writes rep and returns the table in force: t nil and ver "" when
// there is none, t nil and ver == known when it is the known one.
func (w *wire) report(ctx context.Context, rep *Report, known string) (t *Table, ver string, err error) {
	b, err := json.Marshal(rep)
	if err != nil {
		return nil, "", fmt.Errorf("drl: encode report: %w", err)
	}
	res, err := reportScript.Run(ctx, w.c, []string{w.k.report + w.gateway, w.k.gateways, w.k.tablever, w.k.table},
		b, w.reportPX(), w.gateway, known, ms(w.keep), ms(w.keep)).Slice()
	if err != nil {
		return nil, "", fmt.Errorf("drl: report: %w", err)
	}
	if len(res) == 0 {
		return nil, "", errors.New("drl: report: empty reply")
	}
	switch code, _ := res[0].(int64); {
	case code == 0:
		return nil, "", nil
	case code == 1 && len(res) == 2:
		v, _ := res[1].(string)
		return nil, v, nil
	case code == 2 && len(res) == 3:
		v, _ := res[1].(string)
		j, _ := res[2].(string)
		t, err := decodeTable(j)
		if err != nil {
			return nil, "", err
		}
		return t, v, nil
	}
	return nil, "", fmt.Errorf("drl: report: unexpected reply %v", res)
}

// readTable returns the table in force and its version, or nil and "".
func (w *wire) readTable(ctx context.Context) (*Table, string, error) {
	vals, err := w.c.MGet(ctx, w.k.tablever, w.k.table).Result()
	if err != nil {
		return nil, "", fmt.Errorf("drl: read table: %w", err)
	}
	v, _ := vals[0].(string)
	j, _ := vals[1].(string)
	if v == "" || j == "" {
		return nil, "", nil
	}
	t, err := decodeTable(j)
	if err != nil {
		return nil, "", err
	}
	return t, v, nil
}

func decodeTable(j string) (*Table, error) {
	var t Table
	if err := json.Unmarshal([]byte(j), &t); err != nil {
		return nil, fmt.Errorf("drl: decode table: %w", err)
	}
	return &t, nil
}

// ack records that this gateway applied the table of epoch, and tells the
// allocator.
func (w *wire) ack(ctx context.Context, epoch uint64) error {
	if err := ackScript.Run(ctx, w.c, []string{w.k.ack}, w.gateway, epoch, w.k.acks, ms(w.keep)).Err(); err != nil {
		return fmt.Errorf("drl: ack: %w", err)
	}
	return nil
}

// state is what the allocator reads each step: the live gateways'
// reports (those whose report has not expired) and the acknowledgements.
type state struct {
	reports []Report
	acks    map[string]uint64
	// gone are the gateways in the ack hash without a live report, for
	// cleaning it.
	gone []string
	// left are the gateways that left cleanly (Store.Close), for
	// Allocator.Left and then for cleaning the left hash.
	left []string
}

// readState reads the reports of the gateways in the ZSET and the ack
// hash: one pipelined round trip, then one MGET.
func (w *wire) readState(ctx context.Context) (*state, error) {
	var members *redis.StringSliceCmd
	var acks *redis.MapStringStringCmd
	var left *redis.StringSliceCmd
	_, err := w.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		members = p.ZRange(ctx, w.k.gateways, 0, -1)
		acks = p.HGetAll(ctx, w.k.ack)
		left = p.HKeys(ctx, w.k.left)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("drl: read state: %w", err)
	}
	st := &state{acks: map[string]uint64{}, left: left.Val()}
	for g, e := range acks.Val() {
		n, err := strconv.ParseUint(e, 10, 64)
		if err == nil {
			st.acks[g] = n
		}
	}
	names := members.Val()
	live := map[string]bool{}
	if len(names) > 0 {
		ks := make([]string, len(names))
		for i, g := range names {
			ks[i] = w.k.report + g
		}
		vals, err := w.c.MGet(ctx, ks...).Result()
		if err != nil {
			return nil, fmt.Errorf("drl: read reports: %w", err)
		}
		for i, v := range vals {
			s, ok := v.(string)
			if !ok {
				continue // expired: the gateway left or is cut off
			}
			var r Report
			if err := json.Unmarshal([]byte(s), &r); err != nil || r.Gateway != names[i] {
				continue // not a report this version wrote: not live
			}
			live[r.Gateway] = true
			st.reports = append(st.reports, r)
		}
	}
	for g := range st.acks {
		if !live[g] {
			st.gone = append(st.gone, g)
		}
	}
	return st, nil
}

// forget drops the acknowledgements of gateways with no live report and
// the left entries the allocator has taken in.
func (w *wire) forget(ctx context.Context, gone, left []string) error {
	if len(gone) == 0 && len(left) == 0 {
		return nil
	}
	_, err := w.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(gone) > 0 {
			p.HDel(ctx, w.k.ack, gone...)
		}
		if len(left) > 0 {
			p.HDel(ctx, w.k.left, left...)
		}
		return nil
	})
	return err
}

// leave removes this gateway's report, ZSET entry and acknowledgement,
// and the lease when value ("" if none) is the one held.
func (w *wire) leave(ctx context.Context, value string) error {
	err := leaveScript.Run(ctx, w.c, []string{w.k.report + w.gateway, w.k.gateways, w.k.ack, w.k.lease, w.k.left}, w.gateway, value, ms(w.keep)).Err()
	if err != nil {
		return fmt.Errorf("drl: leave: %w", err)
	}
	return nil
}
