// Package graph is a small client for the upstream Graph API (WhatsApp Cloud API) calls the
// service makes on its own behalf during the connect flow — the Embedded Signup code exchange,
// subscribing the app to a WhatsApp Business Account, registering the phone number and reading it
// back — as opposed to the calls it relays for channels.
//
// Secrets never leave the client in an error: access tokens travel only in the Authorization
// header; the app secret and the signup code, which the code exchange must send as query
// parameters, never appear in a returned error (transport failures name only the method and the
// path, and every error text is scrubbed of the secrets of its call); the registration PIN is only
// in the request body. The package does not log.
//
// An upstream error answer (any status with Graph's {"error":{...}} envelope, 5xx included) is
// returned as an *Error; classify it by Error.Code, as Meta advises. Anything else — transport
// failures, timeouts, answers that are not the expected JSON — is a plain wrapped error, which
// wraps ErrUnexpectedResponse for unusable answers and the context's error on cancellation.
package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout is the timeout of the HTTP client New creates when given none.
const DefaultTimeout = 15 * time.Second

// maxResponse bounds how much of an upstream answer is read.
const maxResponse = 1 << 20

// defaultPageSize is the limit asked for when listing a WABA's phone numbers.
const defaultPageSize = 100

// maxPages bounds how many pages ListPhoneNumbers follows.
const maxPages = 100

// redacted replaces a secret found in an error text.
const redacted = "[redacted]"

var (
	// ErrInvalidArgument is wrapped by the errors returned, before any upstream call, for empty or
	// malformed arguments (ids, token, app credentials, code, PIN).
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrUnexpectedResponse is wrapped by the errors returned when the upstream answers with
	// something that is neither the expected success JSON nor a Graph error envelope (an HTML
	// error page from a proxy, a redirect, a truncated body, a success body missing its fields).
	ErrUnexpectedResponse = errors.New("unexpected upstream response")
)

// Client calls the upstream Graph API. It is safe for concurrent use.
type Client struct {
	base     string
	hc       *http.Client
	pageSize int
}

// New returns a Client for the upstream base URL including the version segment, e.g.
// "https://graph.facebook.com/v26.0" (a trailing slash is ignored). hc may be nil, in which case
// a client with a DefaultTimeout (15 s) timeout is used. The Client works on a shallow copy of hc
// whose CheckRedirect refuses redirects: Graph does not redirect these calls, and following one
// would carry the code exchange's secrets elsewhere; a redirect is reported as an error wrapping
// ErrUnexpectedResponse.
func New(base string, hc *http.Client) *Client {
	var c http.Client
	if hc != nil {
		c = *hc
	} else {
		c.Timeout = DefaultTimeout
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{base: strings.TrimRight(base, "/"), hc: &c, pageSize: defaultPageSize}
}

// Error is an upstream error answer: the HTTP status and the fields of Graph's error envelope
// {"error":{"message","type","code","error_subcode","error_data":{"details"},"error_user_title",
// "error_user_msg","fbtrace_id"}}. Fields the upstream left out are zero. Text fields are the
// upstream's own (the upstream does not echo secrets; as a precaution, any secret of the call
// found in them is replaced by "[redacted]").
type Error struct {
	// Status is the HTTP status of the answer. Classify by Code, not by Status: Graph's statuses
	// for a given code vary.
	Status int
	// Message is error.message, e.g. "This authorization code has expired." or
	// "(#133005) Two step verification PIN Mismatch".
	Message string
	// Type is error.type, usually "OAuthException" or "GraphMethodException".
	Type string
	// Code is error.code, e.g. 100, 190 (dead token), 133005 (PIN mismatch).
	Code int
	// Subcode is error.error_subcode, e.g. 36007 (code expired), 36009 (code used), 463.
	Subcode int
	// Details is error.error_data.details, WhatsApp's longer explanation.
	Details string
	// FBTraceID is error.fbtrace_id, the id to quote to Meta support.
	FBTraceID string
	// UserTitle and UserMsg are error.error_user_title and error.error_user_msg.
	UserTitle, UserMsg string
}

// Error renders the error as "upstream error <code>[/<subcode>]: <message>[ (<details>)]",
// e.g. "upstream error 100/36007: This authorization code has expired.".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("upstream error ")
	b.WriteString(strconv.Itoa(e.Code))
	if e.Subcode != 0 {
		b.WriteByte('/')
		b.WriteString(strconv.Itoa(e.Subcode))
	}
	b.WriteString(": ")
	msg := e.Message
	if msg == "" {
		msg = e.UserMsg
	}
	if msg == "" {
		msg = "HTTP " + strconv.Itoa(e.Status)
	}
	b.WriteString(msg)
	if e.Details != "" && !strings.Contains(msg, e.Details) {
		b.WriteString(" (")
		b.WriteString(e.Details)
		b.WriteByte(')')
	}
	return b.String()
}

// requestError is a failure that is not an upstream error answer. Its text names the call by
// method and path only (never the full URL, which for the code exchange holds the app secret and
// the code) and is scrubbed of the call's secrets.
type requestError struct {
	op  string // e.g. "POST /123/register"
	msg string
	err error
}

func (e *requestError) Error() string { return "graph: " + e.op + ": " + e.msg }

// Unwrap returns the underlying cause (a context error, a net.Error, ErrUnexpectedResponse, ...)
// for errors.Is and errors.As.
func (e *requestError) Unwrap() error { return e.err }

func invalid(op, what string) error {
	return fmt.Errorf("graph: %s: %s: %w", op, what, ErrInvalidArgument)
}

// checkID validates an object id that goes into the path.
func checkID(op, name, id string) error {
	switch strings.TrimSpace(id) {
	case "":
		return invalid(op, "empty "+name)
	case ".", "..":
		return invalid(op, "invalid "+name)
	}
	return nil
}

func checkToken(op, token string) error {
	if strings.TrimSpace(token) == "" {
		return invalid(op, "empty access token")
	}
	if strings.ContainsAny(token, "\r\n") {
		return invalid(op, "malformed access token")
	}
	return nil
}

// call is one upstream request.
type call struct {
	method  string
	path    string // escaped, relative to the base, starting with "/"
	query   url.Values
	token   string // sent as Authorization: Bearer when not empty
	body    []byte // JSON body, nil for none
	secrets []string
}

func (cl call) op() string { return cl.method + " " + cl.path }

// redact replaces every secret of the call (raw and query-escaped) in s.
func redact(s string, secrets []string) string {
	for _, x := range secrets {
		if x == "" {
			continue
		}
		s = strings.ReplaceAll(s, x, redacted)
		if q := url.QueryEscape(x); q != x {
			s = strings.ReplaceAll(s, q, redacted)
		}
		if p := url.PathEscape(x); p != x {
			s = strings.ReplaceAll(s, p, redacted)
		}
	}
	return s
}

func (cl call) fail(err error, msg string) error {
	return &requestError{op: cl.op(), msg: redact(msg, cl.secrets), err: err}
}

// envelope is Graph's error answer.
type envelope struct {
	Error *struct {
		Message   string `json:"message"`
		Type      string `json:"type"`
		Code      int    `json:"code"`
		Subcode   int    `json:"error_subcode"`
		FBTraceID string `json:"fbtrace_id"`
		UserTitle string `json:"error_user_title"`
		UserMsg   string `json:"error_user_msg"`
		ErrorData *struct {
			Details string `json:"details"`
		} `json:"error_data"`
	} `json:"error"`
}

// upstreamError returns the *Error in body, or nil when body is not a Graph error envelope.
func upstreamError(status int, body []byte, secrets []string) *Error {
	var env envelope
	if json.Unmarshal(body, &env) != nil || env.Error == nil {
		return nil
	}
	ee := env.Error
	e := &Error{
		Status:    status,
		Message:   redact(ee.Message, secrets),
		Type:      ee.Type,
		Code:      ee.Code,
		Subcode:   ee.Subcode,
		FBTraceID: ee.FBTraceID,
		UserTitle: redact(ee.UserTitle, secrets),
		UserMsg:   redact(ee.UserMsg, secrets),
	}
	if ee.ErrorData != nil {
		e.Details = redact(ee.ErrorData.Details, secrets)
	}
	return e
}

// do performs the call and decodes a 2xx JSON answer into out.
func (c *Client) do(ctx context.Context, cl call, out any) error {
	u := c.base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var rd io.Reader
	if cl.body != nil {
		rd = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, u, rd)
	if err != nil {
		// url.Parse errors quote the URL; never pass err's text on.
		return cl.fail(ErrInvalidArgument, "cannot build request (check the upstream base URL)")
	}
	req.Header.Set("Accept", "application/json")
	if cl.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cl.token != "" {
		req.Header.Set("Authorization", "Bearer "+cl.token)
	}

	resp, err := c.hc.Do(req)
	if err != nil {
		cause := err
		var ue *url.Error
		if errors.As(err, &ue) && ue.Err != nil {
			cause = ue.Err // url.Error's text carries the full URL
		}
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(cause, ctxErr) {
			cause = fmt.Errorf("%w (%w)", ctxErr, cause)
		}
		return cl.fail(cause, cause.Error())
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		cause := err
		if ctxErr := ctx.Err(); ctxErr != nil {
			cause = fmt.Errorf("%w (%w)", ctxErr, err)
		}
		return cl.fail(cause, "reading answer (HTTP "+strconv.Itoa(resp.StatusCode)+"): "+err.Error())
	}
	if len(body) > maxResponse {
		return cl.fail(ErrUnexpectedResponse, "answer larger than "+strconv.Itoa(maxResponse)+" bytes (HTTP "+strconv.Itoa(resp.StatusCode)+")")
	}

	if e := upstreamError(resp.StatusCode, body, cl.secrets); e != nil {
		return e
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if ct == "" {
			ct = "no content type"
		}
		return cl.fail(ErrUnexpectedResponse, fmt.Sprintf("%s: HTTP %d without a Graph error envelope (%s)",
			ErrUnexpectedResponse, resp.StatusCode, ct))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return cl.fail(ErrUnexpectedResponse, fmt.Sprintf("%s: HTTP %d answer is not the expected JSON", ErrUnexpectedResponse, resp.StatusCode))
	}
	return nil
}

// success is the {"success":true} answer of the write edges.
type success struct {
	Success *bool `json:"success"`
}

func (c *Client) doSuccess(ctx context.Context, cl call) error {
	var s success
	if err := c.do(ctx, cl, &s); err != nil {
		return err
	}
	if s.Success == nil || !*s.Success {
		return cl.fail(ErrUnexpectedResponse, ErrUnexpectedResponse.Error()+`: answer lacks "success":true`)
	}
	return nil
}

// ExchangeCode exchanges an Embedded Signup code for the customer's business access token:
// GET oauth/access_token?client_id=<appID>&client_secret=<appSecret>&code=<code> (the upstream
// takes these as query parameters; they never appear in a returned error). Codes live 30 s and
// are single-use: an expired one gives an *Error with Code 100, Subcode 36007, a used one 100/36009,
// a wrong app secret Code 1, a wrong app id Code 101.
func (c *Client) ExchangeCode(ctx context.Context, appID, appSecret, code string) (token string, err error) {
	const op = "GET /oauth/access_token"
	switch {
	case strings.TrimSpace(appID) == "":
		return "", invalid(op, "empty app id")
	case appSecret == "":
		return "", invalid(op, "empty app secret")
	case strings.TrimSpace(code) == "":
		return "", invalid(op, "empty code")
	}
	cl := call{
		method:  http.MethodGet,
		path:    "/oauth/access_token",
		query:   url.Values{"client_id": {appID}, "client_secret": {appSecret}, "code": {code}},
		secrets: []string{appSecret, code},
	}
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := c.do(ctx, cl, &out); err != nil {
		return "", err
	}
	if out.AccessToken == "" {
		return "", cl.fail(ErrUnexpectedResponse, ErrUnexpectedResponse.Error()+": answer has no access_token")
	}
	return out.AccessToken, nil
}

// SubscribeApp subscribes the app to the WhatsApp Business Account's webhooks:
// POST <wabaID>/subscribed_apps with the business token, no body (the app's own callback URL
// applies).
func (c *Client) SubscribeApp(ctx context.Context, token, wabaID string) error {
	return c.subscribedApps(ctx, http.MethodPost, token, wabaID)
}

// UnsubscribeApp removes the app's subscription to the WhatsApp Business Account:
// DELETE <wabaID>/subscribed_apps with the business token.
func (c *Client) UnsubscribeApp(ctx context.Context, token, wabaID string) error {
	return c.subscribedApps(ctx, http.MethodDelete, token, wabaID)
}

func (c *Client) subscribedApps(ctx context.Context, method, token, wabaID string) error {
	op := method + " /{waba_id}/subscribed_apps"
	if err := checkID(op, "WABA id", wabaID); err != nil {
		return err
	}
	if err := checkToken(op, token); err != nil {
		return err
	}
	return c.doSuccess(ctx, call{
		method:  method,
		path:    "/" + url.PathEscape(wabaID) + "/subscribed_apps",
		token:   token,
		secrets: []string{token},
	})
}

// Register registers the phone number for the Cloud API: POST <phoneNumberID>/register with
// {"messaging_product":"whatsapp","pin":<pin>}. pin must be 6 digits; it becomes the number's
// two-step verification PIN, or must equal the existing one (else an *Error with Code 133005;
// 133016 after too many register calls).
func (c *Client) Register(ctx context.Context, token, phoneNumberID, pin string) error {
	const op = "POST /{phone_number_id}/register"
	if err := checkID(op, "phone number id", phoneNumberID); err != nil {
		return err
	}
	if err := checkToken(op, token); err != nil {
		return err
	}
	if len(pin) != 6 || strings.Trim(pin, "0123456789") != "" {
		return invalid(op, "pin must be 6 digits")
	}
	body, _ := json.Marshal(struct {
		MessagingProduct string `json:"messaging_product"`
		PIN              string `json:"pin"`
	}{"whatsapp", pin})
	return c.doSuccess(ctx, call{
		method:  http.MethodPost,
		path:    "/" + url.PathEscape(phoneNumberID) + "/register",
		token:   token,
		body:    body,
		secrets: []string{token, pin},
	})
}

// PhoneNumber is a WhatsApp business phone number as the upstream describes it.
type PhoneNumber struct {
	// ID is the phone number id.
	ID string `json:"id"`
	// DisplayPhoneNumber is the number as the upstream formats it, e.g. "15550783881" or
	// "+1 555-555-5555" (both occur).
	DisplayPhoneNumber string `json:"display_phone_number"`
	// VerifiedName is the business display name.
	VerifiedName string `json:"verified_name"`
}

// phoneFields are the fields asked for a PhoneNumber.
const phoneFields = "id,display_phone_number,verified_name"

// GetPhoneNumber reads a phone number: GET <phoneNumberID>?fields=id,display_phone_number,verified_name.
// ID is phoneNumberID when the answer leaves it out.
func (c *Client) GetPhoneNumber(ctx context.Context, token, phoneNumberID string) (PhoneNumber, error) {
	const op = "GET /{phone_number_id}"
	if err := checkID(op, "phone number id", phoneNumberID); err != nil {
		return PhoneNumber{}, err
	}
	if err := checkToken(op, token); err != nil {
		return PhoneNumber{}, err
	}
	var pn PhoneNumber
	err := c.do(ctx, call{
		method:  http.MethodGet,
		path:    "/" + url.PathEscape(phoneNumberID),
		query:   url.Values{"fields": {phoneFields}},
		token:   token,
		secrets: []string{token},
	}, &pn)
	if err != nil {
		return PhoneNumber{}, err
	}
	if pn.ID == "" {
		pn.ID = phoneNumberID
	}
	return pn, nil
}

// ListPhoneNumbers lists the phone numbers of a WhatsApp Business Account:
// GET <wabaID>/phone_numbers?fields=id,display_phone_number,verified_name, following the "after"
// cursor (never the upstream's paging.next link, which embeds the token).
func (c *Client) ListPhoneNumbers(ctx context.Context, token, wabaID string) ([]PhoneNumber, error) {
	const op = "GET /{waba_id}/phone_numbers"
	if err := checkID(op, "WABA id", wabaID); err != nil {
		return nil, err
	}
	if err := checkToken(op, token); err != nil {
		return nil, err
	}
	numbers := []PhoneNumber{}
	after := ""
	for range maxPages {
		q := url.Values{"fields": {phoneFields}, "limit": {strconv.Itoa(c.pageSize)}}
		if after != "" {
			q.Set("after", after)
		}
		cl := call{
			method:  http.MethodGet,
			path:    "/" + url.PathEscape(wabaID) + "/phone_numbers",
			query:   q,
			token:   token,
			secrets: []string{token},
		}
		var page struct {
			Data   []PhoneNumber `json:"data"`
			Paging struct {
				Cursors struct {
					After string `json:"after"`
				} `json:"cursors"`
				Next string `json:"next"`
			} `json:"paging"`
		}
		if err := c.do(ctx, cl, &page); err != nil {
			return nil, err
		}
		numbers = append(numbers, page.Data...)
		next := page.Paging.Cursors.After
		if page.Paging.Next == "" || next == "" || len(page.Data) == 0 {
			return numbers, nil
		}
		if next == after {
			return nil, cl.fail(ErrUnexpectedResponse, ErrUnexpectedResponse.Error()+": paging cursor does not advance")
		}
		after = next
	}
	return nil, fmt.Errorf("graph: %s: more than %d pages of phone numbers: %w", op, maxPages, ErrUnexpectedResponse)
}

// PhoneNumberBelongsToWABA reports whether phoneNumberID is one of the WhatsApp Business
// Account's phone numbers (see ListPhoneNumbers), e.g. to check the ids an Embedded Signup
// session reported before using them.
func (c *Client) PhoneNumberBelongsToWABA(ctx context.Context, token, wabaID, phoneNumberID string) (bool, error) {
	if err := checkID("GET /{waba_id}/phone_numbers", "phone number id", phoneNumberID); err != nil {
		return false, err
	}
	numbers, err := c.ListPhoneNumbers(ctx, token, wabaID)
	if err != nil {
		return false, err
	}
	for _, n := range numbers {
		if n.ID == phoneNumberID {
			return true, nil
		}
	}
	return false, nil
}
