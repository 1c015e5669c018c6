package gateway

import "github.com/limitplane/limitplane/internal/failurelog"

// StoreFailureLogInterval is how often, at most, the gateway writes a line
// about store failures (or go-redis's dial failures) after the first one
// of an outage.
const StoreFailureLogInterval = failurelog.DefaultInterval

// AfterFunc has time.AfterFunc's contract: it calls f in its own goroutine
// once d has passed, and returns a function that cancels that call if it
// has not started (reporting whether it cancelled it). Tests pass their
// own to fire the interval's end when they choose.
type AfterFunc = failurelog.AfterFunc
