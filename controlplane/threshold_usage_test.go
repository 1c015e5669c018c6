package controlplane_test

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/lease"
)

// TestThresholdUsage: threshold events reported in lease batches (two
// data planes, one repeated) show in GET /api/usage/keys/{hash}, per
// period, once each, named with the data plane that reported them (the
// call's group, whatever the event said); a key without any has no
// thresholds field.
func TestThresholdUsage(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		putQuotaConfig(t, s)
		q := serveQuota(t, s, func() time.Time { return quotaStart }, nil)
		h, err := controlplane.Admin(controlplane.AdminOptions{Store: s, Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		web := httptest.NewServer(h)
		t.Cleanup(web.Close)
		p1 := quotaStart
		ev := func(id string, pct int64, start time.Time, dp string) lease.ThresholdEvent {
			return lease.ThresholdEvent{ID: id, DataPlane: dp, Consumer: aliceConsumer, API: "api1", Policy: "q", Threshold: pct,
				PeriodStart: start, PeriodEnd: start.Add(time.Hour), At: start.Add(time.Minute)}
		}
		b1 := lease.Batch{Thresholds: []lease.ThresholdEvent{ev("e80", 80, p1, "dp1"), ev("e100", 100, p1, "dp1")}}
		if ans := mustLease(t, q.client, "dp1", b1); ans.Thresholds != 2 {
			t.Fatalf("answer %+v", ans)
		}
		mustLease(t, q.client, "dp1", b1) // a repeat
		mustLease(t, q.client, "dp2", lease.Batch{Thresholds: []lease.ThresholdEvent{ev("e80", 80, p1, "forged")}})
		mustLease(t, q.client, "dp1", lease.Batch{Thresholds: []lease.ThresholdEvent{ev("n80", 80, p1.Add(time.Hour), "dp1")}})

		a := call(t, "GET", web.URL+"/api/usage/keys/"+hash("alice"), "")
		f := func(t time.Time) string { return t.Format(time.RFC3339) }
		e := func(id string, pct int64, start time.Time, dp string) string {
			return `{"id":"` + id + `","data_plane":"` + dp + `","consumer":"` + aliceConsumer + `","api":"api1","policy":"q","threshold":` +
				map[int64]string{80: "80", 100: "100"}[pct] + `,"epoch":0,"period_start":"` + f(start) + `","period_end":"` + f(start.Add(time.Hour)) +
				`","at":"` + f(start.Add(time.Minute)) + `"}`
		}
		want := `{"key_hash":"` + hash("alice") + `","consumer":"` + aliceConsumer + `","entries":[],` +
			`"totals":{"spent":0,"leased":0,"floor_spent":0,"admitted":0,"refused":0},"thresholds":[` +
			`{"api":"api1","policy":"q","epoch":0,"period_start":"` + f(p1) + `","period_end":"` + f(p1.Add(time.Hour)) + `","reached":[80,100],"events":[` +
			e("e80", 80, p1, "dp1") + `,` + e("e80", 80, p1, "dp2") + `,` + e("e100", 100, p1, "dp1") + `]},` +
			`{"api":"api1","policy":"q","epoch":0,"period_start":"` + f(p1.Add(time.Hour)) + `","period_end":"` + f(p1.Add(2*time.Hour)) + `","reached":[80],"events":[` +
			e("n80", 80, p1.Add(time.Hour), "dp1") + `]}]}`
		expect(t, a, 200, want)
		expect(t, call(t, "GET", web.URL+"/api/usage/keys/"+hash("bob"), ""), 200,
			`{"key_hash":"`+hash("bob")+`","consumer":"`+bobConsumer+`","entries":[],"totals":{"spent":0,"leased":0,"floor_spent":0,"admitted":0,"refused":0}}`)
	})
}

// TestAdminThresholds: the admin API takes a policy's thresholds and
// refuses bad ones (422) by field path, nothing changed.
func TestAdminThresholds(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	h, err := controlplane.Admin(controlplane.AdminOptions{Store: s, Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	expect(t, call(t, "PUT", srv.URL+"/api/policies/gold", `{"quota":{"max":100,"renewal":"1h"},"thresholds":[80,100]}`), 200, `{"revision":1}`)
	expect(t, call(t, "GET", srv.URL+"/api/policies/gold", ""), 200, `{"id":"gold","quota":{"max":100,"renewal":"1h0m0s"},"thresholds":[80,100]}`)
	expect(t, call(t, "PUT", srv.URL+"/api/policies/gold", `{"quota":{"max":100,"renewal":"1h"},"thresholds":[0,80,80]}`), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[`+
			`{"path":"policies[\"gold\"].thresholds[0]","problem":"0: a threshold is a percentage of the quota, 1 to 100"},`+
			`{"path":"policies[\"gold\"].thresholds[2]","problem":"80% is listed twice (first at policies[\"gold\"].thresholds[1])"}]}`)
	expect(t, call(t, "PUT", srv.URL+"/api/policies/silver", `{"rate":{"requests":5,"per":"1m"},"thresholds":[80]}`), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[`+
			`{"path":"policies[\"silver\"].thresholds","problem":"thresholds are percentages of the policy's quota: give it a quota (not -1)"}]}`)
}
