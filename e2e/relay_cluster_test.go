package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestRelayRedisCluster: two Caddy instances configured with `redis { addresses … }` on a real
// 3-master Redis Cluster hold the relay's promises: exactly 100 calls per rolling minute per
// channel across both, one upstream send for 50 concurrent sends with one key. Then the master
// serving one channel's slot is killed mid-run (there are no replicas): that channel's sends
// with a key get 503 `Idempotency store unavailable` (never a send that could be doubled), its
// calls without a key are still served (the limit falls back to each instance's memory),
// another channel whose slot lives on a surviving master is unaffected, and /v1/health says
// Redis is unavailable.
func TestRelayRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartRedisCluster(t, 3)
	e := newRelayEnv(t)
	redisBlock := "redis {\n\t\t\taddresses " + strings.Join(cluster.Addrs(), " ") + "\n\t\t}"
	site := "handle_path /v1/* {\n\t\twabarelay_api\n\t}"
	a := e.caddyWith("", redisBlock, site)
	b := e.caddyWith("", redisBlock, site)
	for _, base := range []string{a, b} {
		if r := call(t, "GET", base+"/v1/health", "", ""); r.status != 200 {
			t.Fatalf("health with the cluster up: %d %s", r.status, r.body)
		}
	}
	a, b = a+proxyPrefix, b+proxyPrefix
	slotKey := func(ch store.Channel) string { return "wabarelay:relay:{" + ch.ID.String() + "}" }

	// Exactly 100 of 110 calls across the two instances.
	limited := e.channelOn(true, pnid2)
	if accepted, _ := acceptedAcross(t, []string{a, b}, 110, "/"+wabaID+"/message_templates?limit=1", limited.ChannelToken); accepted != 100 {
		t.Fatalf("accepted %d of 110 across two instances, want 100", accepted)
	}

	// One upstream send for 50 concurrent sends with one key across both instances.
	ch := e.channel(true)
	body := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"once"},"idempotency_key":"cluster-1"}`
	e.sendOnceAcross([]string{a, b}, ch, body)

	// A channel whose slot lives on another master than ch's (pnid3; recreated until it does).
	victim := cluster.MasterOf(t, slotKey(ch))
	var other store.Channel
	for range 30 {
		other = e.channelOn(true, pnid3)
		if cluster.MasterOf(t, slotKey(other)) != victim {
			break
		}
		if _, err := e.store.DeleteChannel(context.Background(), e.org, other.ID, true); err != nil {
			t.Fatal(err)
		}
	}
	if cluster.MasterOf(t, slotKey(other)) == victim {
		t.Fatal("no channel found on another master")
	}

	cluster.Kill(t, victim)
	keyed := func(base string, c store.Channel, number, key string) relayResp {
		return call(t, "POST", base+"/"+number+"/messages", c.ChannelToken,
			`{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"k"},"idempotency_key":"`+key+`"}`)
	}
	before := len(e.fake.RequestsTo("POST", "/"+pnid+"/messages"))
	for _, base := range []string{a, b} {
		r := keyed(base, ch, pnid, "after-kill")
		expectRelayError(t, r, http.StatusServiceUnavailable, "Idempotency store unavailable")
		if r.header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
		if r := call(t, "POST", base+"/"+pnid+"/messages", ch.ChannelToken, textBody); r.status != 200 {
			t.Fatalf("send without a key while its master is down: %d %s", r.status, r.body)
		}
	}
	if n := len(e.fake.RequestsTo("POST", "/"+pnid+"/messages")) - before; n != 2 {
		t.Fatalf("%d sends reached the upstream while the master was down, want the 2 without a key", n)
	}
	if r := keyed(a, other, pnid3, "on-a-live-master"); r.status != 200 {
		t.Fatalf("a channel on a surviving master: %d %s", r.status, r.body)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		r := call(t, "GET", strings.TrimSuffix(a, proxyPrefix)+"/v1/health", "", "")
		return r.status == 503 && strings.Contains(string(r.body), "Redis")
	}, "/v1/health to say Redis is unavailable")
}
