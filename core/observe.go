package core

import (
	"context"
	"log/slog"
	"time"
)

// Observers returns an Observer that tells each of obs in turn.
func Observers(obs ...Observer) Observer { return observers(obs) }

type observers []Observer

func (o observers) ObserveDecision(api string, d Decision, err error, took time.Duration) {
	for _, x := range o {
		x.ObserveDecision(api, d, err, took)
	}
}

// LogObserver returns an Observer that logs denials, shadow denials (at
// Info) and errors (at Warn) to l with structured attributes; allowed
// decisions are logged at Debug. Consumer IDs are never logged.
func LogObserver(l *slog.Logger) Observer { return logObserver{l} }

type logObserver struct{ l *slog.Logger }

func (o logObserver) ObserveDecision(api string, d Decision, err error, took time.Duration) {
	ctx := context.Background()
	switch {
	case err != nil:
		o.l.LogAttrs(ctx, slog.LevelWarn, "limitplane decision failed", slog.String("api", api), slog.String("error", err.Error()), slog.Duration("took", took))
	case d.Shadowed:
		o.l.LogAttrs(ctx, slog.LevelInfo, "limitplane shadow denial", slog.String("api", api), slog.String("policy", d.Policy), slog.String("limit", d.DecidedBy.String()))
	case !d.Allowed:
		o.l.LogAttrs(ctx, slog.LevelInfo, "limitplane denied", slog.String("api", api), slog.String("policy", d.Policy), slog.String("limit", d.DecidedBy.String()), slog.Duration("retry_after", d.RetryAfter))
	default:
		if o.l.Enabled(ctx, slog.LevelDebug) {
			o.l.LogAttrs(ctx, slog.LevelDebug, "limitplane allowed", slog.String("api", api), slog.String("policy", d.Policy), slog.Int64("remaining", d.Remaining))
		}
	}
}
