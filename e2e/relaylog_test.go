package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestRelayLogThroughCaddy: through a Caddy child process on the fake upstream, every call on
// the send path that went upstream or was replayed becomes one relay_log row (sends with and
// without a key, a replay, upstream errors with their codes, the upstream's 429), and every
// refusal of one by a known channel is counted in relay_counts (a key reused with another body,
// the relay's own 429, an inactive channel); calls off the send path or without a
// channel are in neither; every message sent has its timeline from the relay log; the metrics
// count what was written.
func TestRelayLogThroughCaddy(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
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
	counted := map[string]int{} // the refusals expected in relay_counts, by channel, status and outcome
	count := func(channel uuid.UUID, status int, outcome string) {
		counted[fmt.Sprintf("%s %d %s", channel, status, outcome)]++
	}
	calls := 0 // every call recorded (rows and counts)

	w1 := wamidOf(call(t, "POST", send, ch.ChannelToken, textBody))
	row(ch.ID, 200, "ok", "", "", false, to, w1)
	w2 := wamidOf(call(t, "POST", send, ch.ChannelToken, keyed("k1", "hi")))
	row(ch.ID, 200, "ok", "", "k1", false, to, w2)
	if r := call(t, "POST", send, ch.ChannelToken, keyed("k1", "hi")); r.header.Get("Idempotent-Replayed") != "true" || wamidOf(r) != w2 {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	row(ch.ID, 200, "replayed", "", "k1", true, to, w2)
	expectRelayError(t, call(t, "POST", send, ch.ChannelToken, keyed("k1", "other")), 422, "idempotency_key was already used with a different request")
	count(ch.ID, 422, "idempotency_conflict")
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
	count(pending.ID, 403, "inactive")
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
			count(ch.ID, 429, "rate_limited")
		default:
			t.Fatalf("send: %d %s", r.status, r.body)
		}
	}
	if !limited {
		t.Fatal("the rate limit never answered 429")
	}

	for _, n := range counted {
		calls += n
	}
	calls += len(want)
	testenv.Eventually(t, testenv.Patience, func() bool {
		return e.fix.Count(t, "relay_log") >= len(want) &&
			testenv.QueryValue[int](t, e.fix, `SELECT coalesce(sum(calls), 0)::int FROM relay_counts`) >= calls-len(want)
	}, "the calls in relay_log and relay_counts")
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
	gotCounts := map[string]int{}
	rows, err = e.pool.Query(context.Background(), `
		SELECT format('%s %s %s', channel_id, status, outcome), sum(calls)::int FROM relay_counts WHERE org_id = $1 GROUP BY 1`, e.org)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { gotCounts[key] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(gotCounts, counted) {
		t.Fatalf("relay_counts: %v, want %v", gotCounts, counted)
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
		return m != nil && string(m[1]) == fmt.Sprint(calls)
	}, "caddy_wabarelay_relay_log_written_total %d", calls)
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

// TestRelayLogRefusalFlood: through Caddy, a flood of refusals from one channel token
// — 429s of the rate limit, with a 255-byte key and a 256-byte "to" — leaves the relay log's
// growth bounded: no relay_log row per refused call, one relay_counts row per second and
// outcome, counting every call; a channel sending faster than relay_log { per_channel } a second
// gets at most that many rows a second, the rest counted; a send's "to" longer than a phone
// number is not stored. After the flood, the flooded channel's list (GET
// /channels/{id}/messages, ?status=accepted) and dashboard page answer right, and what their
// reads, and another org's, cost is bounded: rows read, from EXPLAIN ANALYZE of the statements
// the handlers run (testenv.ReadCost), not times.
func TestRelayLogRefusalFlood(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	origin := e.caddySite("", "relay_log {\n\t\t\tinterval 50ms\n\t\t\tper_channel 5\n\t\t}", e.fake.URL(), `handle_path `+proxyPrefix+`/* {
		wabarelay_proxy {
			rate_limit 3 1h
		}
	}
	handle_path /fast/* {
		wabarelay_proxy {
			rate_limit 100000 1m
		}
	}
	handle_path /v1/* {
		wabarelay_api
	}
	handle /dashboard* {
		wabarelay_dashboard
	}
	handle /metrics {
		metrics
	}`)
	ctx := context.Background()
	ch := e.channelOn(true, pnid)
	fast := e.channelOn(true, pnid3)
	otherOrg := e.fix.Org(t).ID
	other := e.fix.Channel(t, otherOrg, &testenv.ChannelOpts{Connection: connection(pnid2)})
	_, key := e.fix.APIKey(t, e.org)
	_, otherKey := e.fix.APIKey(t, otherOrg)
	send := func(base string, channel store.Channel, number, to, idemKey string) relayResp {
		body := `{"messaging_product":"whatsapp","to":"` + to + `","type":"text","text":{"body":"hi"}`
		if idemKey != "" {
			body += `,"idempotency_key":"` + idemKey + `"`
		}
		return call(t, "POST", base+"/"+number+"/messages", channel.ChannelToken, body+"}")
	}
	base := origin + proxyPrefix
	longKey, longTo := strings.Repeat("k", 255), strings.Repeat("9", 256)

	// The channel's three sends (its limit), one with the longest key and a 25-byte "to"; the
	// other org's two.
	for _, s := range []struct{ to, key string }{{"15551234567", ""}, {strings.Repeat("1", 25), longKey}, {"+1 (555) 765-4321", "k2"}} {
		if r := send(base, ch, pnid, s.to, s.key); r.status != 200 {
			t.Fatalf("send: %d %s", r.status, r.body)
		}
	}
	for range 2 {
		if r := send(base, other, pnid2, "15550001111", ""); r.status != 200 {
			t.Fatalf("other org's send: %d %s", r.status, r.body)
		}
	}

	// The flood: 2,000 refused calls from 8 clients, half with the longest key and "to".
	const flood = 2000
	start := time.Now()
	var wg sync.WaitGroup
	var refused atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < flood; i += 8 {
				to, k := "15551234567", ""
				if i%2 == 0 {
					to, k = longTo, longKey+"" // (a key is claimed only when the limit lets the send through)
				}
				if r := send(base, ch, pnid, to, k); r.status == http.StatusTooManyRequests {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	floodSeconds := int(time.Since(start)/time.Second) + 2 // the seconds the flood's calls can fall in
	if refused.Load() != flood {
		t.Fatalf("%d of %d calls refused 429", refused.Load(), flood)
	}

	// A channel under a high limit sending faster than per_channel (5) rows a second.
	const burst = 60
	start = time.Now()
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < burst; i += 6 {
				if r := send(origin+"/fast", fast, pnid3, "15552223333", ""); r.status != 200 {
					t.Errorf("fast send: %d %s", r.status, r.body)
				}
			}
		}()
	}
	wg.Wait()
	burstSeconds := int(time.Since(start)/time.Second) + 2

	// Every call written (rows and counts), none dropped.
	calls := 3 + 2 + flood + burst
	written := regexp.MustCompile(`(?m)^caddy_wabarelay_relay_log_written_total (\d+)$`)
	testenv.Eventually(t, testenv.Patience, func() bool {
		m := written.FindSubmatch(call(t, "GET", origin+"/metrics", "", "").body)
		return m != nil && string(m[1]) == fmt.Sprint(calls)
	}, "caddy_wabarelay_relay_log_written_total %d", calls)

	// The flooded channel: its three sends are its rows; the flood is counted, a row a second.
	logRows := e.fix.CountWhere(t, "relay_log", "channel_id", ch.ID)
	logBytes := testenv.QueryValue[int](t, e.fix, `SELECT coalesce(sum(pg_column_size(r.*)), 0)::int FROM relay_log r WHERE channel_id = $1`, ch.ID)
	var countRows, counted int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(calls), 0) FROM relay_counts
		WHERE channel_id = $1 AND outcome = 'rate_limited' AND status = 429`, ch.ID).Scan(&countRows, &counted); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d refused calls: %d relay_log rows (%d bytes) and %d relay_counts rows over %d s", flood, logRows, logBytes, countRows, floodSeconds)
	if logRows != 3 {
		t.Fatalf("%d relay_log rows for the flooded channel, want its 3 sends", logRows)
	}
	if counted != flood || countRows > floodSeconds {
		t.Fatalf("relay_counts: %d refusals in %d rows, want %d in at most one a second (%d)", counted, countRows, flood, floodSeconds)
	}
	if n := e.fix.CountWhere(t, "relay_counts", "channel_id", ch.ID); n != countRows {
		t.Fatalf("%d relay_counts rows for the flooded channel, want the flood's %d alone", n, countRows)
	}
	var stored []string
	rows, err := e.pool.Query(ctx, `SELECT coalesce(length(idempotency_key), 0) || ' ' || coalesce(recipient, 'null') FROM relay_log
		WHERE channel_id = $1 ORDER BY at`, ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{"0 15551234567", "255 null", "2 +1 (555) 765-4321"}; !slices.Equal(stored, want) {
		t.Fatalf("stored key lengths and recipients %q, want %q", stored, want)
	}

	// The fast channel: at most per_channel rows a second, the rest counted as ok.
	fastRows := e.fix.CountWhere(t, "relay_log", "channel_id", fast.ID)
	fastCounted := testenv.QueryValue[int](t, e.fix, `SELECT coalesce(sum(calls), 0)::int FROM relay_counts WHERE channel_id = $1 AND outcome = 'ok'`, fast.ID)
	t.Logf("%d sends in under %d s: %d relay_log rows, %d counted", burst, burstSeconds, fastRows, fastCounted)
	if fastRows > 5*burstSeconds || fastRows+fastCounted != burst {
		t.Fatalf("%d sends: %d rows (at most 5 a second over %d s) and %d counted", burst, fastRows, burstSeconds, fastCounted)
	}

	// The reads answer right: the flooded channel's sends, accepted (no status came yet), and
	// its page with the flood in its chart; the other org's list.
	list := func(channel store.Channel, key, query string) []map[string]any {
		t.Helper()
		r := apiCall(t, "GET", origin+"/v1/channels/"+channel.ID.String()+"/messages"+query, key, "")
		var out []map[string]any
		if r.status != 200 || json.Unmarshal(r.body, &out) != nil {
			t.Fatalf("list %s%s: %d %s", channel.ID, query, r.status, r.body)
		}
		return out
	}
	if got := list(ch, key, "?status=accepted"); len(got) != 3 || got[0]["to"] != "+1 (555) 765-4321" || got[1]["idempotency_key"] != longKey {
		t.Fatalf("accepted: %v", got)
	}
	if got := list(ch, key, ""); len(got) != 3 {
		t.Fatalf("list: %d messages, want 3", len(got))
	}
	if got := list(other, otherKey, ""); len(got) != 2 || got[0]["to"] != "15550001111" {
		t.Fatalf("other org's list: %v", got)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm(origin+"/dashboard/login", url.Values{"api_key": {key}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest("GET", origin+"/dashboard/channels/"+ch.ID.String(), nil)
	for _, c := range resp.Cookies() {
		req.AddCookie(c)
	}
	page := do(t, req)
	if want := fmt.Sprintf("3 answered 2xx, 0 upstream errors, %d answered 429", flood); page.status != 200 || !strings.Contains(string(page.body), want) {
		var minutes []string
		rows, _ := e.pool.Query(ctx, `SELECT format('%s %s %s %s %s %s', minute, org_id = $2, ok, upstream_error, rate_limited, refused) FROM relay_minutes WHERE channel_id = $1`, ch.ID, e.org)
		minutes, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		t.Fatalf("channel page: %d, lacks %q: %s; relay_minutes %q", page.status, want, regexp.MustCompile(`<p class="summary">.*</p>`).Find(page.body), minutes)
	}

	// What those reads cost, as rows read: bounded by the page, not by the flood.
	pageReads := func(org uuid.UUID, channel uuid.UUID, f store.MessageFilter) func(s *store.Store) {
		return func(s *store.Store) {
			f.Limit = 51
			if _, err := s.ListMessages(ctx, org, channel, f); err != nil {
				t.Fatal(err)
			}
			if _, err := s.SendsPerMinute(ctx, org, channel, time.Now().Add(-24*time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name    string
		org     uuid.UUID
		channel uuid.UUID
		f       store.MessageFilter
	}{
		{"flooded channel's page", e.org, ch.ID, store.MessageFilter{}},
		{"flooded channel, accepted", e.org, ch.ID, store.MessageFilter{Status: "accepted"}},
		{"flooded channel, searched by key", e.org, ch.ID, store.MessageFilter{Search: "k2"}},
		{"other org's page", otherOrg, other.ID, store.MessageFilter{}},
	} {
		cost := testenv.ReadCost(t, e.dsn, pageReads(c.org, c.channel, c.f))
		total := 0.0
		for _, n := range cost {
			total += n
		}
		t.Logf("%s: %.0f rows read %v", c.name, total, cost)
		if total > 50 {
			t.Errorf("%s read %.0f rows after %d refusals (%v)", c.name, total, flood, cost)
		}
	}
}
