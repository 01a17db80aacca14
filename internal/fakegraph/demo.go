package fakegraph

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// This file holds what the fake offers beyond the Graph API, for the local demo (`make run`
// without a Meta app, cmd/fakegraph) and for tests of the whole path:
//
//	GET  /sdk.js          (WithDemoSDK) a stand-in for Meta's JS SDK whose Embedded Signup connects
//	                      a number made up for this fetch (MintSignup)
//	POST /_fake/signup    (WithDemoSDK) the same as JSON, for a completion without a browser
//	POST /_fake/inbound   (WithCallback) an incoming message, sent signed to the callback (Emit)
//	POST /_fake/account_webhook (WithCallback) an account webhook that changes a number's
//	                      health, sent signed to the callback (EmitAccountUpdate)
//	POST /_fake/script    (WithDemoSDK or WithCallback) upstream errors for the next sends to a
//	                      recipient (Script, script.go)
//
// With WithCallback the fake also reports the statuses of every message sent through it to the
// callback, as the upstream does (statuses.go).

//go:embed demo-sdk.js
var demoSDK string

// DefaultSignupCodeTTL is the lifetime of the codes GET /sdk.js makes up. The upstream's codes
// live 30 s (§4.3), counted from the end of the signup; here the code is made up when the page
// loads the SDK, and the person may read the page for a while before clicking.
const DefaultSignupCodeTTL = time.Hour

// DemoFrom is the sender of emitted messages unless another is given (Meta's example customer).
const DemoFrom = "16505551234"

// WithDemoSDK serves GET /sdk.js, a demo stand-in for Meta's JS SDK (see demo-sdk.js), and
// POST /_fake/signup. Each fetch makes up a new phone number, business account and one-time code
// (MintSignup with codeTTL, DefaultSignupCodeTTL when 0); every new business account gets these
// templates.
func WithDemoSDK(codeTTL time.Duration, templates ...Template) Option {
	return func(s *Server) {
		if codeTTL <= 0 {
			codeTTL = DefaultSignupCodeTTL
		}
		s.demoSDK, s.signupTTL, s.signupTemplates = true, codeTTL, templates
	}
}

// WithCallback sets the app's callback URL (its webhook configuration at the upstream, e.g.
// http://localhost:8080/webhooks/upstream). It enables POST /_fake/inbound, and the status
// webhooks of every message sent through the fake: "sent", "delivered" and "read", or "failed"
// (131026) for an undeliverable recipient (WithStatusOrder, WithUndeliverable). Posts are signed
// with the WithAppSecret secret (X-Hub-Signature-256).
func WithCallback(url string) Option { return func(s *Server) { s.callback = url } }

// Signup is a number made up for a demo Embedded Signup (MintSignup).
type Signup struct {
	PhoneNumberID      string `json:"phone_number_id"`
	WabaID             string `json:"waba_id"`
	BusinessID         string `json:"business_id"`
	DisplayPhoneNumber string `json:"display_phone_number"`
	VerifiedName       string `json:"verified_name"`
	// Code is exchanged once at GET /oauth/access_token for Token.
	Code string `json:"code"`
	// Token is the access token the code exchanges for: it may use the number and its business
	// account (messages, media, register, subscribed_apps, templates, number fields).
	Token string `json:"-"`
}

// MintSignup makes up what one Embedded Signup yields: a registered phone number ("+1 555 0101",
// "+1 555 0102", ...) of a new business account, an access token allowed to use both, and a
// one-time code that GET /oauth/access_token exchanges for that token within ttl (30 s when 0, as
// upstream). The business account gets templates. Once the code is exchanged the number is the
// LastSignup.
func (s *Server) MintSignup(ttl time.Duration, templates ...Template) Signup {
	n := s.signupSeq.Add(1)
	su := Signup{
		PhoneNumberID:      s.newObjectID(),
		WabaID:             s.newObjectID(),
		BusinessID:         s.newObjectID(),
		DisplayPhoneNumber: fmt.Sprintf("+1 555 %04d", 100+n),
		VerifiedName:       fmt.Sprintf("Demo Business %d", n),
		Code:               "AQ" + randID(30),
		Token:              "EAAG" + randAlnum(60),
	}
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	s.AddNumber(su.PhoneNumberID, su.WabaID, su.DisplayPhoneNumber, su.VerifiedName)
	if len(templates) > 0 {
		s.AddTemplates(su.WabaID, templates...)
	}
	s.AddToken(su.Token, []string{su.PhoneNumberID}, []string{su.WabaID})
	s.mu.Lock()
	s.wabaLocked(su.WabaID).name = su.VerifiedName
	s.codes[su.Code] = &codeState{token: su.Token, expires: time.Now().Add(ttl), pnid: su.PhoneNumberID}
	s.mu.Unlock()
	return su
}

// LastSignup returns the phone number id of the most recent signup whose code was exchanged
// (MintSignup), or "" if none was.
func (s *Server) LastSignup() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lastSignup
}

// serveDemo serves the demo endpoints; it reports false for any other path, which the Graph
// routes then serve.
func (s *Server) serveDemo(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.Path
	switch {
	case s.demoSDK && p == "/sdk.js":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			demoError(w, http.StatusMethodNotAllowed, "use GET")
			return true
		}
		su := s.MintSignup(s.signupTTL, s.signupTemplates...)
		// json.Marshal escapes <, > and &, so the data cannot end the script early.
		data, _ := json.Marshal(su)
		js := strings.Replace(demoSDK, "/*SIGNUP*/null", string(data), 1)
		h := w.Header()
		h.Set("Content-Type", "text/javascript; charset=utf-8")
		h.Set("Cache-Control", "no-store") // every page load makes up a new number
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Access-Control-Allow-Origin", "*")
		_, _ = io.WriteString(w, js)
	case s.demoSDK && p == "/_fake/signup":
		if r.Method != http.MethodPost {
			demoError(w, http.StatusMethodNotAllowed, "use POST")
			return true
		}
		writeDemoJSON(w, http.StatusOK, s.MintSignup(s.signupTTL, s.signupTemplates...))
	case s.callback != "" && p == "/_fake/inbound":
		if r.Method != http.MethodPost {
			demoError(w, http.StatusMethodNotAllowed, "use POST")
			return true
		}
		s.handleInbound(w, r)
	case s.callback != "" && p == "/_fake/account_webhook":
		if r.Method != http.MethodPost {
			demoError(w, http.StatusMethodNotAllowed, "use POST")
			return true
		}
		s.handleAccountWebhook(w, r) // accountwebhooks.go
	case p == "/_fake/script":
		if r.Method != http.MethodPost {
			demoError(w, http.StatusMethodNotAllowed, "use POST")
			return true
		}
		s.handleScript(w, r) // script.go
	default:
		return false
	}
	return true
}

// inboundRequest is the body of POST /_fake/inbound.
type inboundRequest struct {
	PhoneNumberID string `json:"phone_number_id"`
	From          string `json:"from"`
	Name          string `json:"name"`
	Type          string `json:"type"`
	Text          string `json:"text"`
	// Timestamp (unix seconds) or Age (a Go duration, e.g. "25h"): when the customer sent it.
	Timestamp int64  `json:"timestamp"`
	Age       string `json:"age"`
}

func (s *Server) handleInbound(w http.ResponseWriter, r *http.Request) {
	var in inboundRequest
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			demoError(w, http.StatusBadRequest, "body: "+err.Error())
			return
		}
	}
	m := InboundMessage{PhoneNumberID: in.PhoneNumberID, From: in.From, Name: in.Name, Type: in.Type, Text: in.Text}
	switch {
	case in.Timestamp != 0 && in.Age != "":
		demoError(w, http.StatusBadRequest, `give "timestamp" or "age", not both`)
		return
	case in.Timestamp < 0:
		demoError(w, http.StatusBadRequest, `"timestamp" must be unix seconds`)
		return
	case in.Timestamp > 0:
		m.At = time.Unix(in.Timestamp, 0)
	case in.Age != "":
		age, err := time.ParseDuration(in.Age)
		if err != nil || age < 0 {
			demoError(w, http.StatusBadRequest, `"age" must be a duration such as "25h"`)
			return
		}
		m.At = time.Now().Add(-age)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	res, err := s.Emit(ctx, s.callback, s.appSecret, m)
	if err != nil {
		emitError(w, err)
		return
	}
	writeDemoJSON(w, res.Status, struct {
		PhoneNumberID  string          `json:"phone_number_id"`
		MessageID      string          `json:"message_id"`
		MediaID        string          `json:"media_id,omitempty"`
		Callback       string          `json:"callback"`
		CallbackStatus int             `json:"callback_status"`
		CallbackBody   string          `json:"callback_body"`
		Payload        json.RawMessage `json:"payload"`
	}{res.PhoneNumberID, res.MessageID, res.MediaID, s.callback, res.Status, string(res.Body), res.Payload})
}

// emitError answers a failed emission of a webhook to the app's callback: 400 for what the
// request asked that cannot be sent (badInboundError), 502 for the callback's failure.
func emitError(w http.ResponseWriter, err error) {
	var bad *badInboundError
	if errors.As(err, &bad) {
		demoError(w, http.StatusBadRequest, bad.msg)
		return
	}
	demoError(w, http.StatusBadGateway, err.Error())
}

// InboundMessage is an incoming message the fake sends to the app's callback (Emit).
type InboundMessage struct {
	// PhoneNumberID is the business number that receives it; "" means LastSignup.
	PhoneNumberID string
	// From is the sender's WhatsApp id (phone number digits; "+", spaces and dashes are
	// dropped); "" means DemoFrom.
	From string
	// Name is the sender's profile name; "" means "Demo Customer".
	Name string
	// Type is "text" (default) or "image": a small PNG stored as a medium of the number (the
	// receiver may download it through the relay), with Text as its caption.
	Type string
	// Text is the message's body; "" means "Hello" (no caption for an image).
	Text string
	// At is when the customer sent it (the message's upstream "timestamp"); zero means now. An
	// earlier time is what a late webhook carries (the upstream retries for up to 7 days), e.g.
	// a message 25 hours old, whose customer-service window has closed.
	At time.Time
}

// Emitted is what Emit sent and what the callback answered.
type Emitted struct {
	PhoneNumberID string
	MessageID     string // wamid of the message
	MediaID       string // the image's media id (type image)
	Payload       []byte // the webhook body, byte for byte as signed and sent
	Status        int    // the callback's HTTP status
	Body          []byte // the callback's answer (at most 64 KiB)
}

// badInboundError is an InboundMessage Emit cannot send.
type badInboundError struct{ msg string }

func (e *badInboundError) Error() string { return "fakegraph: " + e.msg }

// EmitMessage sends a text message from "from" (digits; "" = DemoFrom) to the business number
// pnid ("" = LastSignup) the way the upstream does: a "messages" webhook of the number's
// business account, signed with appSecret (X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the
// body>) and POSTed to callbackURL. It returns nil when the callback answers 200 (the only
// success the upstream knows), else an error that names the status.
func (s *Server) EmitMessage(ctx context.Context, callbackURL, appSecret, pnid, from, text string) error {
	res, err := s.Emit(ctx, callbackURL, appSecret, InboundMessage{PhoneNumberID: pnid, From: from, Text: text})
	if err != nil {
		return err
	}
	if res.Status != http.StatusOK {
		return fmt.Errorf("fakegraph: callback answered %d: %s", res.Status, bytes.TrimSpace(res.Body))
	}
	return nil
}

// Emit sends m as an upstream "messages" webhook to callbackURL, signed with appSecret, and
// reports the callback's answer (any status; an error only when m cannot be sent or the callback
// cannot be reached). The body is what Meta sends (§3.3): object whatsapp_business_account, one
// entry (the business account's id) with one change (field "messages") whose value has
// metadata (display_phone_number as digits, phone_number_id), contacts and messages, written
// with Graph's escaping ("/" as "\/", non-ASCII as \uXXXX) unless WithPlainJSON.
func (s *Server) Emit(ctx context.Context, callbackURL, appSecret string, m InboundMessage) (Emitted, error) {
	if callbackURL == "" {
		return Emitted{}, &badInboundError{"no callback URL"}
	}
	if appSecret == "" {
		return Emitted{}, &badInboundError{"no app secret to sign with"}
	}
	pnid := m.PhoneNumberID
	if pnid == "" {
		if pnid = s.LastSignup(); pnid == "" {
			return Emitted{}, &badInboundError{"no phone_number_id given and no number signed up yet (connect a channel first)"}
		}
	}
	from := DemoFrom
	if m.From != "" {
		from = strings.Map(func(r rune) rune {
			switch {
			case r >= '0' && r <= '9':
				return r
			case r == '+' || r == ' ' || r == '-' || r == '(' || r == ')':
				return -1
			}
			return 'x'
		}, m.From)
		if from == "" || strings.Contains(from, "x") {
			return Emitted{}, &badInboundError{"from must be a phone number (digits)"}
		}
	}
	name := m.Name
	if name == "" {
		name = "Demo Customer"
	}
	s.mu.RLock()
	n := s.numbers[pnid]
	var display, waba string
	if n != nil {
		display, waba = digitsOf(n.display), n.waba
	}
	s.mu.RUnlock()
	if n == nil {
		return Emitted{}, &badInboundError{"unknown phone_number_id " + pnid}
	}
	if waba == "" {
		waba = pnid
	}

	res := Emitted{PhoneNumberID: pnid, MessageID: s.newWAMID(from)}
	at := m.At
	if at.IsZero() {
		at = time.Now()
	}
	msg := whMessage{From: from, ID: res.MessageID, Timestamp: strconv.FormatInt(at.Unix(), 10)}
	switch strings.ToLower(m.Type) {
	case "", "text":
		text := m.Text
		if text == "" {
			text = "Hello"
		}
		msg.Type, msg.Text = "text", &whText{text}
	case "image":
		res.MediaID = s.newObjectID()
		data := demoImage()
		s.AddMedia(res.MediaID, pnid, "image/png", data)
		sum := sha256.Sum256(data)
		msg.Type, msg.Image = "image", &whMedia{m.Text, "image/png", hex.EncodeToString(sum[:]), res.MediaID}
	default:
		return Emitted{}, &badInboundError{`type must be "text" or "image"`}
	}
	res.Payload = s.webhookBody(waba, whValue{MessagingProduct: "whatsapp", Metadata: whMetadata{display, pnid},
		Contacts: []whContact{{whProfile{name}, from}}, Messages: []whMessage{msg}})
	var err error
	res.Status, res.Body, err = s.postWebhook(ctx, callbackURL, appSecret, res.Payload)
	return res, err
}

// Webhook objects, their members in Meta's order (§3.3, §3.4).
type (
	whValue struct {
		MessagingProduct string      `json:"messaging_product"`
		Metadata         whMetadata  `json:"metadata"`
		Contacts         []whContact `json:"contacts,omitempty"`
		Messages         []whMessage `json:"messages,omitempty"`
		Statuses         []whStatus  `json:"statuses,omitempty"`
	}
	whMetadata struct {
		DisplayPhoneNumber string `json:"display_phone_number"`
		PhoneNumberID      string `json:"phone_number_id"`
	}
	whContact struct {
		Profile whProfile `json:"profile"`
		WaID    string    `json:"wa_id"`
	}
	whProfile struct {
		Name string `json:"name"`
	}
	whMessage struct {
		From      string   `json:"from"`
		ID        string   `json:"id"`
		Timestamp string   `json:"timestamp"`
		Type      string   `json:"type"`
		Text      *whText  `json:"text,omitempty"`
		Image     *whMedia `json:"image,omitempty"`
	}
	whText struct {
		Body string `json:"body"`
	}
	whMedia struct {
		Caption  string `json:"caption,omitempty"`
		MimeType string `json:"mime_type"`
		SHA256   string `json:"sha256"`
		ID       string `json:"id"`
	}
	whStatus struct {
		ID          string     `json:"id"`
		Status      string     `json:"status"`
		Timestamp   string     `json:"timestamp"`
		RecipientID string     `json:"recipient_id"`
		Pricing     *whPricing `json:"pricing,omitempty"`
		Errors      []whError  `json:"errors,omitempty"`
	}
	whError struct {
		Code      int         `json:"code"`
		Title     string      `json:"title"`
		Message   string      `json:"message"`
		ErrorData whErrorData `json:"error_data"`
		Href      string      `json:"href"`
	}
	whErrorData struct {
		Details string `json:"details"`
	}
	whPricing struct {
		Billable     bool   `json:"billable"`
		PricingModel string `json:"pricing_model"`
		Type         string `json:"type"`
		Category     string `json:"category"`
	}
)

// webhookBody is the upstream's envelope around one "messages" change of a business account.
func (s *Server) webhookBody(waba string, value whValue) []byte {
	type change struct {
		Value whValue `json:"value"`
		Field string  `json:"field"`
	}
	type entry struct {
		ID      string   `json:"id"`
		Changes []change `json:"changes"`
	}
	b := marshal(struct {
		Object string  `json:"object"`
		Entry  []entry `json:"entry"`
	}{"whatsapp_business_account", []entry{{waba, []change{{value, "messages"}}}}})
	if !s.plainJSON {
		b = graphEscape(b)
	}
	return b
}

// Sign returns the X-Hub-Signature-256 value the upstream sends with body: "sha256=" and the
// lower-case hex HMAC-SHA256 of the body keyed with the app secret.
func Sign(appSecret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(appSecret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

var webhookClient = &http.Client{Timeout: 30 * time.Second}

// postWebhook POSTs a signed webhook body like the upstream does and returns the answer.
func (s *Server) postWebhook(ctx context.Context, url, appSecret string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, &badInboundError{"callback URL: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "facebookexternalua")
	req.Header.Set("X-Hub-Signature-256", Sign(appSecret, body))
	resp, err := webhookClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("fakegraph: callback unreachable: %w", err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	logf(s.logw, "%s webhook -> %s %d (%d bytes)\n", time.Now().Format(time.RFC3339), url, resp.StatusCode, len(body))
	return resp.StatusCode, answer, nil
}

func digitsOf(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func randAlnum(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return string(b)
}

var (
	demoImageOnce sync.Once
	demoImageData []byte
)

// demoImage is a small PNG (a green square with a white bubble) for emitted image messages.
func demoImage() []byte {
	demoImageOnce.Do(func() {
		img := image.NewNRGBA(image.Rect(0, 0, 64, 64))
		green, white := color.NRGBA{0x25, 0xd3, 0x66, 0xff}, color.NRGBA{0xff, 0xff, 0xff, 0xff}
		for y := range 64 {
			for x := range 64 {
				c := green
				if dx, dy := x-32, y-30; dx*dx+dy*dy < 18*18 || (x >= 16 && x < 26 && y >= 42 && y < 54 && x-16 < 54-y) {
					c = white
				}
				img.SetNRGBA(x, y, c)
			}
		}
		var buf bytes.Buffer
		_ = png.Encode(&buf, img)
		demoImageData = buf.Bytes()
	})
	return demoImageData
}

func demoError(w http.ResponseWriter, status int, msg string) {
	writeDemoJSON(w, status, map[string]string{"error": msg})
}

func writeDemoJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
