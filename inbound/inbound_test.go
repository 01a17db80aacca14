package inbound

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

func TestVerifySignature(t *testing.T) {
	// Independent vector: HMAC-SHA256("key", "The quick brown fox jumps over the lazy dog").
	const known = "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
	fox := []byte("The quick brown fox jumps over the lazy dog")
	if got := Sign("key", fox); got != "sha256="+known {
		t.Fatalf("Sign = %s", got)
	}

	body := []byte(`{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[]}],"t":"J'ai mang\u00e9 \/ \u0040"}`)
	good := Sign("s3cret", body)
	cases := []struct {
		name, secret, header string
		body                 []byte
		want                 bool
	}{
		{"known vector", "key", "sha256=" + known, fox, true},
		{"good", "s3cret", good, body, true},
		{"uppercase hex", "s3cret", "sha256=" + strings.ToUpper(strings.TrimPrefix(good, "sha256=")), body, true},
		{"surrounding space", "s3cret", " " + good + " ", body, true},
		{"wrong secret", "other", good, body, false},
		{"body changed", "s3cret", good, append(append([]byte{}, body...), ' '), false},
		{"one digit off", "s3cret", good[:len(good)-1] + flipHex(good[len(good)-1]), body, false},
		{"missing", "s3cret", "", body, false},
		{"no prefix", "s3cret", strings.TrimPrefix(good, "sha256="), body, false},
		{"sha1 prefix", "s3cret", "sha1=" + strings.TrimPrefix(good, "sha256="), body, false},
		{"not hex", "s3cret", "sha256=" + strings.Repeat("zz", 32), body, false},
		{"short", "s3cret", good[:len(good)-2], body, false},
		{"long", "s3cret", good + "00", body, false},
		{"prefix only", "s3cret", "sha256=", body, false},
		{"empty secret", "", Sign("", body), body, false},
	}
	for _, c := range cases {
		if got := VerifySignature(c.secret, c.body, c.header); got != c.want {
			t.Errorf("%s: VerifySignature = %v, want %v", c.name, got, c.want)
		}
	}
}

func flipHex(c byte) string {
	if c == '0' {
		return "1"
	}
	return "0"
}

func TestVerify(t *testing.T) {
	if ch, ok := Verify("subscribe", "vibecoding", "1158201444", "vibecoding"); !ok || ch != "1158201444" {
		t.Fatalf("good verification = %q, %v", ch, ok)
	}
	bad := [][4]string{
		{"subscribe", "wrong", "1158201444", "vibecoding"},
		{"unsubscribe", "vibecoding", "1158201444", "vibecoding"},
		{"", "vibecoding", "1158201444", "vibecoding"},
		{"subscribe", "", "1158201444", "vibecoding"},
		{"subscribe", "", "1158201444", ""},
		{"subscribe", "vibecodin", "1158201444", "vibecoding"},
	}
	for _, b := range bad {
		if ch, ok := Verify(b[0], b[1], b[2], b[3]); ok || ch != "" {
			t.Errorf("Verify%q = %q, %v; want refusal", b, ch, ok)
		}
	}
}

// Upstream objects of the test batch, kept as separate strings so the test can
// check that Data carries them byte for byte (indentation and escapes included).
const (
	contact1 = `{
                "profile": {
                  "name": "Sheena Nelson"
                },
                "wa_id": "16505551234"
              }`
	contact2 = `{"profile":{"name":"Ren\u00e9 M.","username":"@rene","country_code":"FR"},"wa_id":"33612345678","user_id":"user.abc"}`
	msg1     = `{
                "from": "16505551234",
                "id": "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=",
                "timestamp": "1749416383",
                "type": "text",
                "text": {
                  "body": "Does it come in another color?"
                }
              }`
	msg2 = `{"from":"33612345678","id":"wamid.M2","timestamp":"1749416384","type":"text","text":{"body":"J'ai mang\u00e9 \/ \u0040 "}}`
	// msg3 has no contact in its change: contact must be null.
	msg3    = `{"from":"447700900123","id":"wamid.M3","timestamp":"1749416385","type":"reaction","reaction":{"message_id":"wamid.X","emoji":"\ud83d\udc4d"}}`
	status1 = `{
                "id": "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUFERjg0NDEzNDdFODU3MUMxMAA=",
                "status": "sent",
                "timestamp": "1750030073",
                "recipient_id": "16505551234",
                "pricing": {
                  "billable": true,
                  "pricing_model": "PMP",
                  "type": "regular",
                  "category": "marketing"
                }
              }`
	status2 = `{"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI0QUQ2MjA4NEYyRkExNjMyREUA","status":"failed","timestamp":"1751142888","recipient_id":"16505551234","errors":[{"code":131049,"title":"This message was not delivered to maintain healthy ecosystem engagement.","message":"This message was not delivered to maintain healthy ecosystem engagement.","error_data":{"details":"In order to maintain a healthy ecosystem engagement, the message failed to be delivered."},"href":"/documentation/business-messaging/whatsapp/support/error-codes"}]}`
)

var batchBody = []byte(`{
  "object": "whatsapp_business_account",
  "entry": [
    {
      "id": "102290129340398",
      "changes": [
        {
          "value": {
            "messaging_product": "whatsapp",
            "metadata": {
              "display_phone_number": "15550783881",
              "phone_number_id": "106540352242922"
            },
            "contacts": [
              ` + contact1 + `,
              ` + contact2 + `
            ],
            "messages": [
              ` + msg1 + `,
              ` + msg2 + `
            ],
            "statuses": [
              ` + status1 + `
            ]
          },
          "field": "messages"
        }
      ]
    },
    {
      "id": "200000000000001",
      "changes": [
        {
          "value": {"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550000002","phone_number_id":"222222222222222"},"messages":[` + msg3 + `]},
          "field": "messages"
        },
        {
          "value": {"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550000002","phone_number_id":"222222222222222"},"statuses":[` + status2 + `]},
          "field": "messages"
        }
      ]
    }
  ]
}`)

type messageData struct {
	Message json.RawMessage `json:"message"`
	Contact json.RawMessage `json:"contact"`
}

type statusData struct {
	Status json.RawMessage `json:"status"`
}

func TestParseBatch(t *testing.T) {
	if !json.Valid(batchBody) {
		t.Fatal("test batch is not valid JSON")
	}
	b, err := Parse(batchBody)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Items) != 5 || len(b.Accounts) != 0 || b.Skipped != 0 {
		t.Fatalf("got %d items, %d accounts, %d skipped; want 5, 0, 0", len(b.Items), len(b.Accounts), b.Skipped)
	}
	want := []struct {
		kind, phone, waba, key string
		raw, contact           string
	}{
		{TypeMessage, "106540352242922", "102290129340398", "m:wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=", msg1, contact1},
		{TypeMessage, "106540352242922", "102290129340398", "m:wamid.M2", msg2, contact2},
		{TypeStatus, "106540352242922", "102290129340398", "s:wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUFERjg0NDEzNDdFODU3MUMxMAA=:sent", status1, ""},
		{TypeMessage, "222222222222222", "200000000000001", "m:wamid.M3", msg3, "null"},
		{TypeStatus, "222222222222222", "200000000000001", "s:wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI0QUQ2MjA4NEYyRkExNjMyREUA:failed", status2, ""},
	}
	for i, w := range want {
		it := b.Items[i]
		if it.Type != w.kind || it.PhoneNumberID != w.phone || it.WabaID != w.waba || it.DedupeKey != w.key {
			t.Errorf("item %d = {%s %s %s %s}, want {%s %s %s %s}", i, it.Type, it.PhoneNumberID, it.WabaID, it.DedupeKey, w.kind, w.phone, w.waba, w.key)
		}
		if !json.Valid(it.Data) {
			t.Errorf("item %d: Data is not valid JSON: %s", i, it.Data)
			continue
		}
		if w.kind == TypeMessage {
			wantData := `{"message":` + w.raw + `,"contact":` + w.contact + `}`
			if string(it.Data) != wantData {
				t.Errorf("item %d: Data =\n%s\nwant\n%s", i, it.Data, wantData)
			}
			var d messageData
			if err := json.Unmarshal(it.Data, &d); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(d.Message, []byte(w.raw)) {
				t.Errorf("item %d: message not verbatim:\n%s", i, d.Message)
			}
			if !bytes.Equal(d.Contact, []byte(w.contact)) {
				t.Errorf("item %d: contact = %s, want %s", i, d.Contact, w.contact)
			}
			if !bytes.Contains(batchBody, d.Message) {
				t.Errorf("item %d: message bytes are not a slice of the body", i)
			}
		} else {
			if want := `{"status":` + w.raw + `}`; string(it.Data) != want {
				t.Errorf("item %d: Data =\n%s\nwant\n%s", i, it.Data, want)
			}
			var d statusData
			if err := json.Unmarshal(it.Data, &d); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(d.Status, []byte(w.raw)) {
				t.Errorf("item %d: status not verbatim:\n%s", i, d.Status)
			}
		}
	}
	// Escapes survive untouched (no re-marshalling).
	if !bytes.Contains(b.Items[1].Data, []byte(`J'ai mang\u00e9 \/ \u0040 `)) {
		t.Errorf("escapes lost: %s", b.Items[1].Data)
	}
	// Data must not alias the body: mutating the body leaves items intact.
	body := bytes.Clone(batchBody)
	b2, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'x'
	}
	if string(b2.Items[0].Data) != string(b.Items[0].Data) {
		t.Error("Data aliases the input body")
	}
}

func TestParseStatusStatesAreDistinct(t *testing.T) {
	// The sent, delivered and read samples of whatsapp.md §3.4 concatenated
	// into one batch, plus an identical re-sent "read".
	body := []byte(`{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[
	{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"statuses":[{"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUFERjg0NDEzNDdFODU3MUMxMAA=","status":"sent","timestamp":"1750030073","recipient_id":"16505551234","conversation":{"id":"72b14d6bd5407799e66f64d1b338e567","expiration_timestamp":"1750116480","origin":{"type":"marketing"}},"pricing":{"billable":true,"pricing_model":"PMP","type":"regular","category":"marketing"}}]},"field":"messages"},
	{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"contacts":[{"profile":{"name":"Pablo M.","username":"@pablomorales","country_code":"US"},"wa_id":"16505551234","user_id":"user.9373795779eb6441c8adb2eaee5b848e7dd174ddd302d7db62142f4722d574b6"}],"statuses":[{"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUFERjg0NDEzNDdFODU3MUMxMAA=","status":"delivered","timestamp":"1750030073","recipient_id":"16505551234","pricing":{"billable":true,"pricing_model":"PMP","type":"regular","category":"marketing"}}]},"field":"messages"},
	{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"statuses":[{"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUFERjg0NDEzNDdFODU3MUMxMAA=","status":"read","timestamp":"1750030073","recipient_id":"16505551234"}]},"field":"messages"},
	{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"statuses":[{"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUFERjg0NDEzNDdFODU3MUMxMAA=","status":"read","timestamp":"1750030073","recipient_id":"16505551234"}]},"field":"messages"}
	]}]}`)
	b, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Items) != 4 {
		t.Fatalf("got %d items, want 4", len(b.Items))
	}
	const id = "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUFERjg0NDEzNDdFODU3MUMxMAA="
	wantKeys := []string{"s:" + id + ":sent", "s:" + id + ":delivered", "s:" + id + ":read", "s:" + id + ":read"}
	for i, k := range wantKeys {
		if b.Items[i].DedupeKey != k || b.Items[i].Type != TypeStatus {
			t.Errorf("item %d: %s %s, want %s %s", i, b.Items[i].Type, b.Items[i].DedupeKey, TypeStatus, k)
		}
	}
	seen := map[string]bool{}
	for _, it := range b.Items[:3] {
		if seen[it.DedupeKey] {
			t.Errorf("states share a key: %s", it.DedupeKey)
		}
		seen[it.DedupeKey] = true
	}
	if !seen[b.Items[3].DedupeKey] {
		t.Error("identical re-sent status does not repeat its key")
	}
}

func TestParseAccountUpdate(t *testing.T) {
	const partnerValue = `{
            "event": "PARTNER_ADDED",
            "waba_info": {
              "waba_id": "980198427658004",
              "owner_business_id": "2329417887457253",
              "solution_id": "1715120619246906",
              "solution_partner_business_ids": [
                "2949482758682047",
                "520744086200222"
              ]
            }
          }`
	body := []byte(`{
  "object": "whatsapp_business_account",
  "entry": [
    {
      "id": "2949482758682047",
      "time": 1744823932,
      "changes": [
        {
          "value": ` + partnerValue + `,
          "field": "account_update"
        }
      ]
    },
    {"id":"102290129340398","time":1751247548,"changes":[
      {"value":{"event":"PHONE_NUMBER_REMOVED","phone_number":"15550783881"},"field":"account_update"},
      {"value":{"event":"ACCOUNT_BANNED","ban_info":{"waba_ban_state":["DISABLE"],"waba_ban_date":"2026-01-01"}},"field":"account_update"},
      {"value":{"display_phone_number":"15550783881","event":"FLAGGED","current_limit":"TIER_10K"},"field":"phone_number_quality_update"},
      {"value":{"event":"APPROVED","message_template_id":1689556908129832,"message_template_name":"order_confirmation","message_template_language":"en-US","reason":"NONE","message_template_category":"UTILITY"},"field":"message_template_status_update"},
      {"value":{"anything":1},"field":"some_future_field"},
      {"value":{"messaging_product":"whatsapp","metadata":{"phone_number_id":"1"},"message_echoes":[]},"field":"smb_message_echoes"}
    ]}
  ]
}`)
	b, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Items) != 1 || len(b.Accounts) != 4 || b.Skipped != 2 {
		t.Fatalf("got %d items, %d accounts, %d skipped; want 1, 4, 2", len(b.Items), len(b.Accounts), b.Skipped)
	}
	// the template change is an item routed by business account, its value verbatim
	tmpl := `{"event":"APPROVED","message_template_id":1689556908129832,"message_template_name":"order_confirmation","message_template_language":"en-US","reason":"NONE","message_template_category":"UTILITY"}`
	if it := b.Items[0]; it.Type != TypeTemplateStatus || it.PhoneNumberID != "" || it.WabaID != "102290129340398" ||
		string(it.Data) != `{"template":`+tmpl+`}` || it.Sent.Unix() != 1751247548 || it.DedupeKey != "t:1751247548:"+tmpl {
		t.Errorf("template item = %+v (data %s)", it, it.Data)
	}
	want := []AccountChange{
		{WabaID: "980198427658004", EntryID: "2949482758682047", Field: "account_update", Event: "PARTNER_ADDED"},
		{WabaID: "102290129340398", EntryID: "102290129340398", Field: "account_update", Event: "PHONE_NUMBER_REMOVED", PhoneNumber: "15550783881"},
		{WabaID: "102290129340398", EntryID: "102290129340398", Field: "account_update", Event: "ACCOUNT_BANNED"},
		{WabaID: "102290129340398", EntryID: "102290129340398", Field: "phone_number_quality_update", Event: "FLAGGED", PhoneNumber: "15550783881"},
	}
	for i, w := range want {
		a := b.Accounts[i]
		if a.WabaID != w.WabaID || a.EntryID != w.EntryID || a.Field != w.Field || a.Event != w.Event || a.PhoneNumber != w.PhoneNumber {
			t.Errorf("account %d = %+v, want %+v", i, a, w)
		}
		if !json.Valid(a.Value) {
			t.Errorf("account %d: Value not valid JSON", i)
		}
	}
	if string(b.Accounts[0].Value) != partnerValue {
		t.Errorf("account value not verbatim:\n%s", b.Accounts[0].Value)
	}
	if !IsAccountField("account_update") || IsAccountField("messages") || IsAccountField("some_future_field") || IsAccountField(TypeTemplateStatus) {
		t.Error("IsAccountField wrong")
	}
}

func TestParseSkips(t *testing.T) {
	body := []byte(`{"object":"whatsapp_business_account","entry":[{"id":102290129340398,"changes":[
	  {"value":{"messaging_product":"whatsapp","metadata":{"phone_number_id":"106540352242922"},"errors":[{"code":131000,"title":"Something went wrong"}]},"field":"messages"},
	  {"value":{"messaging_product":"whatsapp","metadata":{"phone_number_id":"106540352242922"},"messages":[{"from":"1","type":"text"},"junk",{"from":"1","id":"wamid.OK","type":"text"}],"statuses":[{"id":"wamid.S"},{"status":"read"},{"id":"wamid.S","status":"read"}]},"field":"messages"},
	  {"value":{"messaging_product":"whatsapp","messages":[{"from":"1","id":"wamid.NOPHONE"}]},"field":"messages"},
	  {"value":"not an object","field":"messages"},
	  {"value":{"metadata":"weird"},"field":"messages"},
	  {"value":null,"field":"account_update"}
	]},{"id":"x"},{"id":"y","changes":null}]}`)
	b, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	// 1 error + 2 bad messages + 2 bad statuses + 1 message without phone id + 3 bad values.
	if len(b.Items) != 2 || b.Skipped != 9 || len(b.Accounts) != 0 {
		t.Fatalf("got %d items, %d accounts, %d skipped; want 2, 0, 9", len(b.Items), len(b.Accounts), b.Skipped)
	}
	if b.Items[0].DedupeKey != "m:wamid.OK" || b.Items[1].DedupeKey != "s:wamid.S:read" {
		t.Errorf("keys %q %q", b.Items[0].DedupeKey, b.Items[1].DedupeKey)
	}
	if b.Items[0].WabaID != "102290129340398" {
		t.Errorf("numeric entry id = %q", b.Items[0].WabaID)
	}
	if !strings.HasSuffix(string(b.Items[0].Data), `,"contact":null}`) {
		t.Errorf("contact without contacts: %s", b.Items[0].Data)
	}
}

func TestParseBSUIDContact(t *testing.T) {
	// whatsapp.md §3.3 username/BSUID sample: wa_id and from are "", match by user id.
	body := []byte(`{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"contacts":[{"profile":{"name":"Other"},"wa_id":"","user_id":"user.other"},{"profile":{"name":"Sheena Nelson","username":"@realsheenanelson","country_code":"US"},"wa_id":"","user_id":"user.93737..."}],"messages":[{"from":"","from_user_id":"user.93737...","id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=","timestamp":"1749416383","type":"text","text":{"body":"Does it come in another color?"}}]},"field":"messages"}]}]}`)
	b, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Items) != 1 {
		t.Fatalf("got %d items", len(b.Items))
	}
	var d messageData
	if err := json.Unmarshal(b.Items[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if want := `{"profile":{"name":"Sheena Nelson","username":"@realsheenanelson","country_code":"US"},"wa_id":"","user_id":"user.93737..."}`; string(d.Contact) != want {
		t.Errorf("contact = %s", d.Contact)
	}
}

func TestParseGarbage(t *testing.T) {
	for _, body := range []string{
		``,
		`not json`,
		`{"object":"whatsapp_business_account","entry":[`,
		`[]`,
		`"whatsapp_business_account"`,
		`{}`,
		`{"object":"page","entry":[]}`,
		`{"object":"whatsapp_business_account","entry":{"id":"1"}}`,
	} {
		if _, err := Parse([]byte(body)); err == nil {
			t.Errorf("Parse(%q) succeeded", body)
		}
	}
	if _, err := Parse([]byte(`{"object":"instagram","entry":[]}`)); !errors.Is(err, ErrNotWhatsApp) {
		t.Errorf("wrong object: err = %v, want ErrNotWhatsApp", err)
	}
	if b, err := Parse([]byte(`{"object":"whatsapp_business_account","entry":[]}`)); err != nil || len(b.Items) != 0 {
		t.Errorf("empty batch: %+v, %v", b, err)
	}
}

// bigBody builds a batch of n messages (with contacts) and n statuses over
// several entries and numbers, each message padded with pad bytes of text.
func bigBody(n, pad int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"object":"whatsapp_business_account","entry":[`)
	text := strings.Repeat("a\u00e9", pad/2)
	const perChange = 50
	for c := 0; c*perChange < n; c++ {
		if c > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"id":"1022901293%05d","changes":[{"value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"1555%07d","phone_number_id":"10654035%07d"},"contacts":[`, c, c%4, c%4)
		lo, hi := c*perChange, min(n, (c+1)*perChange)
		for i := lo; i < hi; i++ {
			if i > lo {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"profile":{"name":"User %d"},"wa_id":"1650%07d"}`, i, i)
		}
		sb.WriteString(`],"messages":[`)
		for i := lo; i < hi; i++ {
			if i > lo {
				sb.WriteByte(',')
			}
			b, _ := json.Marshal(text)
			fmt.Fprintf(&sb, `{"from":"1650%07d","id":"wamid.M%d","timestamp":"1749416383","type":"text","text":{"body":%s}}`, i, i, b)
		}
		sb.WriteString(`],"statuses":[`)
		for i := lo; i < hi; i++ {
			if i > lo {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"id":"wamid.S%d","status":"delivered","timestamp":"1750030073","recipient_id":"1650%07d","pricing":{"billable":true,"pricing_model":"PMP","type":"regular","category":"marketing"}}`, i, i)
		}
		sb.WriteString(`]},"field":"messages"}]}`)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

func TestParseLargeBatch(t *testing.T) {
	body := bigBody(1000, 2900) // the upstream's maximum: 1000 updates, ~3 MB
	if len(body) < 3<<20 {
		t.Fatalf("body is %d bytes, want >= 3 MiB", len(body))
	}
	if !json.Valid(body) {
		t.Fatal("generated body is not valid JSON")
	}
	b, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Items) != 2000 || b.Skipped != 0 {
		t.Fatalf("got %d items, %d skipped; want 2000, 0", len(b.Items), b.Skipped)
	}
	seen := make(map[string]bool, len(b.Items))
	for i, it := range b.Items {
		if seen[it.DedupeKey] {
			t.Fatalf("duplicate key %s", it.DedupeKey)
		}
		seen[it.DedupeKey] = true
		if it.Type == TypeMessage && bytes.HasSuffix(it.Data, []byte(`"contact":null}`)) {
			t.Fatalf("item %d: contact not matched", i)
		}
	}
}

func BenchmarkParse(b *testing.B) {
	body := bigBody(100, 200) // 100 messages (+100 statuses)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		batch, err := Parse(body)
		if err != nil || len(batch.Items) != 200 {
			b.Fatal(err, len(batch.Items))
		}
	}
}

func TestParseMediaIDs(t *testing.T) {
	body := `{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{` +
		`"metadata":{"phone_number_id":"2"},"messages":[` +
		`{"from":"3","id":"wamid.a","type":"image","image":{"id":"111","mime_type":"image/jpeg"}},` +
		`{"from":"3","id":"wamid.b","type":"document","document":{"id":222,"filename":"a.pdf"}},` +
		`{"from":"3","id":"wamid.c","type":"sticker","sticker":{"id":"333","animated":false}},` +
		`{"from":"3","id":"wamid.d","type":"text","text":{"body":"no media"}},` +
		`{"from":"3","id":"wamid.e","type":"image","image":"not an object"}]}}]}]}`
	b, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"111"}, {"222"}, {"333"}, nil, nil}
	if len(b.Items) != len(want) {
		t.Fatalf("%d items, want %d", len(b.Items), len(want))
	}
	for i, w := range want {
		if got := b.Items[i].ObjectIDs; !slices.Equal(got, w) {
			t.Errorf("item %d: media ids %q, want %q", i, got, w)
		}
	}
}

// TestParseSentTime: an item's upstream timestamp (unix seconds, a string as sent, or a number)
// becomes Item.Sent; a missing or malformed one is the zero time (unknown), and never costs the
// item.
func TestParseSentTime(t *testing.T) {
	body := `{"object":"whatsapp_business_account","entry":[{"id":"w","changes":[{"field":"messages","value":{
		"metadata":{"phone_number_id":"p"},
		"messages":[{"id":"a","timestamp":"1700000000"},{"id":"b","timestamp":1700000001},{"id":"c","timestamp":"soon"},{"id":"d"}],
		"statuses":[{"id":"s","status":"sent","timestamp":"1700000002"}]}}]}]}`
	b, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"m:a": 1700000000, "m:b": 1700000001, "m:c": 0, "m:d": 0, "s:s:sent": 1700000002}
	if len(b.Items) != len(want) {
		t.Fatalf("%d items, want %d", len(b.Items), len(want))
	}
	for _, it := range b.Items {
		got := int64(0)
		if !it.Sent.IsZero() {
			got = it.Sent.Unix()
		}
		if got != want[it.DedupeKey] {
			t.Errorf("%s: sent %d, want %d", it.DedupeKey, got, want[it.DedupeKey])
		}
	}
}

// TestParseTimelineFields: every message and status item carries its wamid, and a status item
// what it says for the messages table (status, timestamp, recipient, errors[0]); garbage in
// those fields reads as absent and never costs the item.
func TestParseTimelineFields(t *testing.T) {
	body := `{"object":"whatsapp_business_account","entry":[{"id":"w","changes":[{"field":"messages","value":{
		"metadata":{"phone_number_id":"p"},
		"messages":[{"id":"wamid.IN","from":"1555","timestamp":"1700000000"}],
		"statuses":[
			{"id":"wamid.A","status":"failed","timestamp":"1700000002","recipient_id":"1666","errors":[{"code":131026,"title":"Message undeliverable."},{"code":1}]},
			{"id":"wamid.B","status":"read","timestamp":"later","recipient_id":{"x":1},"errors":"none"},
			{"id":"wamid.C","status":"delivered","timestamp":1700000003,"recipient_id":1777,"errors":[{"code":"131047","title":7}]},
			{"id":"wamid.D","status":"sent","errors":[null]}]}}]}]}`
	b, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Items) != 5 || b.Skipped != 0 {
		t.Fatalf("%d items, %d skipped", len(b.Items), b.Skipped)
	}
	if it := b.Items[0]; it.WAMID != "wamid.IN" || it.Status != nil {
		t.Errorf("message: wamid %q, status %+v", it.WAMID, it.Status)
	}
	want := []store.MessageStatus{
		{Status: "failed", Timestamp: time.Unix(1700000002, 0), Recipient: "1666", ErrorCode: 131026, ErrorTitle: "Message undeliverable."},
		{Status: "read"},
		{Status: "delivered", Timestamp: time.Unix(1700000003, 0), Recipient: "1777", ErrorCode: 131047, ErrorTitle: "7"},
		{Status: "sent"},
	}
	for i, w := range want {
		it := b.Items[i+1]
		if it.WAMID != "wamid."+string(rune('A'+i)) || it.Status == nil || *it.Status != w {
			t.Errorf("status %d: wamid %q, %+v; want %+v", i, it.WAMID, it.Status, w)
		}
	}
}
