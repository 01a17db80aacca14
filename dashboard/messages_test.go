package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// sentMessage is an outgoing message as the relay log's writer records it (a messages row),
// with the statuses the upstream then reports.
type sentMessage struct {
	wamid, to, key string
	at             time.Time // the relay call
	latencyMS      int
	replayed       bool
	// statuses reported, in order, each a second after the one before (the first a second
	// after the call); the last one is the message's latest status.
	statuses []string
	// errCode, errTitle: the failed status's errors[0]
	errCode  int
	errTitle string
}

// seedMessage records m on channel ch (connected as phone number id pn) of org through the real
// paths: its relay call through the relay log's write (a relay_log row and the messages row),
// each status through the inbound path (store.StoreEvents: the event, its deliveries to the
// org's webhooks, the message's latest status). It returns the time of the last status.
func seedMessage(t *testing.T, e *env, org, ch uuid.UUID, pn string, m sentMessage) time.Time {
	t.Helper()
	ctx := context.Background()
	outcome := "ok"
	if m.replayed {
		outcome = "replayed"
	}
	if err := e.Store.WriteRelayLog(ctx, []store.RelayCall{{At: m.at, OrgID: org, ChannelID: ch, Status: 200, Outcome: outcome,
		Latency: time.Duration(m.latencyMS) * time.Millisecond, IdempotencyKey: m.key, Replayed: m.replayed, Recipient: m.to, WAMID: m.wamid}}); err != nil {
		t.Fatal(err)
	}
	at := m.at
	for _, st := range m.statuses {
		at = at.Add(time.Second)
		status := map[string]any{"id": m.wamid, "status": st, "timestamp": fmt.Sprint(at.Unix()), "recipient_id": strings.TrimPrefix(m.to, "+")}
		if st == "failed" {
			status["errors"] = []map[string]any{{"code": m.errCode, "title": m.errTitle}}
		}
		upstreamWebhook(t, e, pn, "statuses", status)
	}
	return at
}

// upstreamWebhook stores what the upstream's webhook for phone number id pn says, one item of
// value's list (statuses or messages), through the inbound path: inbound.Parse, then
// store.StoreEvents.
func upstreamWebhook(t *testing.T, e *env, pn, list string, item any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"object": "whatsapp_business_account", "entry": []any{map[string]any{
		"id": "2001", "changes": []any{map[string]any{"field": "messages", "value": map[string]any{
			"messaging_product": "whatsapp", "metadata": map[string]any{"phone_number_id": pn}, list: []any{item}}}}}}})
	b, err := inbound.Parse(body)
	if err != nil || len(b.Items) != 1 {
		t.Fatalf("parse: %d items, %v", len(b.Items), err)
	}
	if _, err := e.Store.StoreEvents(context.Background(), b.Items, store.Claim{}); err != nil {
		t.Fatal(err)
	}
}

// seedRelayLog records n relay calls on channel ch of org at time at, with this status, outcome
// and upstream error code, through the relay log's write (store.WriteRelayLog: rows, counts and
// the per-minute counts the chart reads).
func seedRelayLog(t *testing.T, e *env, org, ch uuid.UUID, at time.Time, status, outcome string, code, n int) {
	t.Helper()
	st, err := strconv.Atoi(status)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh database has the partitions of yesterday on (store.Migrate): a call seeded
	// further back (the -25 h one, between 00:00 and 01:00 UTC) needs its day made.
	if err := e.Store.EnsurePartitions(context.Background(), at, at); err != nil {
		t.Fatal(err)
	}
	calls := make([]store.RelayCall, n)
	for i := range calls {
		calls[i] = store.RelayCall{At: at, OrgID: org, ChannelID: ch, Status: st, Outcome: outcome, ErrorCode: code, Latency: time.Millisecond}
	}
	if err := e.Store.WriteRelayLog(context.Background(), calls); err != nil {
		t.Fatal(err)
	}
}

// messagesEnv is an org with an active channel and a webhook taking its statuses, and its
// messages: delivered, failed outside the 24-hour window, read; another org with its own
// channel and message.
type messagesEnv struct {
	*env
	ch, other                     store.Channel
	delivered, failed, read, away sentMessage
	webhook                       store.Webhook
}

func newMessagesEnv(t *testing.T, e *env) *messagesEnv {
	t.Helper()
	m := &messagesEnv{env: e}
	m.ch = e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line"})
	makeActive(t, e, m.ch.ID)
	m.webhook, _ = e.Webhook(t, e.org.ID, "https://crm.example.com/hook", &testenv.WebhookOpts{Name: "CRM", Events: []string{"message_status"}})
	otherOrg := e.Org(t, &testenv.OrgOpts{Name: "Rival"})
	m.other = e.Channel(t, otherOrg.ID, &testenv.ChannelOpts{Name: "Rival line"})
	e.Exec(t, `UPDATE channels SET status = 'active', phone_number_id = '9009', waba_id = '9909', connected_at = now(), token_expires_at = NULL WHERE id = $1`, m.other.ID)

	now := time.Now().UTC().Truncate(time.Second)
	m.delivered = sentMessage{wamid: "wamid.HBgLMTU1NTAxMDAwMDEVAgARGBI1RjQyQzY0QkU3OEE0MDI0AA==", to: "+15550100001", key: "order-1001",
		at: now.Add(-30 * time.Minute), latencyMS: 87, statuses: []string{"sent", "delivered"}}
	m.failed = sentMessage{wamid: "wamid.HBgLMTU1NTAxMDAwMDIVAgARGBJGQUlMRUQwMDAwMDAwMDAxAA==", to: "+15550100002", key: "order-1002",
		at: now.Add(-20 * time.Minute), latencyMS: 140, statuses: []string{"failed"}, errCode: 131047, errTitle: "Re-engagement message"}
	m.read = sentMessage{wamid: "wamid.HBgLMTU1NTAxMDAwMDEVAgARGBJSRUFEMDAwMDAwMDAwMDAxAA==", to: "+15550100001",
		at: now.Add(-10 * time.Minute), latencyMS: 95, replayed: true, statuses: []string{"sent", "delivered", "read"}}
	m.away = sentMessage{wamid: "wamid.RIVAL0000000000000001", to: "+15550100001", key: "order-1001", at: now.Add(-5 * time.Minute), latencyMS: 50}
	for _, msg := range []sentMessage{m.delivered, m.failed, m.read} {
		seedMessage(t, e, e.org.ID, m.ch.ID, "1001", msg)
	}
	seedMessage(t, e, otherOrg.ID, m.other.ID, "9009", m.away)

	minute := now.Add(-15 * time.Minute)
	seedRelayLog(t, e, e.org.ID, m.ch.ID, minute, "400", "upstream_4xx", 131047, 1)
	seedRelayLog(t, e, e.org.ID, m.ch.ID, minute.Add(-time.Minute), "429", "rate_limited", 0, 2)
	seedRelayLog(t, e, e.org.ID, m.ch.ID, minute.Add(-2*time.Minute), "422", "invalid_request", 0, 1)
	seedRelayLog(t, e, otherOrg.ID, m.other.ID, minute, "200", "ok", 0, 50)
	seedRelayLog(t, e, e.org.ID, m.ch.ID, now.Add(-25*time.Hour), "200", "ok", 0, 7) // before the charts' 24 h
	return m
}

func (m *messagesEnv) channelPage(query string) string {
	p := "/dashboard/channels/" + m.ch.ID.String()
	if query != "" {
		p += "?" + query
	}
	return p
}

func messagePage(wamid string) string { return "/dashboard/messages/" + url.PathEscape(wamid) }

// listed reports which of msgs the page's message list shows.
func listed(body string, msgs ...sentMessage) []bool {
	out := make([]bool, len(msgs))
	for i, m := range msgs {
		out[i] = strings.Contains(body, `href="/dashboard/messages/`+m.wamid+`"`)
	}
	return out
}

// TestChannelPage: a channel's page lists its outgoing messages newest first with their
// status, recipient, idempotency key and the explanation of a common upstream error; the
// status filter and the search (exact wamid, recipient, idempotency key) narrow it; a filter the
// API refuses is said so; the chart's summary counts the channel's sends of the last 24 h by
// outcome; another org's channel, an unknown one and a malformed id are the not-found page.
func TestChannelPage(t *testing.T) {
	e := newEnv(t)
	m := newMessagesEnv(t, e)
	c := e.client()
	c.signIn(e.key)

	// The channels page links the channel's name to its page.
	wantStatus(t, c.get("/dashboard/channels"), http.StatusOK, `href="/dashboard/channels/`+m.ch.ID.String()+`"`)

	a := c.get(m.channelPage(""))
	wantStatus(t, a, http.StatusOK, "Channel Support line", "&#43;15550100002", "order-1001", "131047",
		"Outside the 24-hour window", "Re-engagement message")
	if got := listed(a.body, m.read, m.failed, m.delivered, m.away); fmt.Sprint(got) != "[true true true false]" {
		t.Fatalf("listed (read, failed, delivered, other org's) = %v", got)
	}
	if i, j, k := strings.Index(a.body, m.read.wamid), strings.Index(a.body, m.failed.wamid), strings.Index(a.body, m.delivered.wamid); i > j || j > k {
		t.Errorf("messages not newest first")
	}
	// The 3 messages' calls, 1 upstream error, 2 429s, 1 refusal in the last 24 h; the other
	// org's and the older ones not counted.
	wantStatus(t, a, http.StatusOK, "3 answered 2xx, 1 upstream error, 2 answered 429, 1 refused by the relay.")
	for _, class := range []string{"ok", "upstream", "limited", "refused"} {
		if !strings.Contains(a.body, `<rect class="bar `+class+`"`) {
			t.Errorf("no %s bar in the chart (2xx, upstream error, 429, refused)", class)
		}
	}

	for _, f := range []struct {
		query string
		want  string
	}{
		{"status=failed", "[false true false]"},
		{"status=read", "[true false false]"},
		{"status=delivered", "[false false true]"},
		{"status=sent", "[false false false]"},
		{"q=" + url.QueryEscape(m.failed.wamid), "[false true false]"},
		{"q=" + url.QueryEscape("+15550100001"), "[true false true]"},
		{"q=order-1001", "[false false true]"},
		{"q=order-1001&status=read", "[false false false]"},
		{"q=" + url.QueryEscape("+15550100001") + "&status=read", "[true false false]"},
		{"q=" + url.QueryEscape(m.away.wamid), "[false false false]"}, // another org's message
	} {
		a := c.get(m.channelPage(f.query))
		wantStatus(t, a, http.StatusOK)
		if got := listed(a.body, m.read, m.failed, m.delivered); fmt.Sprint(got) != f.want {
			t.Errorf("%s: listed (read, failed, delivered) = %v, want %s", f.query, got, f.want)
		}
		if f.want == "[false false false]" && !strings.Contains(a.body, "No messages match.") {
			t.Errorf("%s: no empty-state text", f.query)
		}
		if strings.Contains(a.body, "/dashboard/messages/"+m.away.wamid) {
			t.Errorf("%s: another org's message is shown", f.query)
		}
	}
	// The filter's values stay in the form.
	a = c.get(m.channelPage("status=failed&q=order-1002"))
	wantStatus(t, a, http.StatusOK, `<option value="failed" selected>`, `value="order-1002"`)

	// A status the API refuses: said so, the list unfiltered.
	a = c.get(m.channelPage("status=bogus"))
	wantStatus(t, a, http.StatusUnprocessableEntity, `class="error" role="alert"`, `&#34;status&#34; must be one of`)
	if got := listed(a.body, m.read, m.failed, m.delivered); fmt.Sprint(got) != "[true true true]" {
		t.Errorf("status=bogus: listed = %v, want every message", got)
	}

	// Not found: another org's channel, an unknown id, a malformed one.
	for _, p := range []string{"/dashboard/channels/" + m.other.ID.String(), "/dashboard/channels/" + uuid.NewString(),
		"/dashboard/channels/not-a-uuid", "/dashboard/channels/" + m.other.ID.String() + "?q=order-1001"} {
		a := c.get(p)
		wantStatus(t, a, http.StatusNotFound, "There is nothing here.")
		if strings.Contains(a.body, "Rival") || strings.Contains(a.body, m.away.wamid) {
			t.Errorf("%s shows another org's data", p)
		}
	}
}

// TestChannelPageNextPage: past a page of messages, "More messages →" leads to the next page,
// keeping the filter; the pages together list each message once.
func TestChannelPageNextPage(t *testing.T) {
	e := newEnv(t)
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Busy"})
	e.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank)
		SELECT 'wamid.bulk' || lpad(i::text, 3, '0'), $1, $2, '1555000' || (i % 2), now() - i * interval '1 second', 'sent', 1
		FROM generate_series(1, 130) i`, e.org.ID, ch.ID)
	c := e.client()
	c.signIn(e.key)
	seen := map[string]int{}
	next := "/dashboard/channels/" + ch.ID.String() + "?q=" + url.QueryEscape("+15550001")
	pages := 0
	for next != "" {
		pages++
		if pages > 5 {
			t.Fatal("more pages than messages")
		}
		a := c.get(next)
		wantStatus(t, a, http.StatusOK)
		for _, m := range regexpAll(`href="/dashboard/messages/(wamid\.bulk\d+)"`, a.body) {
			seen[m]++
		}
		next = ""
		if m := regexpAll(`<a href="([^"]+)" rel="next">More messages`, a.body); len(m) == 1 {
			next = strings.ReplaceAll(m[0], "&amp;", "&")
			if !strings.Contains(next, "q=%2B15550001") {
				t.Errorf("the next page's link %s drops the search", next)
			}
		}
	}
	if len(seen) != 65 || pages != 2 {
		t.Fatalf("%d messages over %d pages, want the 65 to +15550001 over 2", len(seen), pages)
	}
	for w, n := range seen {
		if n != 1 {
			t.Errorf("%s listed %d times", w, n)
		}
	}
}

// TestMessagePage: a message's page shows its timeline — the relay call (status, latency,
// replayed), then each status with its time and the time since the step before, a failure's
// code, title and explanation — and its deliveries to the org's webhooks; an incoming message
// shows when it was received; another org's message and an unknown wamid are the not-found page.
func TestMessagePage(t *testing.T) {
	e := newEnv(t)
	m := newMessagesEnv(t, e)
	c := e.client()
	c.signIn(e.key)

	a := c.get(m.channelPage(""))
	wantStatus(t, a, http.StatusOK, `href="`+messagePage(m.failed.wamid)+`"`)

	a = c.get(messagePage(m.failed.wamid))
	wantStatus(t, a, http.StatusOK, m.failed.wamid, "Support line", "&#43;15550100002", "order-1002",
		"HTTP 200", "140 ms", "131047", "Re-engagement message", "Outside the 24-hour window",
		"CRM", "message_status")
	steps := regexpAll(`<li class="step ([a-z]+)">`, a.body)
	if strings.Join(steps, ",") != "relay,failed" {
		t.Errorf("steps = %v, want relay, failed", steps)
	}

	a = c.get(messagePage(m.read.wamid))
	wantStatus(t, a, http.StatusOK, "replayed", "95 ms")
	steps = regexpAll(`<li class="step ([a-z]+)">`, a.body)
	if strings.Join(steps, ",") != "relay,sent,delivered,read" {
		t.Errorf("steps = %v, want relay, sent, delivered, read", steps)
	}
	if since := regexpAll(`<span class="since"[^>]*>([^<]+)</span>`, a.body); strings.Join(since, ",") != "+1.0 s,+1.0 s,+1.0 s" {
		t.Errorf("times since the step before = %v", since)
	}
	if n := strings.Count(a.body, `<li class="delivery">`); n != 3 {
		t.Errorf("%d deliveries shown, want one per status", n)
	}

	// An incoming message: received, no relay call, no statuses; the webhook takes statuses only.
	in := "wamid.INCOMING0000000000000001"
	upstreamWebhook(t, e, "1001", "messages", map[string]any{"id": in, "from": "15550100009", "type": "text",
		"timestamp": fmt.Sprint(time.Now().Unix()), "text": map[string]any{"body": "hi"}})
	a = c.get(messagePage(in))
	wantStatus(t, a, http.StatusOK, "incoming", "received", "15550100009", "No deliveries")
	if steps := regexpAll(`<li class="step ([a-z]+)">`, a.body); strings.Join(steps, ",") != "received" {
		t.Errorf("incoming steps = %v, want received", steps)
	}

	for _, w := range []string{m.away.wamid, "wamid.nope", "x"} {
		a := c.get(messagePage(w))
		wantStatus(t, a, http.StatusNotFound, "There is nothing here.")
		if strings.Contains(a.body, "Rival") {
			t.Errorf("%s shows another org's data", w)
		}
	}
}

// regexpAll returns the first group of each match of expr in s.
func regexpAll(expr, s string) []string {
	var out []string
	for _, m := range regexp.MustCompile(expr).FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}
