package e2e

import (
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestBroadcastFairness: org A's channel runs a broadcast at its default rate, half the relay's
// per-channel limit (40 calls in any 4 s here: 600 a minute, so 300 a minute, one send every
// 200 ms). Once it has run for more than a window, A's caller bursts sends on the same channel:
// it gets about the other half of the limit — at least 18 of 40: the pace lets the broadcast
// hold at most half the window plus one send (21), and one more may be admitted early when a
// send's path from its claim to the limit is delayed by more than an interval on a loaded
// machine — and no more than 30 (the broadcast's sends count in the limit the callers share).
// Meanwhile org B's calls on its own channel all succeed (its whole limit), and the broadcast
// still completes, every recipient accepted: its sends refused by the full limit are requeued,
// not failed.
func TestBroadcastFairness(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	const limit = 40
	origin := e.broadcastCaddy(e.fake.URL(), "", "40 4s", "")
	base := origin + proxyPrefix
	chA := e.channel(true)
	_, keyA := e.fix.APIKey(t, e.org)
	orgB := e.fix.Org(t).ID
	chB := e.fix.Channel(t, orgB, &testenv.ChannelOpts{Connection: connection(pnid2)})

	const n = 40
	b := createBroadcast(t, origin, keyA, chA.ID.String(), broadcastBody("fair", "hello_world", phones(1, n), false, 0, ""))
	if b.RatePerMinute != 300 {
		t.Fatalf("default rate %d, want 300 (half of 40 per 4 s)", b.RatePerMinute)
	}
	// More than a window (4 s = 20 sends) of the broadcast's sends.
	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.fake.RequestsTo("POST", "/"+pnid+"/messages")) >= 25 },
		"25 of the broadcast's sends")

	send := func(number, token string) relayResp {
		return call(t, "POST", base+"/"+number+"/messages", token, textBody)
	}
	got := 0
	for range limit {
		r := send(pnid, chA.ChannelToken)
		if r.status == 429 {
			break
		}
		if r.status != 200 {
			t.Fatalf("A's caller: %d %s", r.status, r.body)
		}
		got++
	}
	for i := range limit {
		if r := send(pnid2, chB.ChannelToken); r.status != 200 {
			t.Fatalf("B's call %d while A's broadcast runs: %d %s", i, r.status, r.body)
		}
	}
	t.Logf("A's caller got %d of the %d calls in the window while the broadcast ran", got, limit)
	if got < limit/2-2 || got > limit*3/4 {
		t.Fatalf("A's caller got %d calls before a 429, want about half of %d (%d to %d)", got, limit, limit/2-2, limit*3/4)
	}
	testenv.Eventually(t, time.Minute, func() bool { return getBroadcast(t, origin, keyA, b.ID).Status == "completed" }, "the broadcast completed")
	if c := getBroadcast(t, origin, keyA, b.ID).Counts; c.Accepted != n {
		t.Fatalf("counts %+v, want all %d accepted", c, n)
	}
}
