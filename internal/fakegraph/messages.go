package fakegraph

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Top-level members of a POST /{pnid}/messages body the real endpoint knows (§1.1-§1.3, [OAS]);
// anything else is rejected with "(#100) Unexpected key ...". access_token and appsecret_proof are
// Graph's own parameters, accepted anywhere.
var messageKeys = map[string]bool{
	"messaging_product": true, "recipient_type": true, "to": true, "recipient": true, "type": true,
	"context": true, "biz_opaque_callback_data": true, "preview_url": true,
	"status": true, "message_id": true, "typing_indicator": true,
	"text": true, "template": true, "image": true, "audio": true, "video": true, "document": true,
	"sticker": true, "location": true, "contacts": true, "interactive": true, "reaction": true,
	"access_token": true, "appsecret_proof": true,
}

var messageTypes = []string{"audio", "button", "contacts", "document", "image", "interactive",
	"location", "reaction", "sticker", "template", "text", "video"}

var (
	textKeys      = map[string]bool{"body": true, "preview_url": true}
	templateKeys  = map[string]bool{"name": true, "language": true, "components": true, "namespace": true}
	languageKeys  = map[string]bool{"code": true, "policy": true}
	componentKeys = map[string]bool{"type": true, "sub_type": true, "index": true, "parameters": true, "cards": true}
)

const maxTextBody = 4096

func (s *Server) handleMessages(rc *reqCtx, pnid string) {
	body := decodeObject(rc.body)

	if k := firstUnknown(body, messageKeys); k != "" {
		s.fail(rc, errUnexpectedKey(k, ""))
		return
	}
	mp, ok := str(body, "messaging_product")
	if !ok || mp == "" {
		s.fail(rc, errRequired("messaging_product"))
		return
	}
	if !strings.EqualFold(mp, "whatsapp") {
		s.fail(rc, errParam(`Param messaging_product must be one of {WHATSAPP} - got "`+mp+`".`))
		return
	}

	// Mark as read / typing indicator (§1.3).
	if _, has := body["status"]; has {
		st, _ := str(body, "status")
		if !strings.EqualFold(st, "read") {
			s.fail(rc, errParam(`Param status must be one of {READ} - got "`+st+`".`))
			return
		}
		mid, _ := str(body, "message_id")
		if mid == "" {
			s.fail(rc, errRequired("message_id"))
			return
		}
		if !strings.HasPrefix(mid, "wamid.") {
			s.fail(rc, waErr(131009, "Parameter value is not valid", "Message ID is not valid"))
			return
		}
		s.ok(rc, []byte(`{"success":true}`))
		return
	}

	to, _ := str(body, "to")
	if to == "" {
		s.fail(rc, errRequired("to"))
		return
	}
	typ := "text"
	if _, has := body["type"]; has {
		t, _ := str(body, "type")
		typ = strings.ToLower(t)
		if !slices.Contains(messageTypes, typ) {
			s.fail(rc, errParam(`Param type must be one of {AUDIO, BUTTON, CONTACTS, DOCUMENT, IMAGE, INTERACTIVE, LOCATION, REACTION, STICKER, TEMPLATE, TEXT, VIDEO} - got "`+t+`".`))
			return
		}
	}

	isTemplate := false
	switch typ {
	case "text":
		if e := validateText(body["text"]); e != nil {
			s.fail(rc, e)
			return
		}
	case "template":
		isTemplate = true
		if e := s.validateTemplate(pnid, body["template"]); e != nil {
			s.fail(rc, e)
			return
		}
	case "button":
		// Only the On-Premises API had it; Cloud API answers with an invalid parameter.
		s.fail(rc, errInvalidParam("Message type button is not supported for sending"))
		return
	default:
		raw, has := body[typ]
		if !has || !isObject(raw) {
			s.fail(rc, errRequired(typ))
			return
		}
	}

	waID, userID := recipientIDs(to)
	if waID == "" && userID == "" {
		s.fail(rc, errInvalidParam("Recipient phone number is not valid"))
		return
	}

	s.mu.RLock()
	registered := s.numbers[pnid] != nil && s.numbers[pnid].registered
	s.mu.RUnlock()
	if !registered {
		s.fail(rc, waErr(133010, "Account not registered", "Account not registered"))
		return
	}

	if waID != "" {
		if e := s.takeScripted(waID); e != nil { // script.go
			s.fail(rc, e)
			return
		}
	}

	b := make([]byte, 0, 256)
	b = append(b, `{"messaging_product":"whatsapp","contacts":[{"input":`...)
	b = appendJSONString(b, to)
	b = append(b, `,"wa_id":`...)
	b = appendJSONString(b, waID)
	if userID != "" {
		b = append(b, `,"user_id":`...)
		b = appendJSONString(b, userID)
	}
	b = append(b, `}],"messages":[{"id":`...)
	wamid := s.newWAMID(waID)
	b = appendJSONString(b, wamid)
	if isTemplate {
		b = append(b, `,"message_status":"accepted"`...)
	}
	b = append(b, `}]}`...)
	s.ok(rc, b)
	if s.callback != "" && s.appSecret != "" && waID != "" {
		var tmplRaw json.RawMessage // (nil: not a template)
		if isTemplate {
			tmplRaw = body["template"]
		}
		go s.reportStatuses(pnid, wamid, waID, s.statusPricing(pnid, tmplRaw), time.Now())
	}
}

func validateText(raw json.RawMessage) *gerr {
	if raw == nil || !isObject(raw) {
		return errRequired("text.body")
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	if k := firstUnknown(m, textKeys); k != "" {
		return errUnexpectedKey(k, "text")
	}
	body, _ := str(m, "body")
	if body == "" {
		return errRequired("text.body")
	}
	if utf8.RuneCountInString(body) > maxTextBody {
		return errParam("Param text['body'] must be at most 4096 characters long.")
	}
	return nil
}

type sentComponent struct {
	Type       string            `json:"type"`
	Parameters []json.RawMessage `json:"parameters"`
}

func (s *Server) validateTemplate(pnid string, raw json.RawMessage) *gerr {
	if raw == nil || !isObject(raw) {
		return errRequired("template")
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	if k := firstUnknown(m, templateKeys); k != "" {
		return errUnexpectedKey(k, "template")
	}
	name, _ := str(m, "name")
	if name == "" {
		return errRequired("template['name']")
	}
	lraw, has := m["language"]
	if !has || !isObject(lraw) {
		return errRequired("template['language']")
	}
	var lang map[string]json.RawMessage
	_ = json.Unmarshal(lraw, &lang)
	if k := firstUnknown(lang, languageKeys); k != "" {
		return errUnexpectedKey(k, "template['language']")
	}
	code, _ := str(lang, "code")
	if code == "" {
		return errRequired("template['language']['code']")
	}

	var comps []json.RawMessage
	if craw, has := m["components"]; has {
		if err := json.Unmarshal(craw, &comps); err != nil {
			return errParam("Param template['components'] must be an array.")
		}
	}
	bodyParams, headerParams := 0, 0
	for i, c := range comps {
		var cm map[string]json.RawMessage
		if err := json.Unmarshal(c, &cm); err != nil {
			return errParam(fmt.Sprintf("Param template['components'][%d] must be a JSON object.", i))
		}
		if k := firstUnknown(cm, componentKeys); k != "" {
			return errUnexpectedKey(k, fmt.Sprintf("template['components'][%d]", i))
		}
		var sc sentComponent
		_ = json.Unmarshal(c, &sc)
		for _, p := range sc.Parameters {
			var pm struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			_ = json.Unmarshal(p, &pm)
			if strings.EqualFold(pm.Type, "text") && (pm.Text == nil || *pm.Text == "") {
				return errInvalidParam("Parameter 'text' is mandatory for component parameter type 'text'")
			}
		}
		switch strings.ToLower(sc.Type) {
		case "body":
			bodyParams += len(sc.Parameters)
		case "header":
			headerParams += len(sc.Parameters)
		}
	}

	s.mu.RLock()
	var found *tmpl
	if n := s.numbers[pnid]; n != nil {
		if w := s.wabas[n.waba]; w != nil {
			for _, t := range w.templates {
				if t.Name != name {
					continue
				}
				if t.Language == code {
					found = t
					break
				}
			}
		}
	}
	s.mu.RUnlock()

	notExist := waErr(132001, "Template name does not exist in the translation",
		"template name ("+name+") does not exist in "+code)
	if found == nil {
		return notExist
	}
	switch strings.ToUpper(found.Status) {
	case "APPROVED":
	case "PAUSED":
		return waErr(132015, "Template is paused", "Template is paused due to low quality so it cannot be sent in a template message.")
	case "DISABLED":
		return waErr(132016, "Template is disabled", "Template has been paused too many times due to low quality and is now permanently disabled.")
	default:
		return notExist
	}
	if bodyParams != found.expBody {
		return waErr(132000, "Number of parameters does not match the expected number of params",
			fmt.Sprintf("body: number of localizable_params (%d) does not match the expected number of params (%d)", bodyParams, found.expBody))
	}
	if found.expHeader >= 0 && headerParams != found.expHeader {
		return waErr(132000, "Number of parameters does not match the expected number of params",
			fmt.Sprintf("header: number of localizable_params (%d) does not match the expected number of params (%d)", headerParams, found.expHeader))
	}
	return nil
}

// recipientIDs derives wa_id (digits of to) or, for a business-scoped user id ("user.…", §1.4),
// the user_id with an empty wa_id.
func recipientIDs(to string) (waID, userID string) {
	if strings.HasPrefix(to, "user.") {
		return "", to
	}
	var d []byte
	for i := 0; i < len(to); i++ {
		if c := to[i]; c >= '0' && c <= '9' {
			d = append(d, c)
		}
	}
	return string(d), ""
}

// newWAMID returns a unique message id shaped like Meta's: "wamid." + base64 of
// 1C 18 <len> <wa_id> 15 02 00 11 18 12 <18 upper-hex chars> 00.
func (s *Server) newWAMID(waID string) string {
	if len(waID) > 64 {
		waID = waID[:64]
	}
	n := s.seq.Add(1)
	const hexd = "0123456789ABCDEF"
	var raw [9]byte
	copy(raw[:3], s.salt[:])
	for i := 8; i >= 3; i-- {
		raw[i] = byte(n)
		n >>= 8
	}
	buf := make([]byte, 0, 32+len(waID))
	buf = append(buf, 0x1c, 0x18, byte(len(waID)))
	buf = append(buf, waID...)
	buf = append(buf, 0x15, 0x02, 0x00, 0x11, 0x18, 0x12)
	for _, c := range raw {
		buf = append(buf, hexd[c>>4], hexd[c&15])
	}
	buf = append(buf, 0x00)
	return "wamid." + base64.StdEncoding.EncodeToString(buf)
}

// ---- small JSON helpers ----

func firstUnknown(m map[string]json.RawMessage, known map[string]bool) string {
	var bad []string
	for k := range m {
		if !known[k] {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return ""
	}
	slices.Sort(bad)
	return bad[0]
}

// str reads a member as a string; JSON numbers are accepted as their literal text.
func str(m map[string]json.RawMessage, key string) (string, bool) {
	raw, ok := m[key]
	if !ok {
		return "", false
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var v string
		if json.Unmarshal(raw, &v) == nil {
			return v, true
		}
		return "", false
	}
	if len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')) {
		return string(raw), true
	}
	return "", false
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return append(b, marshal(s)...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// placeholderRE matches {{1}} and {{named_param}} in template component text.
var placeholderRE = regexp.MustCompile(`\{\{\s*([A-Za-z0-9_]+)\s*\}\}`)

func countPlaceholders(text string) int {
	seen := map[string]bool{}
	for _, m := range placeholderRE.FindAllStringSubmatch(text, -1) {
		seen[m[1]] = true
	}
	return len(seen)
}
