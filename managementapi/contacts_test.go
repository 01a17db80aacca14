package managementapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// TestContactEndpoint: GET /channels/{id}/contacts/{wa_id} through the handler, validated
// against docs/openapi.yaml: the three windows and their fields (on a stub clock, to the
// second), wa_id normalised ('+', spaces, dashes) and refused otherwise (422), another org's,
// an unknown or a deleted channel 404.
func TestContactEndpoint(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.createChannel(e.keyA, "c")
	if err := e.Store.ConnectChannel(ctx, c.ID, store.Connection{PhoneNumberID: "555", WabaID: "w", UpstreamToken: "t"}); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewStub(time.Now())
	e.Store.SetClock(clk)
	now := clk.Now().Truncate(time.Second)
	sent := now.Add(-time.Hour)
	if _, err := e.Store.StoreEvents(ctx, []store.IncomingItem{{Type: "messages", PhoneNumberID: "555", DedupeKey: "m:1",
		Customer: "15550100", WAMID: "wamid.1", Sent: sent, Data: json.RawMessage(`{}`)}}, store.Claim{}); err != nil {
		t.Fatal(err)
	}
	base := "/channels/" + c.ID.String() + "/contacts/"
	get := func(waID string) (managementapi.Contact, map[string]any) {
		t.Helper()
		r := e.do("GET", base+waID, e.keyA, "")
		if r.status != 200 {
			t.Fatalf("GET %s: %d %s", waID, r.status, r.body)
		}
		var out managementapi.Contact
		r.json(t, &out)
		return out, r.object(t)
	}
	ts := func(tm time.Time) string { return tm.UTC().Format(managementapi.TimeLayout) }

	// open, whatever the spelling of the number
	for _, wa := range []string{"15550100", "+15550100", "+1%20555-0100", "1-555-0100"} {
		out, raw := get(wa)
		if out.WAID != "15550100" || out.ChannelID != c.ID || out.Window != "open" ||
			raw["last_inbound_at"] != ts(sent) || raw["window_expires_at"] != ts(sent.Add(24*time.Hour)) {
			t.Fatalf("%s: %+v %v", wa, out, raw)
		}
	}
	// closed at last_inbound_at + 24 h exactly (open a second before)
	clk.Set(sent.Add(24*time.Hour - time.Second))
	if out, _ := get("15550100"); out.Window != "open" {
		t.Fatalf("a second before the end: %s", out.Window)
	}
	clk.Set(sent.Add(24 * time.Hour))
	if out, raw := get("15550100"); out.Window != "closed" || raw["window_expires_at"] != ts(sent.Add(24*time.Hour)) {
		t.Fatalf("at the end: %+v", raw)
	}
	// never heard from: unknown while the channel has been receiving less than 24 h, closed after
	out, raw := get("15550199")
	if out.Window != "unknown" || raw["last_inbound_at"] != nil || raw["window_expires_at"] != nil {
		t.Fatalf("a new channel's unknown customer: %v", raw)
	}
	e.Exec(t, `UPDATE channels SET connected_at = $2, contacts_since = $2 WHERE id = $1`, c.ID, clk.Now().Add(-24*time.Hour))
	if out, raw := get("15550199"); out.Window != "closed" || raw["last_inbound_at"] != nil || raw["window_expires_at"] != nil {
		t.Fatalf("receiving for 24 h, nothing from the customer: %v", raw)
	}
	e.Exec(t, `UPDATE channels SET contacts_since = $2 WHERE id = $1`, c.ID, clk.Now().Add(-24*time.Hour+time.Second))
	if out, _ := get("15550199"); out.Window != "unknown" {
		t.Fatalf("recorded for 24 h minus a second: %s", out.Window)
	}

	for _, bad := range []string{"1555a0100", "user.abc", "%2B", "1555.0100", "(555)0100", strings.Repeat("1", 33)} {
		expectError(t, e.do("GET", base+bad, e.keyA, ""), 422, "Invalid wa_id")
	}
	expectError(t, e.do("GET", base+"15550100", e.keyB, ""), 404, "Channel not found")
	expectError(t, e.do("GET", "/channels/00000000-0000-0000-0000-000000000000/contacts/15550100", e.keyA, ""), 404, "Channel not found")
	expectError(t, e.do("GET", "/channels/nope/contacts/abc", e.keyA, ""), 404, "Channel not found")
	if r := e.do("DELETE", "/channels/"+c.ID.String()+"?force=true", e.keyA, ""); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	expectError(t, e.do("GET", base+"15550100", e.keyA, ""), 404, "Channel not found")
}
