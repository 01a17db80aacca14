package fakegraph

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// params returns the request's parameters the way Graph reads them: a JSON object body, else a
// form body, plus query parameters not already given in the body.
func params(rc *reqCtx) map[string]json.RawMessage {
	m := decodeObject(rc.body)
	if len(m) == 0 && len(rc.body) > 0 {
		if ct, _, _ := mime.ParseMediaType(rc.r.Header.Get("Content-Type")); ct == "application/x-www-form-urlencoded" {
			if v, err := url.ParseQuery(string(rc.body)); err == nil {
				addValues(m, v)
			}
		}
	}
	if rc.r.URL.RawQuery != "" {
		addValues(m, rc.r.URL.Query())
	}
	return m
}

func addValues(m map[string]json.RawMessage, v url.Values) {
	for k, vs := range v {
		if _, has := m[k]; has || len(vs) == 0 {
			continue
		}
		x := strings.TrimSpace(vs[0])
		if len(x) > 0 && (x[0] == '{' || x[0] == '[') && json.Valid([]byte(x)) {
			m[k] = json.RawMessage(x)
			continue
		}
		b, _ := json.Marshal(vs[0])
		m[k] = b
	}
}

// ---- GET /oauth/access_token (§4.4) ----

func (s *Server) handleOAuth(rc *reqCtx) {
	if rc.r.Method != http.MethodGet && rc.r.Method != http.MethodPost {
		s.fail(rc, errUnsupported(rc.r.Method, "oauth"))
		return
	}
	p := params(rc)
	clientID, _ := str(p, "client_id")
	secret, _ := str(p, "client_secret")
	code, _ := str(p, "code")
	switch {
	case clientID == "":
		s.fail(rc, &gerr{status: 400, code: 101, typ: "OAuthException", msg: "Missing client_id parameter."})
		return
	case s.appID != "" && clientID != s.appID:
		s.fail(rc, &gerr{status: 400, code: 101, typ: "OAuthException", msg: "Error validating application. Invalid application ID."})
		return
	case secret == "":
		s.fail(rc, &gerr{status: 400, code: 1, typ: "OAuthException", msg: "Missing client_secret parameter."})
		return
	case s.appSecret != "" && secret != s.appSecret:
		s.fail(rc, &gerr{status: 400, code: 1, typ: "OAuthException", msg: "Error validating client secret."})
		return
	case code == "":
		s.fail(rc, errRequired("code"))
		return
	}
	s.mu.Lock()
	c := s.codes[code]
	var e *gerr
	switch {
	case c == nil:
		e = &gerr{status: 400, code: 100, subcode: 36007, typ: "OAuthException", kind: "invalid_code", msg: "Invalid verification code format."}
	case c.used:
		e = &gerr{status: 400, code: 100, subcode: 36009, typ: "OAuthException", kind: "invalid_code", msg: "This authorization code has been used."}
	case time.Now().After(c.expires):
		e = &gerr{status: 400, code: 100, subcode: 36007, typ: "OAuthException", kind: "invalid_code", msg: "This authorization code has expired."}
	default:
		c.used = true
		if c.pnid != "" {
			s.lastSignup = c.pnid
		}
		if s.tokens[c.token] == nil {
			s.tokens[c.token] = &tokenState{pnids: map[string]bool{}, wabas: map[string]bool{}, issuedAt: time.Now()}
		}
	}
	s.mu.Unlock()
	if e != nil {
		s.fail(rc, e)
		return
	}
	s.okJSON(rc, struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
	}{c.token, "bearer"})
}

// ---- GET /debug_token (§1.7) ----

func (s *Server) handleDebugToken(rc *reqCtx) {
	if rc.r.Method != http.MethodGet {
		s.fail(rc, errUnsupported(rc.r.Method, "debug_token"))
		return
	}
	input := rc.r.URL.Query().Get("input_token")
	if input == "" {
		s.fail(rc, errRequired("input_token"))
		return
	}
	appID := s.appID
	if appID == "" {
		appID = "1234567890123456"
	}
	type gs struct {
		Scope     string   `json:"scope"`
		TargetIDs []string `json:"target_ids,omitempty"`
	}
	type derr struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Subcode int    `json:"subcode,omitempty"`
	}
	type data struct {
		AppID               string   `json:"app_id,omitempty"`
		Type                string   `json:"type,omitempty"`
		Application         string   `json:"application,omitempty"`
		DataAccessExpiresAt int64    `json:"data_access_expires_at"`
		Error               *derr    `json:"error,omitempty"`
		ExpiresAt           int64    `json:"expires_at"`
		IsValid             bool     `json:"is_valid"`
		IssuedAt            int64    `json:"issued_at,omitempty"`
		Scopes              []string `json:"scopes"`
		GranularScopes      []gs     `json:"granular_scopes,omitempty"`
		UserID              string   `json:"user_id,omitempty"`
	}
	s.mu.RLock()
	t := s.tokens[input]
	var targets []string
	if t != nil && !t.all {
		seen := map[string]bool{}
		for w := range t.wabas {
			seen[w] = true
		}
		for p := range t.pnids {
			if n := s.numbers[p]; n != nil && n.waba != "" {
				seen[n.waba] = true
			}
		}
		for w := range seen {
			targets = append(targets, w)
		}
		slices.Sort(targets)
	}
	s.mu.RUnlock()

	d := data{AppID: appID, Type: "SYSTEM_USER", Application: "wabarelay fake app", UserID: "100000000000042", Scopes: []string{}}
	switch {
	case t == nil:
		d = data{Error: &derr{Code: 190, Message: "Invalid OAuth access token - Cannot parse access token"}, Scopes: []string{}}
	case t.state == tokRevoked:
		d.Error = &derr{Code: 190, Subcode: 460, Message: errRevokedToken().msg}
	case t.state == tokExpired:
		d.Error = &derr{Code: 190, Subcode: 463, Message: errExpiredToken(t.expired).msg}
		d.ExpiresAt = t.expired.Unix()
	default:
		d.IsValid = true
		d.IssuedAt = t.issuedAt.Unix()
		d.Scopes = []string{"whatsapp_business_management", "whatsapp_business_messaging", "public_profile"}
		d.GranularScopes = []gs{{"whatsapp_business_management", targets}, {"whatsapp_business_messaging", targets}}
	}
	s.okJSON(rc, map[string]any{"data": d})
}

// ---- /{waba}/subscribed_apps (§4.5) ----

func (s *Server) handleSubscribedApps(rc *reqCtx, waba string) {
	switch rc.r.Method {
	case http.MethodPost:
		p := params(rc)
		uri, hasURI := str(p, "override_callback_uri")
		vt, _ := str(p, "verify_token")
		if hasURI && uri != "" && vt == "" {
			s.fail(rc, errRequired("verify_token"))
			return
		}
		s.mu.Lock()
		w := s.wabaLocked(waba)
		w.subscribed = true
		w.overrideURI = uri
		s.mu.Unlock()
		s.ok(rc, []byte(`{"success":true}`))
	case http.MethodDelete:
		s.mu.Lock()
		w := s.wabaLocked(waba)
		w.subscribed = false
		w.overrideURI = ""
		s.mu.Unlock()
		s.ok(rc, []byte(`{"success":true}`))
	case http.MethodGet:
		s.mu.RLock()
		w := s.wabas[waba]
		sub, uri := w.subscribed, w.overrideURI
		s.mu.RUnlock()
		if !sub {
			s.ok(rc, []byte(`{"data":[]}`))
			return
		}
		appID := s.appID
		if appID == "" {
			appID = "1234567890123456"
		}
		item := map[string]any{"whatsapp_business_api_data": map[string]any{
			"id": appID, "name": "wabarelay fake app", "link": "https://www.facebook.com/games/?app_id=" + appID}}
		if uri != "" {
			item["override_callback_uri"] = uri
		}
		s.okJSON(rc, map[string]any{"data": []any{item}})
	default:
		s.fail(rc, errUnsupported(rc.r.Method, waba))
	}
}

// ---- /{pnid}/register, /{pnid}/deregister (§4.6) ----

var registerKeys = map[string]bool{"messaging_product": true, "pin": true, "data_localization_region": true,
	"backup": true, "tier": true, "access_token": true, "appsecret_proof": true}

var pinRE = regexp.MustCompile(`^[0-9]{6}$`)

const registerWindow = 72 * time.Hour

func registerError(code int) *gerr {
	switch code {
	case 133005:
		return waErr(133005, "Two step verification PIN Mismatch", "Two-step verification PIN incorrect.")
	case 133016:
		return waErr(133016, "Account register deregister rate limit exceeded", "Registration or Deregistration failed because there were too many attempts for this phone number in a short period of time.")
	case 133010:
		return waErr(133010, "Account not registered", "Account not registered")
	case 133006:
		return waErr(133006, "Phone number re-verification needed", "Phone number needs to be verified before registering.")
	}
	return waErr(code, "Registration failed", "Registration failed")
}

func (s *Server) handleRegister(rc *reqCtx, pnid string, register bool) {
	p := params(rc)
	if register {
		if k := firstUnknown(p, registerKeys); k != "" {
			s.fail(rc, errUnexpectedKey(k, ""))
			return
		}
	}
	pin, _ := str(p, "pin")
	if register {
		mp, _ := str(p, "messaging_product")
		if mp == "" {
			s.fail(rc, errRequired("messaging_product"))
			return
		}
		if !strings.EqualFold(mp, "whatsapp") {
			s.fail(rc, errParam(`Param messaging_product must be one of {WHATSAPP} - got "`+mp+`".`))
			return
		}
		if pin == "" {
			s.fail(rc, errRequired("pin"))
			return
		}
		if !pinRE.MatchString(pin) {
			s.fail(rc, errInvalidParam("Invalid PIN format. PIN must be exactly 6 digits"))
			return
		}
	}

	now := time.Now()
	s.mu.Lock()
	n := s.numbers[pnid]
	calls := n.registerCalls[:0]
	for _, t := range n.registerCalls {
		if now.Sub(t) < registerWindow {
			calls = append(calls, t)
		}
	}
	n.registerCalls = calls
	var e *gerr
	switch {
	case len(n.registerCalls) >= 10:
		e = registerError(133016)
	case n.registerErr != 0:
		n.registerCalls = append(n.registerCalls, now)
		e = registerError(n.registerErr)
	case register && n.pin != "" && n.pin != pin:
		n.registerCalls = append(n.registerCalls, now)
		e = registerError(133005)
	default:
		n.registerCalls = append(n.registerCalls, now)
		n.registered = register
		if register {
			n.pin = pin
		}
	}
	s.mu.Unlock()
	if e != nil {
		s.fail(rc, e)
		return
	}
	s.ok(rc, []byte(`{"success":true}`))
}

// ---- GET /{pnid} (§4.7) ----

var numberFields = map[string]bool{
	"id": true, "display_phone_number": true, "verified_name": true, "quality_rating": true,
	"code_verification_status": true, "platform_type": true, "throughput": true, "status": true,
	"name_status": true, "account_mode": true, "is_official_business_account": true,
	"messaging_limit_tier": true, "webhook_configuration": true, "is_on_biz_app": true,
	"last_onboarded_time": true, "whatsapp_business_manager_messaging_limit": true,
	"new_name_status": true, "is_pin_enabled": true, "search_visibility": true,
}

var defaultNumberFields = []string{"verified_name", "code_verification_status", "display_phone_number", "quality_rating", "platform_type", "throughput", "id"}

type numberView struct {
	id, display, verified, waba string
	registered, pin             bool
	health                      NumberHealth
}

func (v numberView) field(f string) (any, bool) {
	switch f {
	case "id":
		return v.id, true
	case "display_phone_number":
		return v.display, true
	case "verified_name":
		return v.verified, true
	case "quality_rating":
		return or(v.health.QualityRating, "GREEN"), true
	case "code_verification_status":
		return "VERIFIED", true
	case "platform_type":
		if v.registered {
			return "CLOUD_API", true
		}
		return "NOT_APPLICABLE", true
	case "throughput":
		if v.health.Throughput != "" {
			return map[string]string{"level": v.health.Throughput}, true
		}
		if v.registered {
			return map[string]string{"level": "STANDARD"}, true
		}
		return map[string]string{"level": "NOT_APPLICABLE"}, true
	case "status":
		if v.registered {
			return "CONNECTED", true
		}
		return "PENDING", true
	case "name_status":
		return or(v.health.NameStatus, "APPROVED"), true
	case "account_mode":
		return "LIVE", true
	case "is_official_business_account", "is_on_biz_app":
		return false, true
	case "is_pin_enabled":
		return v.pin, true
	case "messaging_limit_tier":
		return or(v.health.MessagingLimitTier, "TIER_1K"), true
	case "whatsapp_business_manager_messaging_limit":
		if v.health.NoManagerLimit {
			return nil, false
		}
		return or(v.health.MessagingLimit, "TIER_2K"), true
	case "search_visibility":
		return "VISIBLE", true
	}
	return nil, false
}

func (s *Server) numberView(pnid string) numberView {
	n := s.numbers[pnid]
	return numberView{id: n.id, display: n.display, verified: n.verified, waba: n.waba, registered: n.registered, pin: n.pin != "", health: n.health}
}

func renderNumber(b []byte, v numberView, fields []string) []byte {
	b = append(b, '{')
	first := true
	for _, f := range fields {
		val, ok := v.field(f)
		if !ok {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, f)
		b = append(b, ':')
		vb := marshal(val)
		b = append(b, vb...)
	}
	return append(b, '}')
}

func (s *Server) handleNumber(rc *reqCtx, pnid string) {
	fields, e := parseFields(rc.r.URL.Query(), numberFields, defaultNumberFields, "WhatsAppBusinessPhoneNumber")
	if e != nil {
		s.fail(rc, e)
		return
	}
	s.mu.Lock()
	v := s.numberView(pnid)
	s.countHealthRead(pnid, fields)
	s.mu.Unlock()
	s.ok(rc, renderNumber(nil, v, fields))
}

func (s *Server) handlePhoneNumbers(rc *reqCtx, waba string) {
	q := rc.r.URL.Query()
	fields, e := parseFields(q, numberFields, defaultNumberFields, "WhatsAppBusinessPhoneNumber")
	if e != nil {
		s.fail(rc, e)
		return
	}
	s.mu.RLock()
	var views []numberView
	for _, p := range s.wabas[waba].numbers {
		if s.numbers[p] != nil {
			views = append(views, s.numberView(p))
		}
	}
	s.mu.RUnlock()
	pg, e := s.paginate(rc, q, len(views), "/"+waba+"/phone_numbers")
	if e != nil {
		s.fail(rc, e)
		return
	}
	b := []byte(`{"data":[`)
	for i, v := range views[pg.start:pg.end] {
		if i > 0 {
			b = append(b, ',')
		}
		b = renderNumber(b, v, fields)
	}
	b = append(b, ']')
	b = append(b, pg.json...)
	b = append(b, '}')
	s.ok(rc, b)
}

// ---- GET /{waba} ----

var wabaFields = map[string]bool{"id": true, "name": true, "currency": true, "timezone_id": true,
	"message_template_namespace": true, "account_review_status": true, "business_verification_status": true,
	"country": true, "ownership_type": true, "owner_business_info": true}

func (s *Server) handleWABA(rc *reqCtx, waba string) {
	fields, e := parseFields(rc.r.URL.Query(), wabaFields, []string{"id", "name", "timezone_id", "message_template_namespace"}, "WhatsAppBusinessAccount")
	if e != nil {
		s.fail(rc, e)
		return
	}
	s.mu.RLock()
	name := s.wabas[waba].name
	s.mu.RUnlock()
	if name == "" {
		name = "WhatsApp Business Account " + waba
	}
	vals := map[string]any{"id": waba, "name": name, "currency": "USD", "timezone_id": "1",
		"message_template_namespace": "fake_" + waba, "account_review_status": "APPROVED",
		"business_verification_status": "verified", "country": "US", "ownership_type": "CLIENT_OWNED",
		"owner_business_info": map[string]string{"name": name + " owner", "id": "2729063490586005"}}
	b := []byte{'{'}
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, f)
		b = append(b, ':')
		vb := marshal(vals[f])
		b = append(b, vb...)
	}
	b = append(b, '}')
	s.ok(rc, b)
}

// ---- media ----

func newMedia(id, pnid, mimeType string, data []byte) *mediaState {
	sum := sha256.Sum256(data)
	return &mediaState{id: id, pnid: pnid, mime: mimeType, sha: hex.EncodeToString(sum[:]), data: data}
}

func (s *Server) handleMediaUpload(rc *reqCtx, pnid string) {
	fields := map[string]string{}
	var file []byte
	var fileType string
	hasFile := false
	if ct, ps, err := mime.ParseMediaType(rc.r.Header.Get("Content-Type")); err == nil && ct == "multipart/form-data" && ps["boundary"] != "" {
		mr := multipart.NewReader(bytes.NewReader(rc.body), ps["boundary"])
		for {
			part, err := mr.NextPart()
			if err != nil {
				break
			}
			data, _ := io.ReadAll(part)
			if part.FormName() == "file" {
				file, hasFile = data, true
				fileType = part.Header.Get("Content-Type")
			} else {
				fields[part.FormName()] = string(data)
			}
		}
	}
	if fields["messaging_product"] == "" {
		s.fail(rc, errRequired("messaging_product"))
		return
	}
	if !strings.EqualFold(fields["messaging_product"], "whatsapp") {
		s.fail(rc, errParam(`Param messaging_product must be one of {WHATSAPP} - got "`+fields["messaging_product"]+`".`))
		return
	}
	if !hasFile {
		s.fail(rc, errRequired("file"))
		return
	}
	mt := fields["type"]
	if mt == "" {
		mt = fileType
	}
	if mt == "" {
		mt = "application/octet-stream"
	}
	id := s.newObjectID()
	s.mu.Lock()
	s.media[id] = newMedia(id, pnid, mt, file)
	s.mu.Unlock()
	s.ok(rc, []byte(`{"id":"`+id+`"}`))
}

func (s *Server) handleMediaNode(rc *reqCtx, id string) {
	// phone_number_id, when given, must be the number the medium belongs to (Cloud API media
	// reference: "the operation will only be processed if the ID matches the ID of the business
	// phone number that the media was uploaded on").
	if pn := rc.r.URL.Query().Get("phone_number_id"); pn != "" {
		s.mu.RLock()
		m := s.media[id]
		s.mu.RUnlock()
		if m != nil && m.pnid != pn {
			s.fail(rc, errParam("Param phone_number_id does not match the phone number the media was uploaded on."))
			return
		}
	}
	if rc.r.Method == http.MethodDelete {
		s.mu.Lock()
		delete(s.media, id)
		s.mu.Unlock()
		s.ok(rc, []byte(`{"success":true}`))
		return
	}
	s.mu.RLock()
	m := s.media[id]
	s.mu.RUnlock()
	if m == nil {
		s.fail(rc, errUnsupported(rc.r.Method, id))
		return
	}
	u := fmt.Sprintf("%s/whatsapp_business/attachments/?mid=%s&ext=%d&hash=%s", s.baseURL(rc), id, time.Now().Unix(), m.sha[:16])
	s.okJSON(rc, struct {
		MessagingProduct string `json:"messaging_product"`
		URL              string `json:"url"`
		MimeType         string `json:"mime_type"`
		SHA256           string `json:"sha256"`
		FileSize         int    `json:"file_size"`
		ID               string `json:"id"`
	}{"whatsapp", u, m.mime, m.sha, len(m.data), id})
}

// handleMediaDownload serves the media URL (the real one is on lookaside.fbsbx.com and needs the
// bearer token, §3.3).
func (s *Server) handleMediaDownload(rc *reqCtx) {
	tok, e := s.authenticate(rc)
	if e != nil {
		s.fail(rc, e)
		return
	}
	id := rc.r.URL.Query().Get("mid")
	s.mu.RLock()
	m := s.media[id]
	var waba string
	if m != nil && s.numbers[m.pnid] != nil {
		waba = s.numbers[m.pnid].waba
	}
	s.mu.RUnlock()
	if m == nil || !tok.allowsNumber(m.pnid, waba) {
		rc.status = http.StatusNotFound
		http.Error(rc.w, "Not Found", http.StatusNotFound)
		return
	}
	// Like the media host: the bytes with their type and an ETag, and byte ranges (206 with
	// Content-Range, 416 for an unsatisfiable range, If-Range honoured).
	h := rc.w.Header()
	h.Set("Content-Type", m.mime)
	h.Set("Etag", `"`+m.sha[:32]+`"`)
	h.Set("Content-Disposition", "attachment; filename="+m.id)
	sw := &statusWriter{ResponseWriter: rc.w}
	http.ServeContent(sw, rc.r, "", time.Time{}, bytes.NewReader(m.data))
	rc.status = sw.status
}

// statusWriter records the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}
