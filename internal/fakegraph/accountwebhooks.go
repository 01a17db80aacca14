package fakegraph

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The four account webhooks after which the relay reads a number's health (DESIGN §5c "Number
// health"), as the upstream sends them: object whatsapp_business_account, one entry whose id is
// the number's business account and whose time is the trigger's unix time, one change of the
// field. Payloads follow Meta's webhook reference pages (research/whatsapp-limits.md):
//
//	phone_number_quality_update  {display_phone_number, event, [old_limit,] current_limit,
//	                              max_daily_conversations_per_business}
//	phone_number_name_update     {display_phone_number, decision, requested_verified_name,
//	                              rejection_reason}
//	account_update               {phone_number, event, [violation_info | restriction_info | ban_info]}
//	business_capability_update   {max_daily_conversation_per_phone, max_daily_conversations_per_business,
//	                              max_phone_numbers_per_business, max_phone_numbers_per_waba}
//
// Like the upstream's, none of them carries the quality rating: the fake changes what its GET
// /{pnid} answers (the number's stored health) before it posts, so that the relay's read after
// the webhook finds the new values.

// The account webhook fields EmitAccountUpdate sends.
const (
	FieldQualityUpdate      = "phone_number_quality_update"
	FieldNameUpdate         = "phone_number_name_update"
	FieldAccountUpdate      = "account_update"
	FieldCapabilityUpdate   = "business_capability_update"
	defaultLimit            = "TIER_2K" // the fake's default whatsapp_business_manager_messaging_limit
	defaultAccountEventName = "ACCOUNT_VIOLATION"
)

// AccountUpdate is one account webhook for EmitAccountUpdate (and POST /_fake/account_webhook).
type AccountUpdate struct {
	// PhoneNumberID is the number concerned; "" means LastSignup. The webhook's entry id is its
	// business account.
	PhoneNumberID string `json:"phone_number_id"`
	// Field is one of FieldQualityUpdate (the default when ""), FieldNameUpdate,
	// FieldAccountUpdate and FieldCapabilityUpdate.
	Field string `json:"field"`
	// Event is value.event of a quality update (default FLAGGED; also UNFLAGGED, DOWNGRADE,
	// UPGRADE, THROUGHPUT_UPGRADE, ONBOARDING) or of an account_update (default
	// ACCOUNT_VIOLATION; also ACCOUNT_RESTRICTION, DISABLED_UPDATE,
	// VOLUME_BASED_PRICING_TIER_UPDATE, ...), or value.decision of a name update (default
	// APPROVED; also REJECTED, PENDING, DEFERRED). Sent verbatim. An account_update
	// DISABLED_UPDATE carries ban_info.waba_ban_state DISABLE: the relay then deactivates the
	// business account's channels, as for a real ban.
	Event string `json:"event"`
	// QualityRating is the number's quality_rating from now on. "" keeps it, except that a
	// quality update FLAGGED makes it YELLOW and UNFLAGGED makes it GREEN.
	QualityRating string `json:"quality_rating"`
	// MessagingLimit is the number's whatsapp_business_manager_messaging_limit from now on,
	// e.g. TIER_10K ("" keeps it); a quality update reports it as current_limit and
	// max_daily_conversations_per_business, a capability update as the number of
	// conversations (TIER_10K → 10000, TIER_UNLIMITED → -1).
	MessagingLimit string `json:"messaging_limit"`
	// NameStatus is the number's name_status from now on. "" keeps it, except that a name
	// update's decision sets it: APPROVED → APPROVED, REJECTED → DECLINED, PENDING and
	// DEFERRED → PENDING_REVIEW.
	NameStatus string `json:"name_status"`
	// Throughput is the number's throughput.level from now on ("" keeps it; a quality update
	// THROUGHPUT_UPGRADE makes it HIGH).
	Throughput string `json:"throughput"`
}

// EmitAccountUpdate changes the number's stored health as u says and then sends u's webhook to
// callbackURL, signed with appSecret (X-Hub-Signature-256), as the upstream does. It reports the
// callback's answer (any status; an error only when u cannot be sent or the callback cannot be
// reached). The health changes even when the callback cannot be reached.
func (s *Server) EmitAccountUpdate(ctx context.Context, callbackURL, appSecret string, u AccountUpdate) (Emitted, error) {
	if callbackURL == "" {
		return Emitted{}, &badInboundError{"no callback URL"}
	}
	if appSecret == "" {
		return Emitted{}, &badInboundError{"no app secret to sign with"}
	}
	if u.Field == "" {
		u.Field = FieldQualityUpdate
	}
	pnid := u.PhoneNumberID
	if pnid == "" {
		if pnid = s.LastSignup(); pnid == "" {
			return Emitted{}, &badInboundError{"no phone_number_id given and no number signed up yet (connect a channel first)"}
		}
	}
	s.mu.Lock()
	n := s.numbers[pnid]
	if n == nil {
		s.mu.Unlock()
		return Emitted{}, &badInboundError{"unknown phone_number_id " + pnid}
	}
	oldLimit := or(n.health.MessagingLimit, defaultLimit)
	var value any
	display := digitsOf(n.display)
	switch u.Field {
	case FieldQualityUpdate:
		event := or(u.Event, "FLAGGED")
		switch {
		case u.QualityRating != "":
		case event == "FLAGGED":
			u.QualityRating = "YELLOW"
		case event == "UNFLAGGED":
			u.QualityRating = "GREEN"
		}
		if u.Throughput == "" && event == "THROUGHPUT_UPGRADE" {
			u.Throughput = "HIGH"
		}
		limit := or(u.MessagingLimit, oldLimit)
		v := qualityValue{DisplayPhoneNumber: display, Event: event, CurrentLimit: limit, MaxDaily: limit}
		if event == "UPGRADE" || event == "DOWNGRADE" {
			v.OldLimit = oldLimit
		}
		value = v
	case FieldNameUpdate:
		decision := or(u.Event, "APPROVED")
		if u.NameStatus == "" {
			u.NameStatus = map[string]string{"APPROVED": "APPROVED", "REJECTED": "DECLINED", "PENDING": "PENDING_REVIEW", "DEFERRED": "PENDING_REVIEW"}[decision]
		}
		v := nameValue{DisplayPhoneNumber: display, Decision: decision, RequestedVerifiedName: n.verified}
		if decision == "REJECTED" {
			reason := "NAME_ENDCLIENT_NOTRELATED" // one of the reference page's values
			v.RejectionReason = &reason
		}
		value = v
	case FieldAccountUpdate:
		event := or(u.Event, defaultAccountEventName)
		v := map[string]any{"phone_number": display, "event": event}
		switch event {
		case "ACCOUNT_VIOLATION":
			v["violation_info"] = map[string]string{"violation_type": "SPAM"}
		case "ACCOUNT_RESTRICTION":
			v["restriction_info"] = []map[string]any{{"restriction_type": "RESTRICTED_BIZ_INITIATED_MESSAGING",
				"expiration": time.Now().Add(24 * time.Hour).Unix()}}
		case "DISABLED_UPDATE":
			v["ban_info"] = map[string]string{"waba_ban_state": "DISABLE", "waba_ban_date": time.Now().UTC().Format("2006-01-02")}
		}
		value = v
	case FieldCapabilityUpdate:
		convs := limitConversations(or(u.MessagingLimit, oldLimit))
		value = capabilityValue{MaxPerPhone: convs, MaxPerBusiness: convs, MaxNumbersPerBusiness: 2, MaxNumbersPerWABA: 2}
	default:
		s.mu.Unlock()
		return Emitted{}, &badInboundError{"field must be one of " + FieldQualityUpdate + ", " + FieldNameUpdate + ", " + FieldAccountUpdate + ", " + FieldCapabilityUpdate}
	}
	h := &n.health
	h.QualityRating = or(u.QualityRating, h.QualityRating)
	h.MessagingLimit = or(u.MessagingLimit, h.MessagingLimit)
	h.NameStatus = or(u.NameStatus, h.NameStatus)
	h.Throughput = or(u.Throughput, h.Throughput)
	waba := or(n.waba, pnid)
	s.mu.Unlock()

	res := Emitted{PhoneNumberID: pnid}
	res.Payload = s.accountWebhookBody(waba, u.Field, value)
	var err error
	res.Status, res.Body, err = s.postWebhook(ctx, callbackURL, appSecret, res.Payload)
	return res, err
}

// Account webhook values, their members in the order of Meta's reference pages.
type (
	qualityValue struct {
		DisplayPhoneNumber string `json:"display_phone_number"`
		Event              string `json:"event"`
		OldLimit           string `json:"old_limit,omitempty"`
		CurrentLimit       string `json:"current_limit"`
		MaxDaily           string `json:"max_daily_conversations_per_business"`
	}
	nameValue struct {
		DisplayPhoneNumber    string  `json:"display_phone_number"`
		Decision              string  `json:"decision"`
		RequestedVerifiedName string  `json:"requested_verified_name"`
		RejectionReason       *string `json:"rejection_reason"`
	}
	capabilityValue struct {
		MaxPerPhone           int `json:"max_daily_conversation_per_phone"`
		MaxPerBusiness        int `json:"max_daily_conversations_per_business"`
		MaxNumbersPerBusiness int `json:"max_phone_numbers_per_business"`
		MaxNumbersPerWABA     int `json:"max_phone_numbers_per_waba"`
	}
)

// limitConversations is a messaging limit tier as business_capability_update reports it: the
// number of conversations, -1 for unlimited (TIER_2K → 2000; an unknown tier → 250).
func limitConversations(tier string) int {
	t := strings.TrimPrefix(tier, "TIER_")
	if t == "UNLIMITED" {
		return -1
	}
	mult := 1
	switch {
	case strings.HasSuffix(t, "K"):
		t, mult = strings.TrimSuffix(t, "K"), 1000
	case strings.HasSuffix(t, "M"):
		t, mult = strings.TrimSuffix(t, "M"), 1000000
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 {
		return 250
	}
	return n * mult
}

// accountWebhookBody is the upstream's envelope around one account change of a business
// account (with entry.time, which account webhooks carry and "messages" webhooks do not).
func (s *Server) accountWebhookBody(waba, field string, value any) []byte {
	type change struct {
		Value any    `json:"value"`
		Field string `json:"field"`
	}
	type entry struct {
		ID      string   `json:"id"`
		Time    int64    `json:"time"`
		Changes []change `json:"changes"`
	}
	b := marshal(struct {
		Entry  []entry `json:"entry"`
		Object string  `json:"object"`
	}{[]entry{{waba, time.Now().Unix(), []change{{value, field}}}}, "whatsapp_business_account"})
	if !s.plainJSON {
		b = graphEscape(b)
	}
	return b
}

// handleAccountWebhook serves POST /_fake/account_webhook: an AccountUpdate as JSON (every
// member optional), answered like POST /_fake/inbound.
func (s *Server) handleAccountWebhook(w http.ResponseWriter, r *http.Request) {
	var u AccountUpdate
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&u); err != nil {
			demoError(w, http.StatusBadRequest, "body: "+err.Error())
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	res, err := s.EmitAccountUpdate(ctx, s.callback, s.appSecret, u)
	if err != nil {
		emitError(w, err)
		return
	}
	writeDemoJSON(w, res.Status, struct {
		PhoneNumberID  string          `json:"phone_number_id"`
		Callback       string          `json:"callback"`
		CallbackStatus int             `json:"callback_status"`
		CallbackBody   string          `json:"callback_body"`
		Payload        json.RawMessage `json:"payload"`
	}{res.PhoneNumberID, s.callback, res.Status, string(res.Body), res.Payload})
}
