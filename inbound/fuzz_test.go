package inbound

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
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
	// Huge strings (256 KiB; 1 MiB in the identifiers) in every field, one field at a time, run
	// with the seed corpus (go test); under -fuzz they are left out, as in managementapi's
	// FuzzRequestBody: their baseline coverage would take the fuzz time.
	if fl := flag.Lookup("test.fuzz"); fl == nil || fl.Value.String() == "" {
		for _, field := range testenv.FullBatchFields {
			f.Add([]byte(testenv.FullBatch(map[string]string{field: strings.Repeat("9", 256<<10)})))
		}
		for _, field := range []string{"message_id", "status_id", "status", "media_id", "phone_number_id", "waba", "from", "wa_id", "recipient_id"} {
			f.Add([]byte(testenv.FullBatch(map[string]string{field: strings.Repeat("A", 1<<20)})))
		}
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
			if it.Type == TypeStatus {
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

// TestParseHugeFields: a 1 MiB string in any field of a full batch splits like any other batch:
// three items, the identifiers kept whole in their keys and media ids.
func TestParseHugeFields(t *testing.T) {
	huge := strings.Repeat("7", 1<<20)
	// One parallel subtest a field: each parses its own batch (about 0.2 s of CPU under -race).
	for _, field := range testenv.FullBatchFields {
		t.Run(field, func(t *testing.T) {
			t.Parallel()
			b, err := Parse([]byte(testenv.FullBatch(map[string]string{field: huge})))
			if err != nil || len(b.Items) != 3 {
				t.Fatalf("%s: %d items, %v; want 3", field, len(b.Items), err)
			}
			want := map[string]string{"message_id": "m:" + huge, "status_id": "s:" + huge + ":delivered", "status": "s:wamid.s1:" + huge,
				"image_message_id": "m:" + huge}[field]
			if want != "" && b.Items[0].DedupeKey != want && b.Items[1].DedupeKey != want && b.Items[2].DedupeKey != want {
				t.Errorf("%s: no item keyed %.20q…", field, want)
			}
			if field == "media_id" && (len(b.Items[1].ObjectIDs) != 1 || b.Items[1].ObjectIDs[0] != huge) {
				t.Errorf("media_id: the image's media ids are not the huge id")
			}
			if field == "phone_number_id" && b.Items[0].PhoneNumberID != huge {
				t.Errorf("phone_number_id: not kept whole")
			}
		})
	}
}
