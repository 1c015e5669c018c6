package live

import (
	"context"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// keylessAPI identifies the callers of one keyless API by client IP. Each
// address gets counters of its own on this API: two keyless APIs with the
// same policy limit a client separately.
type keylessAPI struct {
	api string
	k   identity.Keyless
}

// Authenticate implements identity.Authenticator.
func (k *keylessAPI) Authenticate(ctx context.Context, r identity.Request) (*core.Consumer, error) {
	c, err := k.k.Authenticate(ctx, r)
	if err != nil {
		return nil, err
	}
	c.ID += "@" + k.api // c is fresh for each request
	return c, nil
}
