package inbound

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
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
	// Huge strings (256 KiB; 1 MiB in the identifiers) in every field, one field at a time, run
	// with the seed corpus (go test); under -fuzz they are left out, as in managementapi's
	// FuzzRequestBody: their baseline coverage would take the fuzz time.
	if fl := flag.Lookup("test.fuzz"); fl == nil || fl.Value.String() == "" {
		for _, field := range fullBatchFields {
			f.Add([]byte(fullBatch(field, strings.Repeat("9", 256<<10))))
		}
		for _, field := range []string{"message_id", "status_id", "status", "media_id", "phone_number_id", "waba", "from", "wa_id", "recipient_id"} {
			f.Add([]byte(fullBatch(field, strings.Repeat("A", 1<<20))))
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

// fullBatch is an upstream post with every field the upstream sends — two messages (text with
// context, image), a status with conversation, pricing and errors, a contact, value.errors —
// with field (one of fullBatchFields) holding v and the others their usual values.
func fullBatch(field, v string) string {
	vals := map[string]string{"waba": "2001", "display": "15550100", "phone_number_id": "1001", "name": "Ann", "wa_id": "15550001111",
		"from": "15550001111", "message_id": "wamid.m1", "timestamp": "1700000000", "type": "text", "context_from": "15550100",
		"context_id": "wamid.c1", "body": "hi", "image_message_id": "wamid.i1", "media_id": "media1", "mime_type": "image/jpeg",
		"sha256": "abc", "caption": "cap", "status_id": "wamid.s1", "status": "delivered", "status_timestamp": "1700000001",
		"recipient_id": "15550001111", "opaque": "x", "conversation_id": "conv1", "expiration": "1700090000", "origin": "service",
		"pricing_model": "CBP", "category": "service", "error_title": "t", "error_message": "m", "error_details": "d", "value_error": "v"}
	if _, ok := vals[field]; !ok {
		panic("fullBatch: no field " + field)
	}
	vals[field] = v
	b := `{"object":"whatsapp_business_account","entry":[{"id":"{waba}","time":1700000000,"changes":[{"field":"messages","value":{"messaging_product":"whatsapp",` +
		`"metadata":{"display_phone_number":"{display}","phone_number_id":"{phone_number_id}"},` +
		`"contacts":[{"profile":{"name":"{name}"},"wa_id":"{wa_id}"}],` +
		`"messages":[{"from":"{from}","id":"{message_id}","timestamp":"{timestamp}","type":"{type}","context":{"from":"{context_from}","id":"{context_id}"},"text":{"body":"{body}"}},` +
		`{"from":"15550001111","id":"{image_message_id}","timestamp":"1700000000","type":"image","image":{"id":"{media_id}","mime_type":"{mime_type}","sha256":"{sha256}","caption":"{caption}"}}],` +
		`"statuses":[{"id":"{status_id}","status":"{status}","timestamp":"{status_timestamp}","recipient_id":"{recipient_id}","biz_opaque_callback_data":"{opaque}",` +
		`"conversation":{"id":"{conversation_id}","expiration_timestamp":"{expiration}","origin":{"type":"{origin}"}},` +
		`"pricing":{"billable":true,"pricing_model":"{pricing_model}","category":"{category}"},` +
		`"errors":[{"code":131026,"title":"{error_title}","message":"{error_message}","error_data":{"details":"{error_details}"}}]}],` +
		`"errors":[{"code":1,"title":"{value_error}"}]}}]}]}`
	for k, x := range vals {
		b = strings.ReplaceAll(b, "{"+k+"}", x)
	}
	return b
}

// fullBatchFields are the fields of fullBatch.
var fullBatchFields = []string{"message_id", "status_id", "status", "image_message_id", "media_id", "from", "recipient_id", "wa_id",
	"phone_number_id", "display", "waba", "timestamp", "status_timestamp", "type", "conversation_id", "expiration", "origin",
	"pricing_model", "category", "error_title", "error_message", "error_details", "value_error", "name", "context_from",
	"context_id", "body", "mime_type", "sha256", "caption", "opaque"}

// TestParseHugeFields: a 1 MiB string in any field of a full batch splits like any other batch:
// three items, the identifiers kept whole in their keys and media ids.
func TestParseHugeFields(t *testing.T) {
	huge := strings.Repeat("7", 1<<20)
	for _, field := range fullBatchFields {
		b, err := Parse([]byte(fullBatch(field, huge)))
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
	}
}
