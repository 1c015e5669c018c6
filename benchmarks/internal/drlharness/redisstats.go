package drlharness

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// scriptCommands are the commands that run a script or function: the
// Redis store (core/redisstore) decides with EVALSHA, falling back to EVAL
// when Redis answers NOSCRIPT; the others are counted in case a store
// uses them.
var scriptCommands = []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}

// scriptStats counts script calls in the server's own statistics.
//
// INFO commandstats counts calls per command, so it cannot tell the
// store's rate-limit scripts from the DRL's own (reports, election,
// publication), which are EVALSHAs too. The server is started with every
// command in its slow log (slowlog-log-slower-than 0), whose entries carry
// each call's arguments: a script call whose first key is one of the
// store's keys (the configured key prefix followed by a hash tag,
// "<prefix>{...}") is a call on the request path; the rest are the DRL's.
// The log is drained every 200 ms; commandstats' total is kept to check
// that none was missed.
type scriptStats struct {
	client *redis.Client
	prefix string // the store's key prefix

	mu     sync.Mutex
	lastID int64
	onPath int64 // script calls on the store's keys
	// noScript counts the store's EVALSHAs that ran before its first
	// EVAL: on a fresh server they were answered NOSCRIPT, and the store
	// sent the call again (go-redis's Script.Run: EVALSHA, then EVAL), so
	// they decided nothing. Exact while the store uses one script (the
	// harness's policy is a GCRA rate limit without a quota: the store's
	// gcraOnly script); loaded is set at that first EVAL.
	noScript int64
	loaded   bool
	other    int64 // other script calls (the DRL's)
	lost     int64 // entries that left the log before they were read
	baseline map[string]int64
}

func newScriptStats(ctx context.Context, addr, prefix string) (*scriptStats, error) {
	s := &scriptStats{client: redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Second, WriteTimeout: time.Second}), prefix: prefix}
	logs, err := s.client.SlowLogGet(ctx, 1).Result()
	if err != nil {
		s.client.Close()
		return nil, fmt.Errorf("drlharness: slowlog: %w", err)
	}
	s.lastID = -1 // the log's IDs start at 0
	if len(logs) > 0 {
		s.lastID = logs[0].ID
	}
	if s.baseline, err = s.commandStats(ctx); err != nil {
		s.client.Close()
		return nil, err
	}
	return s, nil
}

// commandStats reads the calls of each script command from INFO
// commandstats.
func (s *scriptStats) commandStats(ctx context.Context) (map[string]int64, error) {
	info, err := s.client.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("drlharness: info commandstats: %w", err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				m[name] = n
			}
		}
	}
	return m, nil
}

// drain reads the slow log's new entries and counts the script calls.
// SLOWLOG GET returns the newest entries, and more arrive between two
// calls: it asks for more until the oldest entry returned is the first
// one not yet counted (or the log holds no older one: those were lost).
func (s *scriptStats) drain(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var logs []redis.SlowLog
	for n := int64(128); ; n *= 2 {
		var err error
		if logs, err = s.client.SlowLogGet(ctx, min(n, slowlogMaxLen)).Result(); err != nil {
			return err
		}
		if len(logs) == 0 || logs[len(logs)-1].ID <= s.lastID+1 || int64(len(logs)) < n || n >= slowlogMaxLen {
			break
		}
	}
	if len(logs) == 0 {
		return nil
	}
	if oldest := logs[len(logs)-1].ID; oldest > s.lastID+1 {
		s.lost += oldest - s.lastID - 1
	}
	for i := len(logs) - 1; i >= 0; i-- { // oldest first: the order Redis ran them
		l := logs[i]
		if l.ID <= s.lastID || len(l.Args) == 0 || !isScript(l.Args[0]) {
			continue
		}
		// EVALSHA sha numkeys key..., EVAL script numkeys key...,
		// FCALL function numkeys key...
		if len(l.Args) > 3 && l.Args[2] != "0" && strings.HasPrefix(l.Args[3], s.prefix+"{") {
			s.onPath++
			switch {
			case strings.EqualFold(l.Args[0], "eval"):
				s.loaded = true
			case strings.EqualFold(l.Args[0], "evalsha") && !s.loaded:
				s.noScript++
			}
		} else {
			s.other++
		}
	}
	s.lastID = max(s.lastID, logs[0].ID)
	return nil
}

func isScript(cmd string) bool {
	for _, c := range scriptCommands {
		if strings.EqualFold(cmd, c) {
			return true
		}
	}
	return false
}

// poll drains the log every 200 ms until ctx is done. Errors (Redis
// paused or stopped) are retried at the next tick.
func (s *scriptStats) poll(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c, cancel := context.WithTimeout(ctx, time.Second)
			s.drain(c)
			cancel()
		}
	}
}

// scriptCounts is what scriptStats found over a run.
type scriptCounts struct {
	// OnPath counts the store's script calls (NoScript of them answered
	// NOSCRIPT and sent again), Other the rest (the DRL's), Lost the slow
	// log entries that left the log before they were read.
	OnPath, NoScript, Other, Lost int64
	// CommandStats is the growth of INFO commandstats' calls of the
	// script commands: every script call, the store's and the DRL's.
	CommandStats int64
}

// finish drains the log a last time and returns the counts.
func (s *scriptStats) finish(ctx context.Context) (scriptCounts, error) {
	defer s.client.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cs, err := s.commandStats(ctx)
	if err != nil {
		return scriptCounts{}, err
	}
	if err := s.drain(ctx); err != nil {
		return scriptCounts{}, fmt.Errorf("drlharness: slowlog: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := scriptCounts{OnPath: s.onPath, NoScript: s.noScript, Other: s.other, Lost: s.lost}
	for _, name := range scriptCommands {
		c.CommandStats += cs[name] - s.baseline[name]
	}
	return c, nil
}
