// Package inbound receives the webhooks the WhatsApp Cloud API (Meta) sends to the relay.
//
// The parsing half is pure: Verify answers the GET verification handshake, VerifySignature
// checks the X-Hub-Signature-256 HMAC over the raw POST body, and Parse splits the batch
// envelope into one store.IncomingItem per upstream message or status plus account-level
// changes. Upstream objects are kept verbatim (json.RawMessage copies of the received bytes,
// never aliasing the body), never re-marshalled through maps, so receivers see exactly what
// Meta sent.
//
// Handler is the whole endpoint (the Caddy module wabarelay_inbound only wires it): it
// verifies, parses, stores the events with their deliveries in one transaction (Store), hands
// the deliveries it can to this instance's dispatcher (HandOff), has the relay reload the scope
// of channels handed new media (Config.Invalidate), applies the account changes that deactivate
// channels, and answers 200 only for what it stored: 503 with Retry-After when the events could
// not be stored, so that the upstream sends them again.
//
// # Why posts take turns, and never wait long
//
// At most Config.Concurrency posts store at once (wabarelay_inbound: half the database
// connections), so that inbound webhooks cannot take every connection and the CPU from the
// dispatcher: the other half stays free for its claims and outcomes, and fewer transactions
// contend for the same rows and pages (bench/README.md, "Figures behind the defaults", has the
// measurements). Waiting posts queue in arrival order; one that has waited Config.MaxWait is
// stored at once, outside the limit, so that the upstream is always answered within its
// timeout: under overload the inbound handler keeps its promise and delivery slows to what is
// left (the backlog waits in the queue and drains once the load falls).
//
// # Why waiting posts are committed together
//
// With a Store that can store several posts in one transaction (GroupStore: *store.Store),
// the posts waiting for a turn are not stored one by one: when a turn frees, every post then
// waiting (up to 1,000 items) is stored in one transaction — one statement of each kind, one
// commit — and each is answered after that commit with its own counts, as if stored alone (an
// item two of them carry is stored once and is the other's duplicate). If the transaction
// fails, every post of the group is answered 503 and nothing of any of them is stored. A post
// that finds a turn free is stored alone, at once, so nothing waits at low load; under load the
// groups grow with the queue, and the cost per post falls as the load rises (bench/README.md,
// "Events", has the measurements).
//
// # Why deliveries are handed off
//
// A delivery for a webhook with a free dispatcher slot is inserted already claimed and started
// after the commit (HandOff): no claim query and no wake-up round trip per event. Only unordered
// webhooks with no due first attempt waiting take them, so a new event never overtakes an older
// one's first attempt (it may overtake due retries, which are out of order by nature).
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
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

// Types of the items Parse returns (store.IncomingItem.Type). They are the event "type" that
// webhooks subscribe to and receive ([docs/events.md]).
//
// [docs/events.md]: https://github.com/wabarelay/wabarelay/blob/main/docs/events.md
const (
	// TypeMessage is an incoming message (value.messages[] of a "messages" change).
	TypeMessage = "messages"
	// TypeStatus is a status update of an outgoing message (value.statuses[]).
	TypeStatus = "message_status"
	// TypeTemplateStatus is a change of a template's status (a
	// "message_template_status_update" change of a business account), one event per channel
	// of that account.
	TypeTemplateStatus = store.EventTemplateStatus
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
// AccountChange. Fields other than these, "messages" and "message_template_status_update"
// (an item routed by business account: TypeTemplateStatus) are skipped.
func IsAccountField(field string) bool { return accountFields[field] }

var accountFields = map[string]bool{
	"account_alerts":                     true,
	"account_review_update":              true,
	"account_update":                     true,
	"business_capability_update":         true,
	"message_template_components_update": true,
	"message_template_quality_update":    true,
	"phone_number_name_update":           true,
	"phone_number_quality_update":        true,
	"security":                           true,
	"template_category_update":           true,
}

// Batch is the result of Parse.
type Batch struct {
	// Items holds one entry per upstream message, per status and per template status change,
	// in body order, as store.StoreEvents takes them.
	Items []store.IncomingItem
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
			case c.Field == TypeTemplateStatus:
				b.addTemplate(string(e.ID), e.Time, c.Value)
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
	ID      flexString      `json:"id"`
	Time    json.RawMessage `json:"time"` // unix seconds, on account-level webhooks
	Changes []change        `json:"changes"`
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

// unixTime reads the upstream's "timestamp" (store.UpstreamTime: the zero time when unknown).
func unixTime(raw json.RawMessage) time.Time { return store.UpstreamTime(raw) }

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
		b.Items = append(b.Items, store.IncomingItem{
			Type:          TypeMessage,
			PhoneNumberID: phoneID,
			WabaID:        wabaID,
			DedupeKey:     "m:" + k.ID,
			Customer:      k.From,
			Data:          data,
			WAMID:         k.ID,
			ObjectIDs:     k.mediaIDs(),
			Sent:          unixTime(k.Timestamp),
		})
	}

	for _, s := range v.Statuses {
		id, st, ok := store.ParseMessageStatus(s)
		if !ok || id == "" || st.Status == "" {
			b.Skipped++
			continue
		}
		data := make([]byte, 0, len(`{"status":}`)+len(s))
		data = append(data, `{"status":`...)
		data = append(data, s...)
		data = append(data, '}')
		b.Items = append(b.Items, store.IncomingItem{
			Type:          TypeStatus,
			PhoneNumberID: phoneID,
			WabaID:        wabaID,
			DedupeKey:     "s:" + id + ":" + st.Status,
			Customer:      st.Recipient,
			Data:          data,
			WAMID:         id,
			Status:        &st,
			Sent:          st.Timestamp,
		})
	}
}

// addTemplate adds a template status change of business account wabaID (entry.id) sent at
// entryTime (entry.time) as an item routed by business account: data {"template": value}, the
// value verbatim. Its duplicate key is the time and the value's bytes (the change names no id of
// its own): a re-send is the same bytes.
func (b *Batch) addTemplate(wabaID string, entryTime, raw json.RawMessage) {
	if !isObject(raw) || wabaID == "" {
		b.Skipped++
		return
	}
	data := make([]byte, 0, len(`{"template":}`)+len(raw))
	data = append(data, `{"template":`...)
	data = append(data, raw...)
	data = append(data, '}')
	b.Items = append(b.Items, store.IncomingItem{
		Type:      TypeTemplateStatus,
		WabaID:    wabaID,
		DedupeKey: "t:" + string(entryTime) + ":" + string(raw),
		Data:      data,
		Sent:      unixTime(entryTime),
	})
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

// IsHealthField reports whether an account change of this field asks for a read of the health
// of the business account's numbers (DESIGN §5c "Number health").
func IsHealthField(field string) bool { return healthFields[field] }

var healthFields = map[string]bool{
	"phone_number_quality_update": true,
	"phone_number_name_update":    true,
	"account_update":              true,
	"business_capability_update":  true,
}
