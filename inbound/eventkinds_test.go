package inbound_test

import (
	"testing"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestHandlerTemplateStatus: a template status change of a business account becomes one
// message_template_status_update event per channel of that account, data.template the
// upstream's value verbatim; a re-send is a duplicate.
func TestHandlerTemplateStatus(t *testing.T) {
	kit := testenv.NewStore(t)
	org := kit.Org(t)
	a := kit.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: phoneID, WabaID: wabaID, UpstreamToken: "t"}})
	b := kit.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "2", WabaID: wabaID, UpstreamToken: "t"}})
	kit.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "3", WabaID: "another", UpstreamToken: "t"}})
	kit.Webhook(t, org.ID, "https://h.example.com", &testenv.WebhookOpts{Events: []string{inbound.TypeTemplateStatus}})
	h := newHandler(t, inbound.Config{Store: kit.Store})

	value := `{"event":"REJECTED","message_template_id":1689556908129835,"message_template_name":"abandoned_cart","message_template_language":"en","reason":"INVALID_FORMAT","message_template_category":"MARKETING","rejection_info":{"reason":"x","recommendation":"y"}}`
	body := `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","time":1751247548,"changes":[{"value":` + value + `,"field":"message_template_status_update"}]}]}`
	if w := signed(h, body); w.Code != 200 || w.Body.String() != `{"duplicates":0,"events":2}`+"\n" {
		t.Fatalf("template post: %d %s", w.Code, w.Body)
	}
	for _, c := range []store.Channel{a, b} {
		data := testenv.QueryValue[string](t, kit, `SELECT convert_from(payload, 'UTF8')::jsonb ->> 'data' FROM events
			WHERE channel_id = $1 AND type = 'message_template_status_update'`, c.ID)
		if want := testenv.QueryValue[string](t, kit, `SELECT jsonb_build_object('template', $1::jsonb)::text`, value); data != want {
			t.Fatalf("channel %s: data %s, want %s", c.ID, data, want)
		}
	}
	if n := kit.Count(t, "deliveries"); n != 2 {
		t.Fatalf("%d deliveries, want 2", n)
	}
	if w := signed(h, body); w.Code != 200 || w.Body.String() != `{"duplicates":2,"events":0}`+"\n" {
		t.Fatalf("re-sent: %d %s", w.Code, w.Body)
	}
}

// TestHandlerAccountChangesAnnounced: the account changes that deactivate channels are
// announced by channel_status events with their reasons.
func TestHandlerAccountChangesAnnounced(t *testing.T) {
	kit := testenv.NewStore(t)
	org := kit.Org(t)
	removed := kit.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: phoneID, WabaID: wabaID,
		DisplayPhoneNumber: "+1 555-0100", UpstreamToken: "t"}})
	banned := kit.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "2", WabaID: wabaID, UpstreamToken: "t"}})
	h := newHandler(t, inbound.Config{Store: kit.Store})
	for _, body := range []string{
		change("account_update", `{"event":"PHONE_NUMBER_REMOVED","phone_number":"15550100"}`),
		change("account_update", `{"event":"DISABLED_UPDATE","ban_info":{"waba_ban_state":"DISABLE"}}`),
		change("account_update", `{"event":"ACCOUNT_DELETED"}`), // nothing left to change
	} {
		if w := signed(h, body); w.Code != 200 {
			t.Fatalf("%s: %d %s", body, w.Code, w.Body)
		}
	}
	for c, want := range map[store.Channel]string{removed: "number_removed", banned: "account_banned"} {
		got := testenv.QueryValue[[]string](t, kit, `SELECT array_agg(convert_from(payload, 'UTF8')::jsonb #>> '{data,reason}' ORDER BY id)
			FROM events WHERE channel_id = $1 AND type = 'channel_status'`, c.ID)
		if len(got) != 2 || got[0] != "connected" || got[1] != want {
			t.Errorf("channel %s: reasons %v, want [connected %s]", c.Name, got, want)
		}
	}
}
