package fakegraph

import (
	"testing"
)

// TestStatusPricing: a template's statuses are priced as its template's category, billable and
// "regular"; a free-form message as a free service message.
func TestStatusPricing(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL), WithStatusOrder("sent"))
	f.g.AddTemplates(waba, Template{Name: "weekly_offers", Language: "en_US", Status: "APPROVED", Category: "MARKETING"},
		Template{Name: "login_code", Language: "en_US", Status: "APPROVED", Category: "AUTHENTICATION"})
	for i, tc := range []struct{ body, want string }{
		{`{"messaging_product":"whatsapp","to":"16505551234","type":"template","template":{"name":"weekly_offers","language":{"code":"en_US"}}}`,
			`{"billable":true,"pricing_model":"PMP","type":"regular","category":"marketing"}`},
		{`{"messaging_product":"whatsapp","to":"16505551234","type":"template","template":{"name":"login_code","language":{"code":"en_US"}}}`,
			`{"billable":true,"pricing_model":"PMP","type":"regular","category":"authentication"}`},
		{`{"messaging_product":"whatsapp","to":"16505551234","type":"template","template":{"name":"hello_world","language":{"code":"en_US"}}}`,
			`{"billable":true,"pricing_model":"PMP","type":"regular","category":"utility"}`},
		{`{"messaging_product":"whatsapp","to":"16505551234","type":"text","text":{"body":"hi"}}`,
			`{"billable":false,"pricing_model":"PMP","type":"free_customer_service","category":"service"}`},
	} {
		if r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, tc.body); r.status != 200 {
			t.Fatalf("send %d: %d %s", i, r.status, r.raw)
		}
		if st := statusPost(t, hook, i+1); string(st.Pricing) != tc.want {
			t.Errorf("send %d: pricing %s, want %s", i, st.Pricing, tc.want)
		}
	}
}
