package managementapi_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// messagesChannel gives key A's org a connected channel (number pnid) with n outgoing messages
// "wamid.<i>" as the relay and their statuses record them: sent (relay_log) to "r<i%2>" a
// second apart from messagesBase on (wamid.0 with idempotency key "key-0"), status delivered
// for even i and read for odd ones (the messages rows their statuses made).
func (e *env) messagesChannel(pnid string, n int) managementapi.Channel {
	e.t.Helper()
	c := e.createChannel(e.keyA, "c")
	if err := e.Store.ConnectChannel(context.Background(), c.ID, store.Connection{PhoneNumberID: pnid, WabaID: "w",
		DisplayPhoneNumber: "+1 555 0100", UpstreamToken: "t"}); err != nil {
		e.t.Fatal(err)
	}
	var calls []store.RelayCall
	for i := range n {
		call := store.RelayCall{At: messagesBase.Add(time.Duration(i) * time.Second), OrgID: e.orgA, ChannelID: c.ID, Status: 200,
			Outcome: "ok", Recipient: fmt.Sprintf("r%d", i%2), WAMID: fmt.Sprintf("wamid.%d", i)}
		if i == 0 {
			call.IdempotencyKey = "key-0"
		}
		calls = append(calls, call)
	}
	if err := e.Store.WriteRelayLog(context.Background(), calls); err != nil {
		e.t.Fatal(err)
	}
	e.Exec(e.t, `
		INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank)
		SELECT 'wamid.' || i, $1, $2, 'r' || (i % 2), $4::timestamptz + i * interval '1 second',
		       CASE WHEN i % 2 = 0 THEN 'delivered' ELSE 'read' END, 2 + i % 2
		FROM generate_series(0, $3 - 1) i`, e.orgA, c.ID, n, messagesBase)
	return c
}

// messagesBase is when messagesChannel's first message was sent: within the relay log's
// partitions.
var messagesBase = time.Now().UTC().Add(-time.Hour).Truncate(time.Second)

// TestMessagesEndpoint: GET /channels/{id}/messages pages newest first with the next page in a
// Link header (carrying the filters), filters by status and recipient, refuses bad parameters
// with 422 and another org's channel with 404.
func TestMessagesEndpoint(t *testing.T) {
	e := newEnv(t)
	c := e.messagesChannel("555", 5)
	base := "/channels/" + c.ID.String() + "/messages"

	var page []managementapi.Message
	all, links := followPages[managementapi.Message](t, e, base+"?limit=2", base)
	var got []string
	for _, m := range all {
		got = append(got, m.WAMID)
	}
	if strings.Join(got, " ") != "wamid.4 wamid.3 wamid.2 wamid.1 wamid.0" || len(links) != 2 {
		t.Fatalf("pages: %v, links %v", got, links)
	}
	if links[0] != `<?cursor=wamid.3&limit=2>; rel="next"` {
		t.Errorf("Link = %s", links[0])
	}
	last := all[4]
	if last.ChannelID != c.ID || last.To == nil || *last.To != "r0" || last.Status != "delivered" || last.Error != nil ||
		last.IdempotencyKey == nil || *last.IdempotencyKey != "key-0" || !time.Time(last.CreatedAt).Equal(messagesBase) {
		t.Errorf("message: %+v", last)
	}

	r := e.do("GET", base+"?status=read&to=r1&limit=1", e.keyA, "")
	r.json(t, &page)
	if r.status != 200 || len(page) != 1 || page[0].WAMID != "wamid.3" {
		t.Fatalf("read to r1: %d %s", r.status, r.body)
	}
	link := r.header.Get("Link")
	q, _ := url.ParseQuery(strings.TrimSuffix(strings.TrimPrefix(link, "<?"), `>; rel="next"`))
	if q.Get("status") != "read" || q.Get("to") != "r1" || q.Get("cursor") != "wamid.3" || q.Get("limit") != "1" {
		t.Errorf("filtered Link = %s", link)
	}
	r = e.do("GET", base+"?status=read&to=r0", e.keyA, "")
	if r.json(t, &page); len(page) != 0 || r.header.Get("Link") != "" || strings.TrimSpace(string(r.body)) != "[]" {
		t.Errorf("no match: %s (Link %q)", r.body, r.header.Get("Link"))
	}

	for query, msg := range map[string]string{
		"status=bogus":  `"status" must be one of: accepted, sent, delivered, read, failed`,
		"status=queued": `"status" must be one of: accepted, sent, delivered, read, failed`,
		"limit=0":       `"limit" must be an integer from 1 to 100`,
		"limit=101":     `"limit" must be an integer from 1 to 100`,
		"limit=x":       `"limit" must be an integer from 1 to 100`,
		"limit=-3":      `"limit" must be an integer from 1 to 100`,
		"cursor=nope":   `"cursor" is invalid`,
		"cursor=%00":    `"cursor" is invalid`,
		"to=%FF":        `"to" must be valid UTF-8 text without NUL characters`,
		"to=a%00":       `"to" must be valid UTF-8 text without NUL characters`,
	} {
		expectError(t, e.do("GET", base+"?"+query, e.keyA, ""), 422, msg)
	}
	// the status is checked before the limit, as the delivery log's
	expectError(t, e.do("GET", base+"?limit=0&status=x", e.keyA, ""), 422, `"status" must be one of: accepted, sent, delivered, read, failed`)
	// another org's channel, an unknown one, not a UUID: 404, whatever the query
	expectError(t, e.do("GET", base, e.keyB, ""), 404, "Channel not found")
	expectError(t, e.do("GET", "/channels/"+strings.Repeat("0", 8)+"-0000-0000-0000-000000000000/messages", e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("GET", "/channels/nope/messages?limit=0", e.keyA, ""), 404, "Channel not found")

	// The dashboard's search (not an API parameter): wamid, recipient or idempotency key.
	p := managementapi.Principal{Key: store.APIKey{OrgID: e.orgA}}
	svc := managementapi.NewService(managementapi.Options{Store: e.Store})
	for search, want := range map[string]int{"wamid.2": 1, "r1": 2, "key-0": 1, "zzz": 0} {
		ms, _, err := svc.ListMessages(context.Background(), p, c.ID.String(), managementapi.MessageQuery{Search: search})
		if err != nil || len(ms) != want {
			t.Errorf("search %q: %d messages, %v; want %d", search, len(ms), err, want)
		}
	}
}

// TestMessageEndpoint: GET /messages/{wamid} answers a message's timeline (a wamid holding "/",
// "+" and "=" included), and 404 Message not found for an unknown id or another org's.
func TestMessageEndpoint(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.messagesChannel("555", 0)
	wh := e.createWebhook(e.keyA, `{"name":"W","url":"https://h.example.com","events":["message_status"]}`)
	const w = "wamid.HBgL/MTY1+MDM4=="
	if err := e.Store.WriteRelayLog(ctx, []store.RelayCall{{At: messagesBase, OrgID: e.orgA, ChannelID: c.ID, Status: 200, Outcome: "ok",
		Latency: 1500 * time.Microsecond, IdempotencyKey: "k1", Recipient: "15551234567", WAMID: w}}); err != nil {
		t.Fatal(err)
	}
	body := `{"object":"whatsapp_business_account","entry":[{"id":"w","changes":[{"field":"messages","value":{"metadata":{"phone_number_id":"555"},
		"statuses":[{"id":"` + w + `","status":"failed","timestamp":"1893456005","recipient_id":"15551234567","errors":[{"code":131026,"title":"Message undeliverable."}]},
		            {"id":"` + w + `","status":"sent","timestamp":"1893456001","recipient_id":"15551234567"}]}}]}]}`
	b, err := inbound.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Store.StoreEvents(ctx, b.Items, store.Claim{}); err != nil {
		t.Fatal(err)
	}

	path := "/messages/" + url.PathEscape(w)
	r := e.do("GET", path, e.keyA, "")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var tl managementapi.Timeline
	r.json(t, &tl)
	if tl.WAMID != w || tl.ChannelID != c.ID || tl.Direction != "outgoing" || tl.Status != "failed" || tl.To == nil || *tl.To != "15551234567" ||
		tl.From == nil || *tl.From != "+1 555 0100" || tl.Error == nil || tl.Error.Code != 131026 || tl.Error.Title != "Message undeliverable." {
		t.Errorf("timeline: %s", r.body)
	}
	if rc := tl.RelayCall; rc == nil || rc.Status != 200 || rc.LatencyMS != 1.5 || rc.IdempotencyKey == nil || *rc.IdempotencyKey != "k1" || rc.Replayed ||
		!time.Time(rc.At).Equal(messagesBase) {
		t.Errorf("relay call: %s", r.body)
	}
	if len(tl.Statuses) != 2 || tl.Statuses[0].Status != "sent" || tl.Statuses[0].Error != nil || tl.Statuses[1].Status != "failed" ||
		tl.Statuses[1].Error == nil || tl.Statuses[1].Timestamp == nil || time.Time(*tl.Statuses[1].Timestamp).Unix() != 1893456005 {
		t.Errorf("statuses: %s", r.body)
	}
	if len(tl.Deliveries) != 2 || tl.Deliveries[0].WebhookID.String() != wh.ID || tl.Deliveries[0].Type != "message_status" || tl.Deliveries[0].Status != "pending" {
		t.Errorf("deliveries: %s", r.body)
	}
	// the slash sent as is names the same message (outside the OpenAPI check: its router takes a
	// path parameter as one segment)
	rec := httptest.NewRecorder()
	e.handler.ServeHTTP(rec, e.newRequest("GET", "/messages/"+strings.ReplaceAll(url.PathEscape(w), "%2F", "/"), e.keyA, ""))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"wamid":"wamid.HBgL/MTY1+MDM4=="`) {
		t.Errorf("slash as is: %d %s", rec.Code, rec.Body)
	}
	expectError(t, e.do("GET", path, e.keyB, ""), 404, managementapi.MsgMessageNotFound)
	expectError(t, e.do("GET", "/messages/wamid.unknown", e.keyA, ""), 404, "Message not found")
	expectError(t, e.do("GET", "/messages/%FF%00", e.keyA, ""), 404, "Message not found")
	expectError(t, e.do("GET", "/messages/"+strings.Repeat("x", 2000), e.keyA, ""), 404, "Message not found")
	if r := e.do("POST", path, e.keyA, "{}"); r.status != 405 {
		t.Errorf("POST: %d", r.status)
	}
}
