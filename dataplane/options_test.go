package dataplane_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/limitplane/limitplane/dataplane"
)

// TestNewRefuses lists what New refuses, with its message.
func TestNewRefuses(t *testing.T) {
	g := newGateway(t)
	good := dataplane.AgentOptions{Target: g.gw, Address: "127.0.0.1:1", Group: "g", Token: "t"}
	for _, c := range []struct {
		edit func(o *dataplane.AgentOptions)
		want string
	}{
		{func(o *dataplane.AgentOptions) { o.Target = nil }, "dataplane: AgentOptions.Target is nil"},
		{func(o *dataplane.AgentOptions) { o.Address = "" }, "dataplane: AgentOptions.Address is empty"},
		{func(o *dataplane.AgentOptions) { o.Group = "" }, "dataplane: AgentOptions.Group is empty"},
		{func(o *dataplane.AgentOptions) { o.Token = "" }, "dataplane: AgentOptions.Token is empty"},
		{func(o *dataplane.AgentOptions) { o.OnStale = "close" }, `dataplane: unknown OnStale "close" (want keep or fail_closed)`},
		{func(o *dataplane.AgentOptions) { o.MaxStale = -time.Second }, "dataplane: MaxStale -1s is negative"},
	} {
		o := good
		c.edit(&o)
		if _, err := dataplane.New(o); err == nil || err.Error() != c.want {
			t.Errorf("got %v, want %s", err, c.want)
		}
	}
	a, err := dataplane.New(good)
	if err != nil {
		t.Fatal(err)
	}
	if a.GatewayID() == "" {
		t.Error("no default gateway id")
	}
}

// TestAgentUsesGivenConn: with Conn set the agent syncs over it and
// leaves it open when Run returns.
func TestAgentUsesGivenConn(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		g := newTarget(t)
		o := agentOptions(g.tg, "", &lockedBuffer{})
		o.Conn = cc
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		stop := runAgent(t, a)
		s := f.next(t)
		s.sendSnapshot(t, snapshot(1, "k1"), "snap-1")
		s.wantAck(t, 1, "snap-1")
		stop()
		if st := cc.GetState(); st == connectivity.Shutdown {
			t.Fatal("the agent closed the connection it was given")
		}
	})
}
