package inbound_test

import (
	"context"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestHandlerPromptsHealthReads: the four account webhooks of a business account ask for one
// read of its channels' health, due within 60 s, naming the latest change verbatim; another
// account field asks for none, and an account no channel has is answered 200 with nothing done.
func TestHandlerPromptsHealthReads(t *testing.T) {
	kit := testenv.NewStore(t)
	clk := clock.NewStub(time.Now())
	kit.Store.SetClock(clk)
	org := kit.Org(t)
	ch := kit.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: phoneID, WabaID: wabaID, UpstreamToken: "t"}})
	ctx := context.Background()
	claim := func() []store.HealthRead {
		t.Helper()
		reads, err := kit.Store.ClaimHealthReads(ctx, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return reads
	}
	for _, r := range claim() { // the read at connect
		if err := kit.Store.SkipHealthRead(ctx, r, 0); err != nil {
			t.Fatal(err)
		}
	}
	obs := &observer{}
	h := newHandler(t, inbound.Config{Store: kit.Store, Observer: obs})
	if w := signed(h, change("account_alerts", `{"entity_type":"WABA","alert_severity":"WARNING"}`)); w.Code != 200 {
		t.Fatalf("account_alerts: %d", w.Code)
	}
	other := `{"object":"whatsapp_business_account","entry":[{"id":"999","changes":[{"field":"phone_number_quality_update","value":{"event":"FLAGGED"}}]}]}`
	if w := signed(h, other); w.Code != 200 {
		t.Fatalf("an account no channel has: %d %s", w.Code, w.Body)
	}
	if obs.last.Unknown != 1 { // counted, as items for numbers no channel has
		t.Fatalf("an account no channel has: counted %d unknown, want 1", obs.last.Unknown)
	}
	clk.Advance(time.Hour)
	if reads := claim(); len(reads) != 0 {
		t.Fatalf("reads due without a health webhook of the channel's account: %+v", reads)
	}
	for _, field := range []string{"phone_number_quality_update", "phone_number_name_update", "business_capability_update", "account_update"} {
		value := `{"event":"X", "field":"` + field + `"}`
		if w := signed(h, change(field, value)); w.Code != 200 {
			t.Fatalf("%s: %d", field, w.Code)
		}
		clk.Advance(time.Minute)
		reads := claim()
		if len(reads) != 1 || reads[0].ChannelID != ch.ID || string(reads[0].Upstream) != `{"field":"`+field+`","value":`+value+`}` {
			t.Fatalf("%s: reads %+v", field, reads)
		}
		if err := kit.Store.SkipHealthRead(ctx, reads[0], 0); err != nil {
			t.Fatal(err)
		}
	}
}
