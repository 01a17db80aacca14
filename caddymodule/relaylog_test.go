package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestRelayLogThroughCaddy: through a Caddy child process on the fake upstream, every call on
// the send path and every refusal of one by a known channel becomes one relay_log row (sends
// with and without a key, a replay, a key reused with another body, upstream errors with their
// codes, the upstream's 429 and the relay's own, an inactive channel), calls off the send path
// or without a channel none; every message sent has a messages row with the relay's fields;
// the metrics count what was written.
func TestRelayLogThroughCaddy(t *testing.T) {
	e := newRelayEnv(t, "")
	origin := e.caddySite("", "relay_log {\n\t\t\tinterval 50ms\n\t\t}", e.fake.URL(), `handle_path `+proxyPrefix+`/* {
		wabarelay_proxy {
			rate_limit 10 1h
		}
	}
	handle /metrics {
		metrics
	}`)
	base := origin + proxyPrefix
	ch := e.channel(true)
	pending := e.channel(false)
	send := base + "/" + pnid + "/messages"
	const to = "15551234567"
	keyed := func(key, text string) string {
		return `{"messaging_product":"whatsapp","to":"` + to + `","type":"text","text":{"body":"` + text + `"},"idempotency_key":"` + key + `"}`
	}
	wamidOf := func(r relayResp) string {
		var a struct{ Messages []struct{ ID string } }
		if json.Unmarshal(r.body, &a) != nil || len(a.Messages) != 1 {
			t.Fatalf("not a send's answer: %d %s", r.status, r.body)
		}
		return a.Messages[0].ID
	}
	var want []string // the rows expected, in call order
	row := func(channel uuid.UUID, status int, outcome, code, key string, replayed bool, recipient, wamid string) {
		want = append(want, fmt.Sprintf("%s %d %s code=%s key=%s replayed=%t to=%s wamid=%s", channel, status, outcome, code, key, replayed, recipient, wamid))
	}

	w1 := wamidOf(call(t, "POST", send, ch.ChannelToken, textBody))
	row(ch.ID, 200, "ok", "", "", false, to, w1)
	w2 := wamidOf(call(t, "POST", send, ch.ChannelToken, keyed("k1", "hi")))
	row(ch.ID, 200, "ok", "", "k1", false, to, w2)
	if r := call(t, "POST", send, ch.ChannelToken, keyed("k1", "hi")); r.header.Get("Idempotent-Replayed") != "true" || wamidOf(r) != w2 {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	row(ch.ID, 200, "replayed", "", "k1", true, to, w2)
	expectRelayError(t, call(t, "POST", send, ch.ChannelToken, keyed("k1", "other")), 422, "idempotency_key was already used with a different request")
	row(ch.ID, 422, "idempotency_conflict", "", "k1", false, to, "")
	e.fake.FailNext("POST /"+pnid+"/messages", 1, 0, fakegraph.ErrReengagement())
	if r := call(t, "POST", send, ch.ChannelToken, textBody); r.status != 400 {
		t.Fatalf("re-engagement: %d %s", r.status, r.body)
	}
	row(ch.ID, 400, "upstream_4xx", "131047/", "", false, to, "")
	e.fake.FailNext("POST /"+pnid+"/messages", 1, 0, fakegraph.ErrPairRateLimit())
	if r := call(t, "POST", send, ch.ChannelToken, keyed("k2", "again")); r.status != 429 {
		t.Fatalf("pair rate limit: %d %s", r.status, r.body)
	}
	row(ch.ID, 429, "upstream_4xx", "131056/", "k2", false, to, "")
	expectRelayError(t, call(t, "POST", send, pending.ChannelToken, textBody), 403, "Channel is not active")
	row(pending.ID, 403, "inactive", "", "", false, "", "")
	// Off the send path, or no channel: not logged.
	call(t, "GET", base+"/"+wabaID+"/message_templates", ch.ChannelToken, "")
	call(t, "POST", base+"/"+otherPnid+"/messages", ch.ChannelToken, textBody)
	call(t, "POST", send, "not-a-token", textBody)
	// The relay's own rate limit.
	limited := false
	for i := 0; i < 10 && !limited; i++ {
		r := call(t, "POST", send, ch.ChannelToken, textBody)
		switch r.status {
		case 200:
			row(ch.ID, 200, "ok", "", "", false, to, wamidOf(r))
		case 429:
			limited = true
			row(ch.ID, 429, "rate_limited", "", "", false, to, "")
		default:
			t.Fatalf("send: %d %s", r.status, r.body)
		}
	}
	if !limited {
		t.Fatal("the rate limit never answered 429")
	}

	testenv.Eventually(t, testenv.Patience, func() bool { return e.fix.Count(t, "relay_log") >= len(want) }, "the calls in relay_log")
	rows, err := e.pool.Query(context.Background(), `
		SELECT format('%s %s %s code=%s key=%s replayed=%s to=%s wamid=%s', channel_id, status, outcome,
		       coalesce(error_code || '/' || coalesce(error_subcode::text, ''), ''), coalesce(idempotency_key, ''),
		       replayed, coalesce(recipient, ''), coalesce(wamid, '')), org_id = $1, latency_us >= 0
		FROM relay_log ORDER BY at`, e.org)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		var sameOrg, latencyOK bool
		if err := rows.Scan(&s, &sameOrg, &latencyOK); err != nil {
			t.Fatal(err)
		}
		if !sameOrg || !latencyOK {
			t.Errorf("row %s: org or latency wrong", s)
		}
		got = append(got, s)
	}
	got = normaliseBools(got)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("relay_log:\n got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// messages: none (no status came; the statuses make its rows), and the timeline of each sent
	// message read from the relay log alone: accepted, the first call's fields, the replay marked.
	if n := e.fix.Count(t, "messages"); n != 0 {
		t.Fatalf("%d messages rows, want none", n)
	}
	tl, err := e.store.MessageTimeline(context.Background(), e.org, w2)
	if err != nil {
		t.Fatal(err)
	}
	if r := tl.Relay; tl.Status != "accepted" || tl.ChannelID != ch.ID || tl.To == nil || *tl.To != to ||
		r == nil || r.Status != 200 || r.IdempotencyKey == nil || *r.IdempotencyKey != "k1" || !r.Replayed {
		t.Fatalf("message %s: %+v, relay call %+v", w2, tl, tl.Relay)
	}
	if tl, err := e.store.MessageTimeline(context.Background(), e.org, w1); err != nil || tl.Relay == nil ||
		tl.Relay.IdempotencyKey != nil || tl.Relay.Replayed {
		t.Fatalf("message %s: a key or replay it never had: %+v %v", w1, tl, err)
	}

	written := regexp.MustCompile(`(?m)^caddy_wabarelay_relay_log_written_total (\d+)$`)
	testenv.Eventually(t, testenv.Patience, func() bool {
		m := written.FindSubmatch(call(t, "GET", origin+"/metrics", "", "").body)
		return m != nil && string(m[1]) == fmt.Sprint(len(want))
	}, "caddy_wabarelay_relay_log_written_total %d", len(want))
	if m := call(t, "GET", origin+"/metrics", "", "").body; !strings.Contains(string(m), "\ncaddy_wabarelay_relay_log_dropped_total 0\n") {
		t.Fatalf("calls dropped: %s", regexp.MustCompile(`(?m)^caddy_wabarelay_relay_log.*$`).FindAll(m, -1))
	}
}

// normaliseBools writes Postgres's booleans (t, f in format's %s) as Go prints them.
func normaliseBools(rows []string) []string {
	for i, r := range rows {
		r = strings.Replace(r, "replayed=t ", "replayed=true ", 1)
		rows[i] = strings.Replace(r, "replayed=f ", "replayed=false ", 1)
	}
	return rows
}
