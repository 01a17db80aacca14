package dashboard_test

import (
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/dashboard"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
)

// TestDemoBroadcast: "Send a demo broadcast" scripts the fake upstream (one recipient answered
// 130429 once, another 131047) and creates a broadcast of hello_world to ten made-up customers
// at 60 a minute — or at the channel's default pace when its relay limit is below that — and
// shows its page; it takes only the org's connected numbers, and the fake's refusal is shown
// with its reason (502). The sends themselves, through the relay, are e2e's.
func TestDemoBroadcast(t *testing.T) {
	hook := testenv.NewReceiver(t)
	fake := fakegraph.New(fakegraph.WithAppSecret("demo-app-secret"), fakegraph.WithCallback(hook.URL+"/webhooks/upstream"), fakegraph.WithStatusDelay(time.Hour))
	fake.Start()
	t.Cleanup(fake.Close)
	var limit atomic.Int64
	limit.Store(100)
	e := newEnv(t, func(o *dashboard.Options) {
		o.Demo = &dashboard.Demo{FakeUpstream: fake.URL(), Receiver: "https://127.0.0.1:1", Relay: "http://127.0.0.1:1/upstream-proxy"}
		o.API = managementapi.New(managementapi.Options{Store: o.Store, AuthGuard: o.AuthGuard, RelayLimitPerMinute: func() int { return int(limit.Load()) }}).Service()
	})
	conn := e.Connection()
	e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line", Connection: conn})
	c := e.client()
	c.signIn(e.key)

	a := c.get("/dashboard/demo")
	wantStatus(t, a, http.StatusOK, "Send a demo broadcast</button>", `action="/dashboard/demo/broadcast"`)
	m := demoBatchRe.FindStringSubmatch(a.body)
	if m == nil {
		t.Fatalf("no batch:\n%s", a.body)
	}

	// bad input: 4xx, nothing scripted nor created
	wantStatus(t, c.post("/dashboard/demo/broadcast", url.Values{"phone_number_id": {"404"}, "batch": {m[1]}}), http.StatusUnprocessableEntity, "Pick one of your connected channels.")
	wantStatus(t, c.post("/dashboard/demo/broadcast", url.Values{"phone_number_id": {conn.PhoneNumberID}}), http.StatusUnprocessableEntity, "Reload the page")
	if n := e.Count(t, "broadcasts"); n != 0 {
		t.Fatalf("%d broadcasts after bad input", n)
	}

	check := func(batch string, rate int) {
		t.Helper()
		a := c.post("/dashboard/demo/broadcast", url.Values{"phone_number_id": {conn.PhoneNumberID}, "batch": {batch}})
		bm := broadcastPathRe.FindStringSubmatch(a.url)
		if bm == nil {
			t.Fatalf("after the button: %s (%d)\n%s", a.url, a.status, a.body)
		}
		wantStatus(t, a, http.StatusOK, "Demo broadcast created.", "<code>hello_world (en_US)</code>", `data-live="3"`)
		to := testenv.QueryValue[[]string](t, e.Fixture, `SELECT array_agg(wa_to ORDER BY seq) FROM broadcast_recipients WHERE broadcast_id = $1`, bm[1])
		if got := testenv.QueryValue[int](t, e.Fixture, `SELECT rate_per_minute FROM broadcasts WHERE id = $1`, bm[1]); len(to) != 10 || got != rate {
			t.Fatalf("%d recipients at %d/min, want 10 at %d", len(to), got, rate)
		}
		for i, n := range to {
			var want []int
			switch i {
			case 2:
				want = []int{130429}
			case 6:
				want = []int{131047}
			}
			if got := fake.Scripted(n); !slices.Equal(got, want) {
				t.Errorf("recipient %d (%s): scripted %v, want %v", i, n, got, want)
			}
		}
	}
	check(m[1], 60)
	// a relay limit below the demo's pace: the channel's default, half of it
	limit.Store(40)
	check("00000000000000ff", 20)

	// the fake cannot be reached
	fake.Close()
	wantStatus(t, c.post("/dashboard/demo/broadcast", url.Values{"phone_number_id": {conn.PhoneNumberID}, "batch": {m[1]}}), http.StatusBadGateway,
		"The fake upstream did not take the demo&#39;s script: fake upstream unreachable")
}
