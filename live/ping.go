package live

import (
	"context"
	"time"

	"github.com/limitplane/limitplane/core"
)

// Store states a readiness check reports (PingStore).
const (
	StoreOK          = "ok"          // the store answered a PING
	StoreUnreachable = "unreachable" // it did not
	StoreInProcess   = "in-process"  // it has no Ping method (the memory store): always reachable
)

// DefaultPingTimeout bounds a readiness check's store PING unless told
// otherwise (gateway.AdminOptions.PingTimeout).
const DefaultPingTimeout = 2 * time.Second

// PingStore asks s whether it is reachable, within ctx and timeout (when
// > 0), for the readiness checks of a gateway and of a service that
// follows a control plane: StoreOK, StoreUnreachable with the error, or
// StoreInProcess for a store without a Ping(ctx) error method (a
// *redisstore.Store and a *drl.Store over one have it).
func PingStore(ctx context.Context, s core.Store, timeout time.Duration) (string, error) {
	p, ok := s.(interface{ Ping(context.Context) error })
	if !ok {
		return StoreInProcess, nil
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if err := p.Ping(ctx); err != nil {
		return StoreUnreachable, err
	}
	return StoreOK, nil
}
