package fakegraph

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
)

// healthOf reads the number's health fields as the relay's health worker does.
func healthOf(t *testing.T, f *fixture) map[string]any {
	t.Helper()
	r := call(t, "GET", f.base+"/"+pnid+"?fields=quality_rating,name_status,throughput,whatsapp_business_manager_messaging_limit,messaging_limit_tier", tok, "")
	if r.status != 200 {
		t.Fatalf("health read: %d %s", r.status, r.raw)
	}
	return r.body
}

// TestEmitAccountUpdate: each of the four account webhooks is the upstream's envelope (entry id
// the business account, entry time, one change of the field), signed with the app secret, read
// by the inbound package as an account change of the number's business account, with the value
// members of Meta's reference pages; and the number's health read answers the new values.
func TestEmitAccountUpdate(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL))
	ctx := context.Background()
	if q := healthOf(t, f)["quality_rating"]; q != "GREEN" {
		t.Fatalf("quality before: %v", q)
	}

	cases := []struct {
		u          AccountUpdate
		event      string         // inbound's AccountChange.Event
		value      map[string]any // members of the value
		health     map[string]any // the health read after it
		banState   string
		noOldLimit bool
	}{
		{u: AccountUpdate{PhoneNumberID: pnid}, event: "FLAGGED",
			value:  map[string]any{"display_phone_number": "15550100", "event": "FLAGGED", "current_limit": "TIER_2K", "max_daily_conversations_per_business": "TIER_2K"},
			health: map[string]any{"quality_rating": "YELLOW", "whatsapp_business_manager_messaging_limit": "TIER_2K"}, noOldLimit: true},
		{u: AccountUpdate{PhoneNumberID: pnid, Event: "DOWNGRADE", MessagingLimit: "TIER_250", QualityRating: "RED"}, event: "DOWNGRADE",
			value:  map[string]any{"event": "DOWNGRADE", "old_limit": "TIER_2K", "current_limit": "TIER_250", "max_daily_conversations_per_business": "TIER_250"},
			health: map[string]any{"quality_rating": "RED", "whatsapp_business_manager_messaging_limit": "TIER_250"}},
		{u: AccountUpdate{PhoneNumberID: pnid, Field: FieldNameUpdate, Event: "REJECTED"},
			value:  map[string]any{"display_phone_number": "15550100", "decision": "REJECTED", "requested_verified_name": "Lucky Shrub", "rejection_reason": "NAME_ENDCLIENT_NOTRELATED"},
			health: map[string]any{"name_status": "DECLINED", "quality_rating": "RED"}},
		{u: AccountUpdate{PhoneNumberID: pnid, Field: FieldAccountUpdate, Event: "DISABLED_UPDATE"}, event: "DISABLED_UPDATE", banState: "DISABLE",
			value:  map[string]any{"phone_number": "15550100", "event": "DISABLED_UPDATE"},
			health: map[string]any{"quality_rating": "RED"}},
		{u: AccountUpdate{PhoneNumberID: pnid, Field: FieldCapabilityUpdate, MessagingLimit: "TIER_10K"},
			value:  map[string]any{"max_daily_conversation_per_phone": 10000.0, "max_daily_conversations_per_business": 10000.0, "max_phone_numbers_per_business": 2.0},
			health: map[string]any{"whatsapp_business_manager_messaging_limit": "TIER_10K"}},
		{u: AccountUpdate{PhoneNumberID: pnid, Event: "UNFLAGGED"}, event: "UNFLAGGED",
			value:  map[string]any{"event": "UNFLAGGED", "current_limit": "TIER_10K"},
			health: map[string]any{"quality_rating": "GREEN", "name_status": "DECLINED"}, noOldLimit: true},
	}
	for i, c := range cases {
		before := time.Now().Unix()
		res, err := f.g.EmitAccountUpdate(ctx, hook.URL, appSK, c.u)
		if err != nil || res.Status != 200 || res.PhoneNumberID != pnid {
			t.Fatalf("%d: %+v %v", i, res, err)
		}
		p := post(t, hook, i+1)
		if string(p.Body) != string(res.Payload) || !inbound.VerifySignature(appSK, p.Body, p.Header.Get("X-Hub-Signature-256")) {
			t.Fatalf("%d: signature %q over %s", i, p.Header.Get("X-Hub-Signature-256"), p.Body)
		}
		var env struct {
			Entry []struct {
				ID      string
				Time    int64
				Changes []struct {
					Field string
					Value map[string]any
				}
			}
		}
		if err := json.Unmarshal(p.Body, &env); err != nil || len(env.Entry) != 1 || env.Entry[0].Time < before || len(env.Entry[0].Changes) != 1 {
			t.Fatalf("%d: envelope %s (%v)", i, p.Body, err)
		}
		field := c.u.Field
		if field == "" {
			field = FieldQualityUpdate
		}
		batch, err := inbound.Parse(p.Body)
		if err != nil || len(batch.Accounts) != 1 || len(batch.Items) != 0 {
			t.Fatalf("%d: parse %+v %v", i, batch, err)
		}
		a := batch.Accounts[0]
		if a.WabaID != waba || a.Field != field || a.Event != c.event || a.BanState != c.banState || !inbound.IsHealthField(a.Field) {
			t.Errorf("%d: account change %+v", i, a)
		}
		v := env.Entry[0].Changes[0].Value
		for k, want := range c.value {
			if v[k] != want {
				t.Errorf("%d: value.%s = %v, want %v (%s)", i, k, v[k], want, p.Body)
			}
		}
		if _, ok := v["old_limit"]; ok && c.noOldLimit {
			t.Errorf("%d: old_limit in %s", i, p.Body)
		}
		h := healthOf(t, f)
		for k, want := range c.health {
			if h[k] != want {
				t.Errorf("%d: after the webhook %s = %v, want %v", i, k, h[k], want)
			}
		}
	}

	// bad input posts nothing
	for _, u := range []AccountUpdate{{PhoneNumberID: "404"}, {PhoneNumberID: pnid, Field: "messages"}, {}} {
		if _, err := f.g.EmitAccountUpdate(ctx, hook.URL, appSK, u); err == nil {
			t.Errorf("%+v: no error", u)
		}
	}
	if _, err := f.g.EmitAccountUpdate(ctx, hook.URL, "", AccountUpdate{PhoneNumberID: pnid}); err == nil {
		t.Error("unsigned: no error")
	}
	if n := hook.Count(); n != len(cases) {
		t.Fatalf("%d posts, want %d", n, len(cases))
	}
}

// TestAccountWebhookEndpoint: POST /_fake/account_webhook sends the webhook to the configured
// callback and answers with the callback's status; the next health read follows.
func TestAccountWebhookEndpoint(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL))
	r := call(t, "POST", f.root+"/_fake/account_webhook", "", `{"phone_number_id":"`+pnid+`","event":"FLAGGED"}`)
	if r.status != 200 || r.body["callback_status"] != 200.0 || r.body["phone_number_id"] != pnid {
		t.Fatalf("emit: %d %s", r.status, r.raw)
	}
	p := post(t, hook, 1)
	if !strings.Contains(string(p.Body), `"field":"phone_number_quality_update"`) || !inbound.VerifySignature(appSK, p.Body, p.Header.Get("X-Hub-Signature-256")) {
		t.Fatalf("post %s", p.Body)
	}
	if q := healthOf(t, f)["quality_rating"]; q != "YELLOW" {
		t.Fatalf("quality after: %v", q)
	}
	for _, body := range []string{`{"field":"account_alerts"}`, `{"quality":"RED"}`, `{"phone_number_id":"404"}`, `[`, ``} {
		if r := call(t, "POST", f.root+"/_fake/account_webhook", "", body); r.status != 400 || r.body["error"] == nil {
			t.Errorf("%s: %d %s", body, r.status, r.raw)
		}
	}
	if r := call(t, "GET", f.root+"/_fake/account_webhook", "", ""); r.status != 405 {
		t.Errorf("GET: %d", r.status)
	}
	if n := hook.Count(); n != 1 {
		t.Fatalf("%d posts", n)
	}
}

// TestInboundAge: POST /_fake/inbound's "age" and "timestamp" set the message's upstream
// timestamp (a late webhook), which the inbound package reads as the message's time.
func TestInboundAge(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL))
	stamp := func(n int) int64 {
		t.Helper()
		batch, err := inbound.Parse(post(t, hook, n).Body)
		if err != nil || len(batch.Items) != 1 {
			t.Fatalf("parse: %+v %v", batch, err)
		}
		var d struct{ Message struct{ Timestamp string } }
		_ = json.Unmarshal(batch.Items[0].Data, &d)
		ts, err := strconv.ParseInt(d.Message.Timestamp, 10, 64)
		if err != nil {
			t.Fatalf("timestamp %q", d.Message.Timestamp)
		}
		return ts
	}
	before := time.Now().Add(-25 * time.Hour).Unix()
	if r := call(t, "POST", f.root+"/_fake/inbound", "", `{"phone_number_id":"`+pnid+`","age":"25h"}`); r.status != 200 {
		t.Fatalf("age: %d %s", r.status, r.raw)
	}
	if ts := stamp(1); ts < before || ts > time.Now().Add(-25*time.Hour).Unix() {
		t.Errorf("age 25h: timestamp %d, want about %d", ts, before)
	}
	if r := call(t, "POST", f.root+"/_fake/inbound", "", `{"phone_number_id":"`+pnid+`","timestamp":1700000000}`); r.status != 200 {
		t.Fatalf("timestamp: %d %s", r.status, r.raw)
	}
	if ts := stamp(2); ts != 1700000000 {
		t.Errorf("timestamp %d", ts)
	}
	before = time.Now().Unix()
	if r := call(t, "POST", f.root+"/_fake/inbound", "", `{"phone_number_id":"`+pnid+`"}`); r.status != 200 {
		t.Fatalf("now: %d %s", r.status, r.raw)
	}
	if ts := stamp(3); ts < before {
		t.Errorf("no age: timestamp %d before %d", ts, before)
	}
	for _, body := range []string{`{"age":"yesterday"}`, `{"age":"-1h"}`, `{"timestamp":-5}`, `{"age":"1h","timestamp":1700000000}`} {
		if r := call(t, "POST", f.root+"/_fake/inbound", "", body); r.status != 400 {
			t.Errorf("%s: %d %s", body, r.status, r.raw)
		}
	}
	if hook.Count() != 3 {
		t.Fatalf("%d posts", hook.Count())
	}
}
