package managementapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// MaxBodyBytes is the largest request body the API reads, but for the routes that set their
// own (MaxBroadcastBodyBytes).
const MaxBodyBytes = 1 << 20

// MaxBroadcastBodyBytes is the largest body of POST /channels/{id}/broadcasts: up to 100,000
// recipients with their template components (DESIGN §5c "Broadcasts").
const MaxBroadcastBodyBytes = 16 << 20

// Limits on field values.
const (
	maxNameLen   = 200
	maxURLLen    = 2048
	maxChannelID = 1000
)

var (
	errInvalidJSON  = &Error{http.StatusBadRequest, "Invalid JSON body"}
	errTooLarge     = &Error{http.StatusRequestEntityTooLarge, "Request body too large"}
	errContentType  = &Error{http.StatusUnsupportedMediaType, "Content-Type must be application/json"}
	errBadEvents    = unprocessable(`"events" values must be one of: messages, message_status, channel_status, message_template_status_update, channel_health`)
	errBadStatus    = unprocessable(`"status" must be one of: active, paused`)
	errBadOrdering  = unprocessable(`"ordering" must be one of: none, conversation`)
	errChannelsOrg  = unprocessable("One or more channel_ids not found in this org")
	errHTTPSURL     = unprocessable(`"url" must start with https://`)
	errInvalidURL   = unprocessable(`"url" must be a valid URL`)
	errForceBoolean = unprocessable(`"force" must be a boolean`)
	errExpiresIn    = unprocessable(`"expires_in" must be a duration such as 720h, 90m or 30d`)
	errExpiresInPos = unprocessable(`"expires_in" must be positive`)
)

// source gives an input's fields to the checks below, which read them in the order the
// interface reports problems: a JSON body (object, each field's type checked as it is read) or
// an operation's typed input (fields). ok is false for an absent or null field.
type source interface {
	str(name string) (val string, ok bool, e *Error)
	strings(name string) (val []string, ok bool, e *Error)
}

// fields is an operation's typed input as a source: every field is present, of its type; its
// text must still be valid UTF-8 without NUL characters.
type fields map[string]any

func (f fields) str(name string) (string, bool, *Error) {
	if _, present := f[name]; !present {
		return "", false, nil // an optional field the operation was not given
	}
	v, _ := f[name].(string)
	if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
		return "", false, errNotText(name)
	}
	return v, true, nil
}

func (f fields) strings(name string) ([]string, bool, *Error) {
	v, _ := f[name].([]string)
	for _, s := range v {
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return nil, false, errNotText(name)
		}
	}
	return v, true, nil
}

// object is a decoded JSON object body, field by field, so that each field's type can be
// checked and reported on its own.
type object map[string]json.RawMessage

// readObject reads a JSON object body of at most MaxBodyBytes.
func readObject(w http.ResponseWriter, r *http.Request) (object, *Error) {
	return readObjectMax(w, r, MaxBodyBytes)
}

// readObjectMax reads a JSON object body of at most limit bytes; a longer one is errTooLarge.
func readObjectMax(w http.ResponseWriter, r *http.Request, limit int64) (object, *Error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, errContentType
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, errTooLarge
		}
		return nil, errInvalidJSON
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var obj object
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, errInvalidJSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errInvalidJSON // trailing data after the object
	}
	return obj, nil
}

func isNull(raw json.RawMessage) bool { return raw == nil || string(raw) == "null" }

// str returns field name as a string; ok is false when it is absent or null. A string that
// is not valid UTF-8 text without NUL characters (which Postgres's text types refuse) is
// refused here, the one place caller strings enter: encoding/json would quietly turn invalid
// UTF-8 into U+FFFD, so the raw bytes are checked before decoding.
func (o object) str(name string) (val string, ok bool, e *Error) {
	return rawString(o[name], name)
}

// rawString is object.str of a JSON value raw, reported as field name.
func rawString(raw json.RawMessage, name string) (val string, ok bool, e *Error) {
	if isNull(raw) {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &val); err != nil {
		return "", false, unprocessable(`"%s" must be a string`, name)
	}
	if !validText(raw, val) {
		return "", false, errNotText(name)
	}
	return val, true, nil
}

// validText reports whether a decoded JSON string val (raw: its JSON text) is valid UTF-8
// without NUL characters.
func validText(raw json.RawMessage, val string) bool {
	return utf8.Valid(raw) && strings.IndexByte(val, 0) < 0
}

func errNotText(name string) *Error {
	return unprocessable(`"%s" must be valid UTF-8 text without NUL characters`, name)
}

// strings returns field name as an array of strings; ok is false when it is absent or null.
// A null element is a wrong type (json.Unmarshal would turn it into "").
func (o object) strings(name string) (val []string, ok bool, e *Error) {
	raw := o[name]
	if isNull(raw) {
		return nil, false, nil
	}
	var elems []*string
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, false, unprocessable(`"%s" must be an array of strings`, name)
	}
	val = make([]string, 0, len(elems))
	for _, p := range elems {
		if p == nil {
			return nil, false, unprocessable(`"%s" must be an array of strings`, name)
		}
		val = append(val, *p)
	}
	for _, v := range val {
		if !validText(raw, v) {
			return nil, false, errNotText(name)
		}
	}
	return val, true, nil
}

func requiredName(o source) (string, *Error) {
	name, err := optionalName(o)
	if err == nil && name == "" {
		err = unprocessable(`"name" is required`)
	}
	return name, err
}

// optionalName returns the trimmed "name", "" when it is absent, null or only white space.
func optionalName(o source) (string, *Error) {
	name, _, err := o.str("name")
	if err != nil {
		return "", err
	}
	name = strings.TrimSpace(name)
	if utf8.RuneCountInString(name) > maxNameLen {
		return "", unprocessable(`"name" must be at most %d characters`, maxNameLen)
	}
	return name, nil
}

// apiKeyInput is a validated POST /api_keys body. expiresIn is 0 for a key that never expires.
type apiKeyInput struct {
	name      string
	expiresIn time.Duration
}

// parseAPIKeyInput validates a POST /api_keys body: both fields are optional; name is checked
// first. "expires_in" is a duration as ParseLifetime reads it ("720h", "1h30m", "30d"); absent,
// null, empty or only white space means no expiry.
func parseAPIKeyInput(o source) (apiKeyInput, *Error) {
	var in apiKeyInput
	var err *Error
	if in.name, err = optionalName(o); err != nil {
		return in, err
	}
	raw, _, err := o.str("expires_in")
	if err != nil {
		return in, err
	}
	if raw = strings.TrimSpace(raw); raw == "" {
		return in, nil
	}
	d, perr := ParseLifetime(raw)
	if perr != nil {
		return in, errExpiresIn
	}
	if d <= 0 {
		return in, errExpiresInPos
	}
	in.expiresIn = d
	return in, nil
}

// maxLifetimeLen bounds the text ParseLifetime reads; real lifetimes are a few characters.
const maxLifetimeLen = 64

// ParseLifetime parses a key lifetime: a Go duration string (time.ParseDuration) in which d,
// a day of 24h, may also be used as a unit: "720h", "1h30m", "90d", "1.5d", "1d12h". The API's
// "expires_in" and the CLI's `apikey create --expires-in` both read it.
func ParseLifetime(s string) (time.Duration, error) {
	if len(s) > maxLifetimeLen {
		return 0, fmt.Errorf("duration %.20q…: too long", s)
	}
	var sb strings.Builder
	num := 0 // start of the number before s[i]
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9' || c == '.':
			continue
		case c == 'd' && num < i:
			days, err := strconv.ParseFloat(s[num:i], 64)
			if err != nil {
				return 0, fmt.Errorf("duration %q: invalid number of days", s)
			}
			sb.WriteString(strconv.FormatFloat(days*24, 'f', -1, 64))
			sb.WriteString("h")
		default:
			sb.WriteString(s[num : i+1])
		}
		num = i + 1
	}
	sb.WriteString(s[num:])
	return time.ParseDuration(sb.String())
}

// parseWebhookInput validates a POST /webhooks body. Fields are checked in the order name, url,
// events, channel_ids, ordering; the first problem is reported.
func parseWebhookInput(o source) (store.NewWebhook, *Error) {
	var in store.NewWebhook
	var err *Error
	if in.Name, err = requiredName(o); err != nil {
		return in, err
	}
	if in.URL, err = parseWebhookURL(o); err != nil {
		return in, err
	}
	if in.Events, err = parseEvents(o); err != nil {
		return in, err
	}
	if in.ChannelIDs, err = parseChannelIDs(o); err != nil {
		return in, err
	}
	in.Ordering, _, err = parseOrdering(o)
	return in, err
}

// parseOrdering returns the optional "ordering": "none" or "conversation" (ok is false when it
// is absent or null: the webhook keeps its ordering, "none" for a new one).
func parseOrdering(o source) (ordering string, ok bool, e *Error) {
	ordering, ok, e = o.str("ordering")
	if e != nil || !ok {
		return "", false, e
	}
	if ordering != store.OrderingNone && ordering != store.OrderingConversation {
		return "", false, errBadOrdering
	}
	return ordering, true, nil
}

func parseWebhookURL(o source) (string, *Error) {
	raw, ok, err := o.str("url")
	if err != nil {
		return "", err
	}
	raw = strings.TrimSpace(raw)
	if !ok || raw == "" {
		return "", unprocessable(`"url" is required`)
	}
	if !strings.HasPrefix(strings.ToLower(raw), "https://") {
		return "", errHTTPSURL
	}
	u, perr := url.Parse(raw)
	if perr != nil || len(raw) > maxURLLen || u.Host == "" || u.Hostname() == "" || u.User != nil || u.Fragment != "" {
		return "", errInvalidURL
	}
	return raw, nil
}

func parseEvents(o source) ([]string, *Error) {
	events, ok, err := o.strings("events")
	if err != nil {
		return nil, err
	}
	if !ok || len(events) == 0 {
		return nil, unprocessable(`"events" is required`)
	}
	out := make([]string, 0, len(events))
	for _, e := range events {
		if !slices.Contains(store.EventKinds, e) {
			return nil, errBadEvents
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out, nil
}

// parseChannelIDs returns the distinct channel ids; strings that are not UUIDs cannot name a
// channel of the org and give the not-found message.
func parseChannelIDs(o source) ([]uuid.UUID, *Error) {
	raw, _, err := o.strings("channel_ids")
	if err != nil {
		return nil, err
	}
	if len(raw) > maxChannelID {
		return nil, unprocessable(`"channel_ids" must have at most %d items`, maxChannelID)
	}
	ids := make([]uuid.UUID, 0, len(raw))
	for _, s := range raw {
		id, ok := parseID(s)
		if !ok {
			return nil, errChannelsOrg
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func parseStatus(o source) (string, *Error) {
	status, ok, err := o.str("status")
	if err != nil {
		return "", err
	}
	if !ok {
		return "", unprocessable(`"status" is required`)
	}
	if status != store.WebhookActive && status != store.WebhookPaused {
		return "", errBadStatus
	}
	return status, nil
}

// parseID parses a path or body id. Only the canonical 36-character form is accepted.
func parseID(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.UUID{}, false
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}
