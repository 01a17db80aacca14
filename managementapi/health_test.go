package managementapi_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestChannelHealthObject: every channel object carries "health" — all null before the first
// read, the upstream's strings and checked_at after it — in list, get and create; the history
// is the org's own.
func TestChannelHealthObject(t *testing.T) {
	f := testenv.NewStore(t)
	clk := clock.NewStub(time.Now())
	f.Store.SetClock(clk)
	e := newEnvOn(t, f)
	ctx := context.Background()

	r := e.do("POST", "/channels", e.keyA, `{"name":"Sales"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	wantNull := map[string]any{"quality_rating": nil, "messaging_limit": nil, "throughput": nil, "name_status": nil, "checked_at": nil}
	h, _ := r.object(t)["health"].(map[string]any)
	if fmt.Sprint(h) != fmt.Sprint(wantNull) {
		t.Fatalf("health at create: %v (body %s)", h, r.body)
	}
	id := r.object(t)["id"].(string)
	ch, err := e.Store.GetChannel(ctx, e.orgA, uuid.MustParse(id))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Store.ConnectChannel(ctx, ch.ID, store.Connection{PhoneNumberID: "106540352242922", WabaID: "waba", UpstreamToken: "tok"}); err != nil {
		t.Fatal(err)
	}
	reads, err := e.Store.ClaimHealthReads(ctx, 10, time.Minute)
	if err != nil || len(reads) != 1 {
		t.Fatalf("claim: %v %v", reads, err)
	}
	q, lim, tp, ns := "YELLOW", "TIER_2K", "STANDARD", "APPROVED"
	if _, err := e.Store.RecordHealthRead(ctx, reads[0], store.ChannelHealth{QualityRating: &q, MessagingLimit: &lim, Throughput: &tp, NameStatus: &ns}, time.Hour); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint(map[string]any{"quality_rating": "YELLOW", "messaging_limit": "TIER_2K", "throughput": "STANDARD",
		"name_status": "APPROVED", "checked_at": clk.Now().UTC().Format("2006-01-02T15:04:05.000Z")})
	got := e.do("GET", "/channels/"+id, e.keyA, "")
	if h, _ := got.object(t)["health"].(map[string]any); got.status != 200 || fmt.Sprint(h) != want {
		t.Fatalf("get: %d health %v, want %s", got.status, h, want)
	}
	var list []map[string]any
	l := e.do("GET", "/channels", e.keyA, "")
	l.json(t, &list)
	if len(list) != 1 || fmt.Sprint(list[0]["health"]) != want {
		t.Fatalf("list: %s", l.body)
	}
	expectError(t, e.do("GET", "/channels/"+id, e.keyB, ""), 404, "Channel not found")
}

// TestWebhookEventsChannelHealth: a webhook may subscribe to channel_health; an unknown kind is
// refused with the message that lists it.
func TestWebhookEventsChannelHealth(t *testing.T) {
	e := newEnv(t)
	w := e.createWebhook(e.keyA, `{"name":"n","url":"https://h.example.com","events":["channel_health","messages"]}`)
	if fmt.Sprint(w.Events) != "[channel_health messages]" {
		t.Fatalf("events %v", w.Events)
	}
	expectError(t, e.do("POST", "/webhooks", e.keyA, `{"name":"n","url":"https://h.example.com","events":["channel_healths"]}`), 422,
		`"events" values must be one of: messages, message_status, channel_status, message_template_status_update, channel_health`)
}
