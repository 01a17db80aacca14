package fakegraph

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// gerr is one Graph error answer.
type gerr struct {
	status  int
	code    int
	subcode int
	typ     string
	msg     string
	details string // error_data.details (WhatsApp errors), with messaging_product "whatsapp"
	kind    string // WWW-Authenticate error kind; derived from code when empty
	// error_user_title / error_user_msg / is_transient (§1.6)
	userTitle, userMsg string
	transient          bool
}

type errData struct {
	MessagingProduct string `json:"messaging_product"`
	Details          string `json:"details"`
}

// envBody keeps the field order of Meta's sample (§1.6).
type envBody struct {
	Message        string   `json:"message"`
	Type           string   `json:"type"`
	Code           int      `json:"code"`
	ErrorData      *errData `json:"error_data,omitempty"`
	ErrorSubcode   int      `json:"error_subcode,omitempty"`
	IsTransient    *bool    `json:"is_transient,omitempty"`
	ErrorUserTitle string   `json:"error_user_title,omitempty"`
	ErrorUserMsg   string   `json:"error_user_msg,omitempty"`
	FBTraceID      string   `json:"fbtrace_id"`
}

func (e *gerr) envelope(trace string) envBody {
	b := envBody{Message: e.msg, Type: e.typ, Code: e.code, ErrorSubcode: e.subcode,
		ErrorUserTitle: e.userTitle, ErrorUserMsg: e.userMsg, FBTraceID: trace}
	if e.details != "" {
		b.ErrorData = &errData{MessagingProduct: "whatsapp", Details: e.details}
	}
	if e.transient {
		t := true
		b.IsTransient = &t
	}
	return b
}

func (e *gerr) render(trace string) []byte {
	return marshal(struct {
		Error envBody `json:"error"`
	}{e.envelope(trace)})
}

func (e *gerr) authKind() string {
	if e.kind != "" {
		return e.kind
	}
	return authKindFor(e.code)
}

func authKindFor(code int) string {
	switch {
	case code == 190 || code == 102:
		return "invalid_token"
	case code == 10 || (code >= 200 && code <= 299):
		return "insufficient_scope"
	}
	return "invalid_request"
}

// wwwAuthenticate renders the header Graph puts on error answers (§1.5), e.g.
// OAuth "Facebook Platform" "invalid_token" "Invalid OAuth access token - Cannot parse access token".
func wwwAuthenticate(kind, msg string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `OAuth "Facebook Platform" "` + kind + `" "` + r.Replace(msg) + `"`
}

// ---- the errors the fake produces itself ----

// errNoToken: no token at all. [OAS] Unauthorized example MissingAccessToken (code 104), HTTP 401.
func errNoToken() *gerr {
	return &gerr{status: 401, code: 104, typ: "OAuthException",
		msg: "An access token is required to request this resource."}
}

// errInvalidToken: unknown/malformed token (§7.3: 190, no subcode), HTTP 401 on WhatsApp nodes (§1.7).
func errInvalidToken() *gerr {
	return &gerr{status: 401, code: 190, typ: "OAuthException",
		msg: "Invalid OAuth access token - Cannot parse access token"}
}

// errRevokedToken: 190 subcode 460 (§1.7, "session has been invalidated").
func errRevokedToken() *gerr {
	return &gerr{status: 401, code: 190, subcode: 460, typ: "OAuthException",
		msg: "Error validating access token: The session has been invalidated because the user changed their password or Facebook has changed the session for security reasons."}
}

// errExpiredToken: 190 subcode 463 (§1.7, §7.3).
func errExpiredToken(at time.Time) *gerr {
	if at.IsZero() {
		at = time.Now()
	}
	pt := time.FixedZone("PDT", -7*3600)
	return &gerr{status: 401, code: 190, subcode: 463, typ: "OAuthException",
		msg: fmt.Sprintf("Error validating access token: Session has expired on %s. The current time is %s.",
			at.In(pt).Format("Monday, 02-Jan-06 15:04:05 MST"), time.Now().In(pt).Format("Monday, 02-Jan-06 15:04:05 MST"))}
}

// errUnsupported: unknown object, or an operation the object does not support (§1.7 code 100
// variant, GraphMethodException subcode 33).
func errUnsupported(method, id string) *gerr {
	return &gerr{status: 400, code: 100, subcode: 33, typ: "GraphMethodException",
		msg: "Unsupported " + strings.ToLower(method) + " request. Object with ID '" + id +
			"' does not exist, cannot be loaded due to missing permissions, or does not support this operation. Please read the Graph API documentation at https://developers.facebook.com/docs/graph-api"}
}

// permissionError: the token is valid but not granted this object (§1.7 / [ERRTBL]: code 10 and
// 200-299 have HTTP 403). Messaging uses code 10 (WhatsApp "Permission denied"); management
// edges use code 200 ([OAS] 403 examples).
func permissionError(messaging bool) *gerr {
	if messaging {
		return &gerr{status: 403, code: 10, typ: "OAuthException",
			msg:     "(#10) Application does not have permission for this action",
			details: "Permission is either not granted or has been removed."}
	}
	return &gerr{status: 403, code: 200, typ: "OAuthException", msg: "(#200) Permissions error"}
}

func errNonexistingField(field, nodeType string) *gerr {
	return &gerr{status: 400, code: 100, typ: "OAuthException",
		msg: "(#100) Tried accessing nonexisting field (" + field + ") on node type (" + nodeType + ")"}
}

// errParam: Graph's parameter validation errors, "(#100) <text>".
func errParam(text string) *gerr {
	return &gerr{status: 400, code: 100, typ: "OAuthException", msg: "(#100) " + text}
}

func errRequired(param string) *gerr { return errParam("The parameter " + param + " is required.") }

func errUnexpectedKey(key, param string) *gerr {
	if param == "" {
		return errParam(`Unexpected key "` + key + `".`)
	}
	return errParam(`Unexpected key "` + key + `" on param "` + param + `".`)
}

// errInvalidParam: the WhatsApp "(#100) Invalid parameter" with details (§1.7, [FIELD]).
func errInvalidParam(details string) *gerr {
	return &gerr{status: 400, code: 100, typ: "OAuthException", msg: "(#100) Invalid parameter", details: details}
}

// waErr: a WhatsApp error "(#code) title" with error_data.details, status per DocStatus.
func waErr(code int, title, details string) *gerr {
	return &gerr{status: DocStatus(code), code: code, typ: "OAuthException",
		msg: fmt.Sprintf("(#%d) %s", code, title), details: details}
}

// ---- exported helpers for FailNext ----

// GraphError builds a Graph error envelope:
// {"error":{"message","type","code","error_subcode" (when subcode != 0),"fbtrace_id"}}.
func GraphError(message, typ string, code, subcode int) map[string]any {
	e := map[string]any{"message": message, "type": typ, "code": code, "fbtrace_id": randID(23)}
	if subcode != 0 {
		e["error_subcode"] = subcode
	}
	return map[string]any{"error": e}
}

// WhatsAppError builds the WhatsApp Cloud API error envelope (§1.6):
// {"error":{"message":"(#<code>) <title>","type":"OAuthException","code":<code>,
// "error_data":{"messaging_product":"whatsapp","details":<details>},"fbtrace_id"}}.
func WhatsAppError(code int, title, details string) map[string]any {
	e := map[string]any{"message": fmt.Sprintf("(#%d) %s", code, title), "type": "OAuthException",
		"code": code, "fbtrace_id": randID(23)}
	if details != "" {
		e["error_data"] = map[string]any{"messaging_product": "whatsapp", "details": details}
	}
	return map[string]any{"error": e}
}

func withSubcode(env map[string]any, subcode int) map[string]any {
	env["error"].(map[string]any)["error_subcode"] = subcode
	return env
}

// DocStatus is the HTTP status Meta's error table documents for a code (§1.7 "docs status").
// Real captures often show 400 for the rate-limit codes; pass that status explicitly to FailNext
// to test the observed variant.
func DocStatus(code int) int {
	switch code {
	case 0, 190, 102, 104:
		return http.StatusUnauthorized
	case 10, 368, 131031:
		return http.StatusForbidden
	case 4, 80007, 130429, 131048, 131056:
		return http.StatusTooManyRequests
	case 3, 131000:
		return http.StatusInternalServerError
	case 2, 131016:
		return http.StatusServiceUnavailable
	case 132001:
		return http.StatusNotFound
	}
	if code >= 200 && code <= 299 {
		return http.StatusForbidden
	}
	return http.StatusBadRequest
}

// ErrTokenExpired is code 190 subcode 463, the dead-token answer (§1.7).
func ErrTokenExpired() map[string]any {
	return withSubcode(GraphError("Error validating access token: Session has expired on Tuesday, 01-Sep-26 10:00:00 PDT. The current time is Tuesday, 01-Sep-26 10:00:01 PDT.", "OAuthException", 190, 0), 463)
}

// ErrInvalidToken is code 190 without subcode (§7.3).
func ErrInvalidToken() map[string]any {
	return GraphError("Invalid OAuth access token - Cannot parse access token", "OAuthException", 190, 0)
}

// ErrRateLimitHit is 130429 with subcode 2494055, Meta's own sample (§1.6).
func ErrRateLimitHit() map[string]any {
	return withSubcode(WhatsAppError(130429, "Rate limit hit", "Message failed to send because there were too many messages sent from this phone number in a short period of time"), 2494055)
}

// ErrPairRateLimit is 131056 (§1.7).
func ErrPairRateLimit() map[string]any {
	return WhatsAppError(131056, "(Business Account, Consumer Account) pair rate limit hit", "Too many messages sent from the sender phone number to the same recipient phone number in a short period of time.")
}

// ErrReengagement is the synchronous form of 131047 (§1.7).
func ErrReengagement() map[string]any {
	return WhatsAppError(131047, "Re-engagement message", "Message failed to send because more than 24 hours have passed since the customer last replied to this number.")
}

// ErrAppRateLimit is code 4 (§1.7; [OAS] subcode 2446079, is_transient).
func ErrAppRateLimit() map[string]any {
	env := withSubcode(GraphError("(#4) Application request limit reached", "OAuthException", 4, 0), 2446079)
	env["error"].(map[string]any)["is_transient"] = true
	return env
}

// ErrWABARateLimit is 80007 (§1.7).
func ErrWABARateLimit() map[string]any {
	return GraphError("(#80007) There have been too many calls to this WhatsApp Business account.", "OAuthException", 80007, 0)
}

// ErrSomethingWentWrong is the transient 131000 (§1.7).
func ErrSomethingWentWrong() map[string]any {
	return WhatsAppError(131000, "Something went wrong", "Something went wrong")
}

// ErrServiceUnavailable is the transient 131016 (§1.7).
func ErrServiceUnavailable() map[string]any {
	return WhatsAppError(131016, "Service unavailable", "A service is temporarily unavailable.")
}
