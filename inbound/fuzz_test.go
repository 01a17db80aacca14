package inbound

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzParse: whatever the upstream posts, splitting it never panics, and every item carries
// the upstream's message or status bytes exactly as posted (a sub-slice of the body), whatever
// they hold (\u0000 escapes, invalid UTF-8).
func FuzzParse(f *testing.F) {
	msg := func(m string) string {
		return `{"object":"whatsapp_business_account","entry":[{"id":"2001","changes":[{"field":"messages","value":{"messaging_product":"whatsapp",` +
			`"metadata":{"display_phone_number":"15550100","phone_number_id":"1001"},"contacts":[{"profile":{"name":"Ann"},"wa_id":"15550001111"}],` +
			`"messages":[` + m + `],"statuses":[{"id":"wamid.s1","status":"read","timestamp":"1","recipient_id":"1"}]}}]}]}`
	}
	for _, s := range []string{
		msg(`{"from":"15550001111","id":"wamid.1","timestamp":"1","type":"text","text":{"body":"hi"}}`),
		msg(`{"from":"15550001111","id":"wamid.\u0000","type":"text","text":{"body":"a\u0000b"}}`),
		msg("{\"from\":\"15550001111\",\"id\":\"wamid.\xff\",\"type\":\"text\",\"text\":{\"body\":\"\xc3\x28\"}}"),
		msg(`{"id":"wamid.2","type":"image","image":{"id":12345,"mime_type":"image/jpeg"}}`),
		msg(`{"id":"wamid.3","type":"document","document":"not an object"}`),
		msg(`{"id":1e999}`), msg(`null`), msg(`[]`),
		`{"object":"whatsapp_business_account","entry":[{"id":"2001","changes":[{"field":"account_update","value":{"event":"DISABLED_UPDATE","ban_info":{"waba_ban_state":"DISABLE"}}}]}]}`,
		`{"object":"whatsapp_business_account","entry":[{"id":2001,"changes":[{"field":"account_update","value":{"event":7,"waba_info":{"waba_id":"\u0000"}}}]}]}`,
		`{"object":"page"}`, `[]`, `not json`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := Parse(body)
		if err != nil {
			return
		}
		for _, it := range b.Items {
			var d map[string]json.RawMessage
			if err := json.Unmarshal(it.Data, &d); err != nil {
				t.Fatalf("item data is not a JSON object: %q", it.Data)
			}
			obj := d["message"]
			if it.Kind == KindStatus {
				obj = d["status"]
			}
			if len(obj) == 0 || !bytes.Contains(body, obj) {
				t.Fatalf("item object %q is not the posted bytes", obj)
			}
			if it.DedupeKey == "" || it.PhoneNumberID == "" {
				t.Fatalf("item without key or number: %+v", it)
			}
		}
	})
}
