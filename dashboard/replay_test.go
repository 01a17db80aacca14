package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestReplayForm: the webhook page's Replay form queues the stored events of the window that
// the webhook covers (events from before it existed) and says how many; the kinds ticked narrow
// it; the API's refusals are shown with their status.
func TestReplayForm(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	ctx := context.Background()
	e.Channel(t, e.org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "4242", WabaID: "w", UpstreamToken: "t"}})
	var items []store.IncomingItem
	for _, k := range []string{"m:1", "m:2", "s:1:sent"} {
		typ := "messages"
		if k[0] == 's' {
			typ = "message_status"
		}
		items = append(items, store.IncomingItem{Type: typ, PhoneNumberID: "4242", DedupeKey: k, Data: json.RawMessage(`{}`)})
	}
	if _, err := e.Store.StoreEvents(ctx, items, store.Claim{}); err != nil {
		t.Fatal(err)
	}
	wh, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hook", &testenv.WebhookOpts{Events: []string{"messages", "message_status"}})
	page := "/dashboard/webhooks/" + wh.ID.String()
	wantStatus(t, c.get(page), http.StatusOK, `action="/dashboard/webhooks/`+wh.ID.String()+`/replay"`, `name="types" value="message_status"`)

	since := time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04")
	wantStatus(t, c.post(page+"/replay", url.Values{"since": {since}, "types": {"messages"}}), http.StatusOK, "2 events queued.")
	// the window again, every kind: the two messages have their deliveries queued already
	wantStatus(t, c.post(page+"/replay", url.Values{"since": {since}}), http.StatusOK, "1 event queued.")
	wantStatus(t, c.post(page+"/replay", url.Values{"since": {since}}), http.StatusOK, "No events queued: every event")
	if n := e.CountWhere(t, "delivery_queue", "webhook_id", wh.ID); n != 3 {
		t.Fatalf("%d deliveries queued, want 3", n)
	}
	wantStatus(t, c.post(page+"/replay", url.Values{"since": {"yesterday"}}), http.StatusUnprocessableEntity, "must be times such as")
	wantStatus(t, c.post(page+"/replay", url.Values{"since": {time.Now().UTC().AddDate(0, 0, -8).Format("2006-01-02T15:04")}}),
		http.StatusUnprocessableEntity, "must be at most 7 days after")
	wantStatus(t, c.post(page+"/replay", url.Values{"since": {since}, "types": {"bogus"}}), http.StatusUnprocessableEntity, "values must be one of")
	owh, _ := e.Webhook(t, e.Org(t, &testenv.OrgOpts{Name: "Other"}).ID, "https://x.example", &testenv.WebhookOpts{Name: "theirs"})
	wantStatus(t, c.post("/dashboard/webhooks/"+owh.ID.String()+"/replay", url.Values{"since": {since}}), http.StatusNotFound)
	if n := e.Count(t, "delivery_queue"); n != 3 {
		t.Fatalf("refused replays queued deliveries: %d in the queue, want 3", n)
	}
}
