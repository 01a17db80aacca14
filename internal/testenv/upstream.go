package testenv

import "strings"

// FullBatch is an upstream webhook post holding every field the upstream sends — two messages
// (a text with context, an image), a status with conversation, pricing and errors, a contact
// and the value's errors — for phone number 1001 of account 2001. vals replaces fields' values
// (by their names in FullBatchFields); the others keep their usual values.
func FullBatch(vals map[string]string) string {
	v := map[string]string{"waba": "2001", "display": "15550100", "phone_number_id": "1001", "name": "Ann", "wa_id": "15550001111",
		"from": "15550001111", "message_id": "wamid.m1", "timestamp": "1700000000", "type": "text", "context_from": "15550100",
		"context_id": "wamid.c1", "body": "hi", "image_message_id": "wamid.i1", "media_id": "media1", "mime_type": "image/jpeg",
		"sha256": "abc", "caption": "cap", "status_id": "wamid.s1", "status": "delivered", "status_timestamp": "1700000001",
		"recipient_id": "15550001111", "opaque": "x", "conversation_id": "conv1", "expiration": "1700090000", "origin": "service",
		"pricing_model": "CBP", "category": "service", "error_title": "t", "error_message": "m", "error_details": "d", "value_error": "v"}
	for k, x := range vals {
		if _, ok := v[k]; !ok {
			panic("testenv.FullBatch: no field " + k)
		}
		v[k] = x
	}
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
	// one pass over the template: a value that holds another field's {name} stays as it is
	pairs := make([]string, 0, 2*len(v))
	for k, x := range v {
		pairs = append(pairs, "{"+k+"}", x)
	}
	return strings.NewReplacer(pairs...).Replace(b)
}

// FullBatchFields are the fields of FullBatch.
var FullBatchFields = []string{"message_id", "status_id", "status", "image_message_id", "media_id", "from", "recipient_id", "wa_id",
	"phone_number_id", "display", "waba", "timestamp", "status_timestamp", "type", "conversation_id", "expiration", "origin",
	"pricing_model", "category", "error_title", "error_message", "error_details", "value_error", "name", "context_from",
	"context_id", "body", "mime_type", "sha256", "caption", "opaque"}
