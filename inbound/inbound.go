// Package inbound understands the webhooks the WhatsApp Cloud API (Meta) sends
// to the relay: the GET verification handshake, the X-Hub-Signature-256 HMAC
// over the raw POST body, and the batch envelope, which it splits into one
// event-worthy Item per upstream message or status plus account-level changes.
//
// The package is pure domain code: no HTTP server, no Caddy, no database.
// Upstream objects are kept verbatim (json.RawMessage copies of the received
// bytes, never aliasing the body), never re-marshalled through maps, so
// receivers see exactly what Meta sent.
package inbound

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kinds of Item. They double as the event "type" of DESIGN.md §5.
const (
	// KindMessage is an incoming message (value.messages[] of a "messages" change).
	KindMessage = "messages"
	// KindStatus is a status update of an outgoing message (value.statuses[]).
	KindStatus = "message_status"
)

// Object is the only webhook "object" value Parse accepts.
const Object = "whatsapp_business_account"

// SignatureHeader is the header carrying the upstream's body signature.
const SignatureHeader = "X-Hub-Signature-256"

// signaturePrefix precedes the hex digest in SignatureHeader.
const signaturePrefix = "sha256="

// ErrNotWhatsApp is returned (wrapped) by Parse when the body is JSON but its
// "object" is not "whatsapp_business_account".
var ErrNotWhatsApp = errors.New("inbound: webhook object is not " + Object)

// VerifySignature reports whether header (the X-Hub-Signature-256 value,
// "sha256=<hex>") is the HMAC-SHA256 of body keyed with appSecret. The hex
// digest may be upper or lower case; the comparison is constant-time. An empty
// or malformed header, or an empty appSecret, gives false.
func VerifySignature(appSecret string, body []byte, header string) bool {
	if appSecret == "" {
		return false
	}
	h := strings.TrimSpace(header)
	if len(h) < len(signaturePrefix) || !strings.EqualFold(h[:len(signaturePrefix)], signaturePrefix) {
		return false
	}
	h = h[len(signaturePrefix):]
	if len(h) != 2*sha256.Size {
		return false
	}
	got, err := hex.DecodeString(h)
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, []byte(appSecret))
	mac.Write(body)
	return hmac.Equal(got, mac.Sum(nil))
}

// Sign returns the X-Hub-Signature-256 value ("sha256=<lower-case hex>") the
// upstream would send for body under appSecret. Useful for tests and fakes.
func Sign(appSecret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(appSecret))
	mac.Write(body)
	return signaturePrefix + hex.EncodeToString(mac.Sum(nil))
}

// Verify answers the upstream's GET verification (query parameters hub.mode,
// hub.verify_token, hub.challenge): mode must be "subscribe" and token equal
// verifyToken (constant-time); it then returns challenge and true. An empty
// verifyToken never verifies. On failure it returns "" and false (the caller
// answers 403).
func Verify(mode, token, challenge, verifyToken string) (string, bool) {
	if mode != "subscribe" || verifyToken == "" {
		return "", false
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(verifyToken)) != 1 {
		return "", false
	}
	return challenge, true
}

// Item is one event-worthy thing from an upstream batch: one message or one
// status.
type Item struct {
	// Kind is KindMessage or KindStatus.
	Kind string
	// PhoneNumberID is value.metadata.phone_number_id, the routing key to a channel.
	PhoneNumberID string
	// WabaID is entry.id, the WhatsApp Business Account id.
	WabaID string
	// DedupeKey identifies the item across upstream re-sends: "m:"+message.id
	// for messages, "s:"+status.id+":"+status.status for statuses (each state
	// of a message — sent, delivered, read, … — is its own event; an identical
	// re-sent one is a duplicate).
	DedupeKey string
	// Data is the event's data object: {"message":<upstream message verbatim>,
	// "contact":<matching value.contacts entry verbatim, or null>} for
	// messages, {"status":<upstream status verbatim>} for statuses.
	Data json.RawMessage
	// MediaIDs are the upstream ids of the media a message carries (image, audio, video,
	// document, sticker): objects the channel has been handed, which the relay's scope admits.
	MediaIDs []string
	// Sent is the item's upstream timestamp (zero when absent or malformed): a copy of it can
	// only have been received after it.
	Sent time.Time
}

// AccountChange is an account-level change (no metadata.phone_number_id),
// routed by business account id, e.g. field "account_update" or
// "phone_number_quality_update".
type AccountChange struct {
	// WabaID is the business account the change concerns: value.waba_info.waba_id
	// when present (account_update PARTNER_ADDED, whose entry.id is the
	// partner's business id), otherwise entry.id.
	WabaID string
	// EntryID is entry.id as sent.
	EntryID string
	// Field is the change's field, e.g. "account_update".
	Field string
	// Value is the change's value object verbatim.
	Value json.RawMessage
	// Event is value.event when it is a string (e.g. "ACCOUNT_DELETED",
	// "PHONE_NUMBER_REMOVED", "ACCOUNT_BANNED", "PARTNER_ADDED"), else "".
	Event string
	// PhoneNumber is value.phone_number, or else value.display_phone_number,
	// when present; else "".
	PhoneNumber string
	// BanState is value.ban_info.waba_ban_state (DISABLED_UPDATE): "DISABLE",
	// "SCHEDULE_FOR_DISABLE" or "REINSTATE"; else "".
	BanState string
}

// Ban states of an account_update DISABLED_UPDATE (value.ban_info.waba_ban_state).
const (
	BanDisable            = "DISABLE"
	BanScheduleForDisable = "SCHEDULE_FOR_DISABLE"
	BanReinstate          = "REINSTATE"
)

// IsAccountField reports whether Parse reports changes with this field as
// AccountChange. Fields other than these and "messages" are skipped.
func IsAccountField(field string) bool { return accountFields[field] }

var accountFields = map[string]bool{
	"account_alerts":                     true,
	"account_review_update":              true,
	"account_update":                     true,
	"business_capability_update":         true,
	"message_template_components_update": true,
	"message_template_quality_update":    true,
	"message_template_status_update":     true,
	"phone_number_name_update":           true,
	"phone_number_quality_update":        true,
	"security":                           true,
	"template_category_update":           true,
}

// Batch is the result of Parse.
type Batch struct {
	// Items holds one entry per upstream message and per status, in body order.
	Items []Item
	// Accounts holds the account-level changes, in body order.
	Accounts []AccountChange
	// Skipped counts what was ignored: changes with an unknown field or an
	// undecodable value, messages/statuses without the fields needed to key
	// them (id, status, phone_number_id), and value.errors entries.
	Skipped int
}

// Parse splits a webhook body (object "whatsapp_business_account") into items
// and account changes, across every entry and every change. Unknown fields and
// undecodable changes are ignored and counted in Skipped. A body that is not
// JSON, or whose object is not "whatsapp_business_account", is an error.
func Parse(body []byte) (Batch, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Batch{}, fmt.Errorf("inbound: decode webhook: %w", err)
	}
	if env.Object != Object {
		return Batch{}, fmt.Errorf("%w (got %q)", ErrNotWhatsApp, env.Object)
	}
	var b Batch
	for _, e := range env.Entry {
		for _, c := range e.Changes {
			switch {
			case c.Field == "messages":
				b.addMessages(string(e.ID), c.Value)
			case accountFields[c.Field]:
				b.addAccount(string(e.ID), c.Field, c.Value)
			default:
				b.Skipped++
			}
		}
	}
	return b, nil
}

type envelope struct {
	Object string  `json:"object"`
	Entry  []entry `json:"entry"`
}

type entry struct {
	ID      flexString `json:"id"`
	Changes []change   `json:"changes"`
}

type change struct {
	Field string          `json:"field"`
	Value json.RawMessage `json:"value"`
}

type messagesValue struct {
	Metadata struct {
		PhoneNumberID flexString `json:"phone_number_id"`
	} `json:"metadata"`
	Contacts []json.RawMessage `json:"contacts"`
	Messages []json.RawMessage `json:"messages"`
	Statuses []json.RawMessage `json:"statuses"`
	Errors   []json.RawMessage `json:"errors"`
}

type contactKeys struct {
	WaID   string `json:"wa_id"`
	UserID string `json:"user_id"`
}

type messageKeys struct {
	ID         string          `json:"id"`
	Timestamp  json.RawMessage `json:"timestamp"`
	From       string          `json:"from"`
	FromUserID string          `json:"from_user_id"`
	Image      mediaRef        `json:"image"`
	Audio      mediaRef        `json:"audio"`
	Video      mediaRef        `json:"video"`
	Document   mediaRef        `json:"document"`
	Sticker    mediaRef        `json:"sticker"`
}

// mediaRef is the part of a media object (image, audio, …) that matters here: its upstream id.
// A value of another shape leaves it empty.
type mediaRef struct{ ID string }

func (m *mediaRef) UnmarshalJSON(b []byte) error {
	var v struct {
		ID flexString `json:"id"`
	}
	if json.Unmarshal(b, &v) == nil {
		m.ID = string(v.ID)
	}
	return nil
}

// mediaIDs returns the ids of the media a message carries.
func (k *messageKeys) mediaIDs() []string {
	var ids []string
	for _, m := range [...]mediaRef{k.Image, k.Audio, k.Video, k.Document, k.Sticker} {
		if m.ID != "" {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

type statusKeys struct {
	ID        string          `json:"id"`
	Status    string          `json:"status"`
	Timestamp json.RawMessage `json:"timestamp"`
}

// unixTime reads the upstream's "timestamp" (unix seconds, sent as a string; a number is taken
// too). Anything else is the zero time: unknown.
func unixTime(raw json.RawMessage) time.Time {
	var v string
	if json.Unmarshal(raw, &v) != nil {
		v = string(raw)
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil || sec <= 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}

type accountValue struct {
	Event              json.RawMessage `json:"event"`
	PhoneNumber        flexString      `json:"phone_number"`
	DisplayPhoneNumber flexString      `json:"display_phone_number"`
	WabaInfo           struct {
		WabaID flexString `json:"waba_id"`
	} `json:"waba_info"`
	BanInfo struct {
		WabaBanState flexString `json:"waba_ban_state"`
	} `json:"ban_info"`
}

func (b *Batch) addMessages(wabaID string, raw json.RawMessage) {
	var v messagesValue
	if !isObject(raw) || json.Unmarshal(raw, &v) != nil {
		b.Skipped++
		return
	}
	b.Skipped += len(v.Errors)
	phoneID := string(v.Metadata.PhoneNumberID)
	if phoneID == "" {
		b.Skipped += len(v.Messages) + len(v.Statuses)
		return
	}

	var contacts []contactKeys
	if len(v.Messages) > 0 && len(v.Contacts) > 0 {
		contacts = make([]contactKeys, len(v.Contacts))
		for i, c := range v.Contacts {
			_ = json.Unmarshal(c, &contacts[i]) // a bad contact just never matches
		}
	}

	for _, m := range v.Messages {
		var k messageKeys
		if !isObject(m) || json.Unmarshal(m, &k) != nil || k.ID == "" {
			b.Skipped++
			continue
		}
		contact := json.RawMessage("null")
		for i, c := range contacts {
			if (k.From != "" && c.WaID == k.From) || (k.FromUserID != "" && c.UserID == k.FromUserID) {
				contact = v.Contacts[i]
				break
			}
		}
		data := make([]byte, 0, len(`{"message":,"contact":}`)+len(m)+len(contact))
		data = append(data, `{"message":`...)
		data = append(data, m...)
		data = append(data, `,"contact":`...)
		data = append(data, contact...)
		data = append(data, '}')
		b.Items = append(b.Items, Item{
			Kind:          KindMessage,
			PhoneNumberID: phoneID,
			WabaID:        wabaID,
			DedupeKey:     "m:" + k.ID,
			Data:          data,
			MediaIDs:      k.mediaIDs(),
			Sent:          unixTime(k.Timestamp),
		})
	}

	for _, s := range v.Statuses {
		var k statusKeys
		if !isObject(s) || json.Unmarshal(s, &k) != nil || k.ID == "" || k.Status == "" {
			b.Skipped++
			continue
		}
		data := make([]byte, 0, len(`{"status":}`)+len(s))
		data = append(data, `{"status":`...)
		data = append(data, s...)
		data = append(data, '}')
		b.Items = append(b.Items, Item{
			Kind:          KindStatus,
			PhoneNumberID: phoneID,
			WabaID:        wabaID,
			DedupeKey:     "s:" + k.ID + ":" + k.Status,
			Data:          data,
			Sent:          unixTime(k.Timestamp),
		})
	}
}

func (b *Batch) addAccount(entryID, field string, raw json.RawMessage) {
	var v accountValue
	if !isObject(raw) || json.Unmarshal(raw, &v) != nil {
		b.Skipped++
		return
	}
	var event string
	_ = json.Unmarshal(v.Event, &event) // non-string or absent → ""
	waba := string(v.WabaInfo.WabaID)
	if waba == "" {
		waba = entryID
	}
	phone := string(v.PhoneNumber)
	if phone == "" {
		phone = string(v.DisplayPhoneNumber)
	}
	b.Accounts = append(b.Accounts, AccountChange{
		WabaID:      waba,
		EntryID:     entryID,
		Field:       field,
		Value:       raw,
		Event:       event,
		PhoneNumber: phone,
		BanState:    string(v.BanInfo.WabaBanState),
	})
}

// isObject reports whether raw is a JSON object (after leading whitespace).
func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) > 0 && raw[0] == '{'
}

// flexString decodes a JSON string or number as its text (ids are strings in
// the documented payloads, but a number must not fail the whole batch); null
// and other types decode as "".
type flexString string

// UnmarshalJSON implements json.Unmarshaler.
func (f *flexString) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil
	}
	switch {
	case b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*f = flexString(s)
	case b[0] == '-' || (b[0] >= '0' && b[0] <= '9'):
		*f = flexString(b)
	default:
		*f = ""
	}
	return nil
}
