package e2e

import (
	"bytes"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestMessageTimelineEndToEnd follows sends from the caller to the receivers and back to the
// API, on the repo's Caddyfile as `make run` runs it: a send with an idempotency key goes
// through the relay to the fake upstream, whose status webhooks come back out of order (read,
// then delivered, then sent) through the inbound endpoint and are delivered to two webhooks; the
// caller's retry is replayed. A second send, to a recipient the upstream cannot reach, is
// accepted and then fails with 131026. GET /v1/messages/{wamid} answers each field of both
// stories, and GET /v1/channels/{id}/messages lists them with their latest status.
func TestMessageTimelineEndToEnd(t *testing.T) {
	t.Parallel()
	w := startDemo(t, fakegraph.WithStatusOrder("read", "delivered", "sent"))
	ch, su := w.connectChannel(t, "Support line")
	var hooks []string
	for _, name := range []string{"one", "two"} {
		r := w.api("POST", "/webhooks", `{"name":"`+name+`","url":"`+w.recv.URL+"/"+name+`","events":["messages","message_status"]}`)
		var wh struct{ ID string }
		if r.status != 201 || json.Unmarshal(r.body, &wh) != nil {
			t.Fatalf("create webhook %s: %d %s", name, r.status, r.body)
		}
		hooks = append(hooks, wh.ID)
	}
	slices.Sort(hooks)

	sendURL := w.origin + "/upstream-proxy/" + su.PhoneNumberID + "/messages"
	send := func(to, key string) relayResp {
		t.Helper()
		return call(t, "POST", sendURL, ch.ChannelToken,
			`{"messaging_product":"whatsapp","to":"`+to+`","type":"text","text":{"body":"Your order shipped"},"idempotency_key":"`+key+`"}`)
	}
	wamidOf := func(r relayResp) string {
		t.Helper()
		var sent struct {
			Messages []struct{ ID string } `json:"messages"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &sent) != nil || len(sent.Messages) != 1 {
			t.Fatalf("send: %d %s", r.status, r.body)
		}
		return sent.Messages[0].ID
	}
	before := time.Now()
	okID := wamidOf(send("16505551234", "order-1"))
	retry := send("16505551234", "order-1") // the caller's retry: one upstream send
	if retry.header.Get("Idempotent-Replayed") != "true" || wamidOf(retry) != okID {
		t.Fatalf("retry not replayed: %v %s", retry.header, retry.body)
	}
	failID := wamidOf(send(fakegraph.UndeliverableRecipient, "order-2"))
	if n := len(w.fake.RequestsTo("POST", "/"+su.PhoneNumberID+"/messages")); n != 2 {
		t.Fatalf("the upstream got %d sends, want 2", n)
	}

	get := func(wamid string) timelineJSON {
		t.Helper()
		r := w.api("GET", "/messages/"+url.PathEscape(wamid), "")
		var tl timelineJSON
		switch {
		case r.status == 404: // not yet: the relay log is written in batches, statuses come later
		case r.status != 200 || json.Unmarshal(r.body, &tl) != nil:
			t.Fatalf("GET /messages/%s: %d %s", wamid, r.status, r.body)
		}
		return tl
	}
	delivered := func(tl timelineJSON, n int) bool {
		if len(tl.Deliveries) != n || tl.RelayCall == nil {
			return false
		}
		for _, d := range tl.Deliveries {
			if d.Status != "delivered" {
				return false
			}
		}
		return true
	}

	// The delivered message: three statuses posted read, delivered, sent; each delivered once to
	// each webhook; the latest status stays read.
	var tl timelineJSON
	// (the retry's row too: the relay log writes in batches, and the call's record can land in
	// one batch and its replay's in the next; CI once read the timeline between the two)
	testenv.Eventually(t, time.Minute, func() bool {
		tl = get(okID)
		return delivered(tl, 6) && bytes.Contains(*tl.RelayCall, []byte(`"replayed":true`))
	}, "the send's relay call and its replay logged, and its three status events delivered to both webhooks")
	if tl.WAMID != okID || tl.ChannelID != ch.ID || tl.Direction != "outgoing" || tl.Status != "read" || tl.Error != nil {
		t.Errorf("timeline: %+v", tl)
	}
	if tl.To == nil || *tl.To != "16505551234" {
		t.Errorf("to: %v", tl.To)
	}
	var call struct {
		At             time.Time `json:"at"`
		Status         int       `json:"status"`
		LatencyMS      *float64  `json:"latency_ms"`
		IdempotencyKey *string   `json:"idempotency_key"`
		Replayed       bool      `json:"replayed"`
	}
	if err := json.Unmarshal(*tl.RelayCall, &call); err != nil {
		t.Fatalf("relay_call: %s", *tl.RelayCall)
	}
	if call.Status != 200 || call.IdempotencyKey == nil || *call.IdempotencyKey != "order-1" || !call.Replayed ||
		call.LatencyMS == nil || *call.LatencyMS < 0 || call.At.Before(before.Add(-time.Second)) || call.At.After(time.Now()) {
		t.Errorf("relay_call: %s", *tl.RelayCall)
	}
	var order []string
	var last time.Time
	for _, s := range tl.Statuses {
		order = append(order, s["status"].(string))
		ts, err := time.Parse(time.RFC3339, s["timestamp"].(string))
		if err != nil || ts.Before(last) || s["error"] != nil {
			t.Errorf("status %v", s)
		}
		last = ts
	}
	if !slices.Equal(order, []string{"sent", "delivered", "read"}) {
		t.Errorf("statuses in upstream order: %v", order)
	}
	perHook := map[string][]string{}
	for _, d := range tl.Deliveries {
		if d.Type != "message_status" || d.Attempts != 1 {
			t.Errorf("delivery %+v", d)
		}
		perHook[d.WebhookID] = append(perHook[d.WebhookID], d.EventID)
	}
	if got := slices.Sorted(func(yield func(string) bool) {
		for id := range perHook {
			if !yield(id) {
				return
			}
		}
	}); !slices.Equal(got, hooks) {
		t.Errorf("deliveries to webhooks %v, want %v", got, hooks)
	}
	a, b := slices.Sorted(slices.Values(perHook[hooks[0]])), slices.Sorted(slices.Values(perHook[hooks[1]]))
	if len(a) != 3 || !slices.Equal(a, b) || len(slices.Compact(slices.Clone(a))) != 3 {
		t.Errorf("each status event once to each webhook: %v", perHook)
	}
	// the receivers got exactly those events
	for _, id := range a {
		if n := w.recv.PerEvent()[id]; n != 2 {
			t.Errorf("event %s received %d times, want once per webhook", id, n)
		}
	}

	// The undeliverable one: accepted, then failed with 131026 (final).
	testenv.Eventually(t, time.Minute, func() bool { tl = get(failID); return delivered(tl, 2) },
		"the failed status delivered to both webhooks")
	var failErr struct {
		Code  int    `json:"code"`
		Title string `json:"title"`
	}
	if tl.Status != "failed" || tl.Error == nil || json.Unmarshal(*tl.Error, &failErr) != nil || failErr.Code != 131026 ||
		failErr.Title != "Message undeliverable" || len(tl.Statuses) != 1 || tl.Statuses[0]["status"] != "failed" {
		t.Errorf("failed timeline: %+v (error %s)", tl, rawOr(tl.Error))
	}

	// The channel's list: newest first, latest statuses, filters.
	list := func(query string) []map[string]any {
		t.Helper()
		r := w.api("GET", "/channels/"+ch.ID+"/messages"+query, "")
		var items []map[string]any
		if r.status != 200 || json.Unmarshal(r.body, &items) != nil {
			t.Fatalf("list%s: %d %s", query, r.status, r.body)
		}
		return items
	}
	// A status that came before its send's relay log row listed the message at the status's
	// time (to the second) until the writer settled it with the call's time (within two of its
	// intervals): then the sends are in the order they were made, the second first.
	var all []map[string]any
	testenv.Eventually(t, 30*time.Second, func() bool {
		all = list("")
		return len(all) == 2 && all[0]["wamid"] == failID
	}, "the list in the order of the sends")
	if len(all) != 2 || all[0]["wamid"] != failID || all[1]["wamid"] != okID || all[1]["status"] != "read" ||
		all[1]["idempotency_key"] != "order-1" || all[1]["to"] != "16505551234" || all[1]["error"] != nil || all[0]["status"] != "failed" {
		t.Errorf("list: %v", all)
	}
	if got := list("?status=failed"); len(got) != 1 || got[0]["wamid"] != failID {
		t.Errorf("?status=failed: %v", got)
	}
	if got := list("?to=16505551234"); len(got) != 1 || got[0]["wamid"] != okID {
		t.Errorf("?to=: %v", got)
	}
	if strings.Contains(okID, "/") {
		// the unescaped path reaches the same message (a wamid is base64 and may hold "/")
		if r := w.api("GET", "/messages/"+okID, ""); r.status != 200 {
			t.Errorf("unescaped wamid path: %d %s", r.status, r.body)
		}
	}
}

func rawOr(m *json.RawMessage) string {
	if m == nil {
		return "null"
	}
	return string(*m)
}
