package managementapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/store"
)

// Service is the one service layer of wabarelay's management: every operation on an org's
// channels, webhooks, deliveries, messages and API keys, with every check and message of the
// interface, and the reads the dashboard's pages show. Build one per configuration and hand it
// to every front end: the API's HTTP handlers (Handler) decode a request, call one operation
// and encode its answer; the dashboard calls the same operations with its form values and
// reads its pages through it; the CLI makes the operator's operations.
//
// Every operation takes a Principal, its caller:
//
//   - An API key's principal (the API, the dashboard) acts in the key's org: an operation
//     finds, changes and creates only that org's records, within the org's caps. Its refusal
//     is an *Error carrying the interface's status and message; any other error is a failure
//     that is not the caller's (see ErrorFor).
//   - The operator's principal (Operator(), the CLI) makes the operator's operations:
//     CreateOrg, CreateOrgAPIKey, ListOrgAPIKeys, RevokeAnyAPIKey, DeactivateChannel,
//     ReopenChannel and RotateAnyWebhookSecret. They name their org or record themselves and
//     cross orgs; they are not capped (limits apply to what an org does to itself), and they
//     answer in the API's shapes with the record's org added (org_id). Their errors are the
//     store's, as the CLI prints them (errors.Is store.ErrWebhookNotFound, ...): they are not
//     answers of the HTTP interface. An API key's principal is refused them (403).
//
// The operator's principal belongs to no org: it does not make the operations of an org.
// Authentication, which turns a credential into a principal (API keys, dashboard sessions), is
// not the Service's: the API's handler and the dashboard's sign-in do it on the store.
type Service struct {
	opt    Options
	logger *zap.Logger
}

// NewService returns a Service; zero Options fields take their documented defaults.
func NewService(opt Options) *Service {
	if opt.Health == nil {
		st := opt.Store
		opt.Health = func(ctx context.Context) error {
			if st.Ping(ctx) != nil {
				return errors.New("Postgres unavailable")
			}
			return nil
		}
	}
	if opt.ConnectLinkTTL <= 0 {
		opt.ConnectLinkTTL = 168 * time.Hour
	}
	if opt.MaxWebhooksPerOrg <= 0 {
		opt.MaxWebhooksPerOrg = DefaultMaxWebhooksPerOrg
	}
	if opt.MaxAPIKeysPerOrg <= 0 {
		opt.MaxAPIKeysPerOrg = DefaultMaxAPIKeysPerOrg
	}
	logger := opt.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Service{opt: opt, logger: logger}
}

// Error is an operation's refusal as the interface answers it: the HTTP status and the message
// of the JSON body's "error". Use errors.As to find it.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

func unprocessable(format string, args ...any) *Error {
	return &Error{Status: http.StatusUnprocessableEntity, Message: fmt.Sprintf(format, args...)}
}

var errRateLimited = &Error{http.StatusTooManyRequests, httpx.MsgRateLimited}

// LimitKey names an API key's bucket in the management rate limiter. The dashboard charges its
// page reads to the same bucket, so a key's API calls and page loads share one budget.
func LimitKey(keyID uuid.UUID) string { return "mgmt:" + keyID.String() }

// Admit starts a call made by key, before its operation: Options.OnAuthenticated is called
// with r, then the call is charged to the key's management rate limit (Charge).
func (s *Service) Admit(r *http.Request, key store.APIKey, hdr http.Header) error {
	if s.opt.OnAuthenticated != nil {
		s.opt.OnAuthenticated(r, key)
	}
	return s.Charge(r.Context(), key, hdr)
}

// Charge counts one call of key against its management rate limit (Options.Limiter; none when
// nil). The limiter's RateLimit headers (and Retry-After, over the limit) are set in hdr; over
// the limit the answer is an *Error 429 httpx.MsgRateLimited. A limiter failure lets the call
// through (logged): the management API is not worth an outage when the limiter's store is down.
// The dashboard charges its page loads with it, so a key's API calls and page loads share one
// budget.
func (s *Service) Charge(ctx context.Context, key store.APIKey, hdr http.Header) error {
	if s.opt.Limiter == nil {
		return nil
	}
	d, err := s.opt.Limiter.Allow(ctx, LimitKey(key.ID))
	if err != nil {
		s.logger.Warn("management rate limiter unavailable; request allowed", zap.Error(err))
		return nil
	}
	d.SetHeaders(hdr)
	if !d.Allowed {
		return errRateLimited
	}
	return nil
}

// ErrorFor returns the interface's answer to err, an operation's error while serving r: an
// *Error as it is; any other error (a failure that is not the caller's, logged with r's method
// and path, never holding secrets) 503 httpx.MsgUnavailable when Postgres cannot be reached
// (the caller may retry after 5 seconds), else 500 httpx.MsgInternal. It returns nil when err
// is nil or r's client has gone away (there is no one to answer).
func (s *Service) ErrorFor(r *http.Request, err error) *Error {
	if e, ok := errors.AsType[*Error](err); ok {
		return e
	}
	if err == nil || r.Context().Err() != nil {
		return nil
	}
	if unavailable(err) {
		s.logger.Warn("database unavailable", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
		return &Error{http.StatusServiceUnavailable, httpx.MsgUnavailable}
	}
	s.logger.Error("management request failed", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
	return &Error{http.StatusInternalServerError, httpx.MsgInternal}
}

// unavailable reports errors that mean Postgres could not be reached or is shutting down, as
// opposed to a failing statement.
func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// class 08: connection exception; 57P: operator intervention; 53300: too many connections
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") || pgErr.Code == "53300"
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connectErr) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || pgconn.SafeToRetry(err)
}

// storeError maps the store's errors to the interface's refusals; other errors pass unchanged.
func (s *Service) storeError(err error) error {
	if e, ok := broadcastStoreError(err); ok {
		return e
	}
	switch {
	case errors.Is(err, store.ErrChannelNotFound):
		return &Error{http.StatusNotFound, MsgChannelNotFound}
	case errors.Is(err, store.ErrWebhookNotFound):
		return &Error{http.StatusNotFound, MsgWebhookNotFound}
	case errors.Is(err, store.ErrAPIKeyNotFound):
		return &Error{http.StatusNotFound, MsgAPIKeyNotFound}
	case errors.Is(err, store.ErrChannelActive):
		return &Error{http.StatusConflict, MsgChannelActive}
	case errors.Is(err, store.ErrDeliveryNotFound):
		return &Error{http.StatusNotFound, MsgDeliveryNotFound}
	case errors.Is(err, store.ErrDeliveryNotFailed):
		return &Error{http.StatusConflict, MsgDeliveryNotFailed}
	case errors.Is(err, store.ErrOperatorDeactivated):
		return errOperatorDeactivated
	case errors.Is(err, store.ErrNotReconnectable):
		return errNotReconnectable
	case errors.Is(err, store.ErrChannelsNotInOrg):
		return errChannelsOrg
	case errors.Is(err, store.ErrWebhookLimit):
		return unprocessable(MsgWebhookLimit, s.opt.MaxWebhooksPerOrg)
	case errors.Is(err, store.ErrAPIKeyLimit):
		return unprocessable(MsgAPIKeyLimit, s.opt.MaxAPIKeysPerOrg)
	}
	return err
}

// id parses the id of an operation's path: a malformed id names nothing, so it is refused
// with 404 and the message of what it should name.
func id(s, notFound string) (uuid.UUID, error) {
	v, ok := parseID(s)
	if !ok {
		return uuid.UUID{}, &Error{http.StatusNotFound, notFound}
	}
	return v, nil
}

func (s *Service) connectBase(p Principal) string {
	if s.opt.ConnectBase != "" {
		return s.opt.ConnectBase
	}
	return p.Origin
}

// ---- channels ---------------------------------------------------------------------------

// ChannelInput is the body of POST /channels.
type ChannelInput struct {
	Name string
}

// ListChannels returns the org's channels.
func (s *Service) ListChannels(ctx context.Context, p Principal) ([]Channel, error) {
	cs, err := s.opt.Store.ListChannels(ctx, p.Key.OrgID)
	if err != nil {
		return nil, err
	}
	base := s.connectBase(p)
	out := make([]Channel, len(cs))
	for i, c := range cs {
		out[i] = NewChannel(c, base)
	}
	return out, nil
}

// CreateChannel creates a pending channel with an open connect link.
func (s *Service) CreateChannel(ctx context.Context, p Principal, in ChannelInput) (Channel, error) {
	return s.createChannel(ctx, p, fields{"name": in.Name})
}

func (s *Service) createChannel(ctx context.Context, p Principal, src source) (Channel, error) {
	name, e := requiredName(src)
	if e != nil {
		return Channel{}, e
	}
	c, err := s.opt.Store.CreateChannel(ctx, p.Key.OrgID, name, s.opt.ConnectLinkTTL)
	if err != nil {
		return Channel{}, err
	}
	return NewChannel(c, s.connectBase(p)), nil
}

// GetChannel returns one of the org's channels.
func (s *Service) GetChannel(ctx context.Context, p Principal, channelID string) (Channel, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return Channel{}, err
	}
	c, err := s.opt.Store.GetChannel(ctx, p.Key.OrgID, cid)
	if err != nil {
		return Channel{}, s.storeError(err)
	}
	return NewChannel(c, s.connectBase(p)), nil
}

// DeleteChannel deletes one of the org's channels; an active one only with force. Deleting a
// connected channel whose business account no other channel uses calls
// Options.AfterChannelDeleted in its own goroutine.
func (s *Service) DeleteChannel(ctx context.Context, p Principal, channelID string, force bool) error {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return err
	}
	deleted, err := s.opt.Store.DeleteChannel(ctx, p.Key.OrgID, cid, force)
	if err != nil {
		return s.storeError(err)
	}
	if s.opt.AfterChannelDeleted != nil && deleted.WabaID != "" {
		go func() {
			defer func() {
				if v := recover(); v != nil {
					s.logger.Error("after-delete hook panicked", zap.Any("panic", v))
				}
			}()
			s.opt.AfterChannelDeleted(deleted)
		}()
	}
	return nil
}

// ---- webhooks ---------------------------------------------------------------------------

// WebhookInput is the body of POST /webhooks. Events and ChannelIDs may hold duplicates (kept
// once); a channel id that is not a UUID names no channel of the org.
type WebhookInput struct {
	Name       string
	URL        string
	Events     []string
	ChannelIDs []string
	// Ordering is "none", "conversation" or "" (none).
	Ordering string
}

// ListWebhooks returns the org's webhooks.
func (s *Service) ListWebhooks(ctx context.Context, p Principal) ([]Webhook, error) {
	ws, err := s.opt.Store.ListWebhooks(ctx, p.Key.OrgID)
	if err != nil {
		return nil, err
	}
	out := make([]Webhook, len(ws))
	for i, wh := range ws {
		out[i] = NewWebhook(wh)
	}
	return out, nil
}

// CreateWebhook creates a webhook; the answer holds its signing secret, this once. The org's
// cap on webhooks applies.
func (s *Service) CreateWebhook(ctx context.Context, p Principal, in WebhookInput) (Webhook, error) {
	f := fields{"name": in.Name, "url": in.URL, "events": in.Events, "channel_ids": in.ChannelIDs}
	if in.Ordering != "" {
		f["ordering"] = in.Ordering
	}
	return s.createWebhook(ctx, p, f)
}

func (s *Service) createWebhook(ctx context.Context, p Principal, src source) (Webhook, error) {
	in, e := parseWebhookInput(src)
	if e != nil {
		return Webhook{}, e
	}
	in.MaxPerOrg = s.opt.MaxWebhooksPerOrg
	wh, secret, err := s.opt.Store.CreateWebhook(ctx, p.Key.OrgID, in)
	if err != nil {
		return Webhook{}, s.storeError(err)
	}
	out := NewWebhook(wh)
	out.HMACSecret = secret
	return out, nil
}

// GetWebhook returns one of the org's webhooks.
func (s *Service) GetWebhook(ctx context.Context, p Principal, webhookID string) (Webhook, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return Webhook{}, err
	}
	wh, err := s.opt.Store.GetWebhook(ctx, p.Key.OrgID, wid)
	if err != nil {
		return Webhook{}, s.storeError(err)
	}
	return NewWebhook(wh), nil
}

// SetWebhookStatus pauses ("paused") or resumes ("active") one of the org's webhooks.
func (s *Service) SetWebhookStatus(ctx context.Context, p Principal, webhookID, status string) (Webhook, error) {
	return s.setWebhookStatus(ctx, p, webhookID, fields{"status": status})
}

// SetWebhookOrdering sets one of the org's webhooks' ordering: "none" or "conversation".
func (s *Service) SetWebhookOrdering(ctx context.Context, p Principal, webhookID, ordering string) (Webhook, error) {
	return s.setWebhookStatus(ctx, p, webhookID, fields{"ordering": ordering})
}

// setWebhookStatus applies a PATCH /webhooks/{id} body: "status", "ordering" or both (status is
// required when ordering is absent, and checked first).
func (s *Service) setWebhookStatus(ctx context.Context, p Principal, webhookID string, src source) (Webhook, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return Webhook{}, err
	}
	_, hasStatus, se := src.str("status") // (present, of any type)
	_, hasOrdering, oe := src.str("ordering")
	hasStatus, hasOrdering = hasStatus || se != nil, hasOrdering || oe != nil
	var status string
	var e *Error
	if hasStatus || !hasOrdering {
		if status, e = parseStatus(src); e != nil {
			return Webhook{}, e
		}
	}
	ordering, hasOrdering, e := parseOrdering(src)
	if e != nil {
		return Webhook{}, e
	}
	if hasOrdering {
		wh, err := s.opt.Store.SetWebhookOrdering(ctx, p.Key.OrgID, wid, ordering)
		if err != nil || status == "" {
			return NewWebhook(wh), s.storeError(err)
		}
	}
	wh, err := s.opt.Store.SetWebhookStatus(ctx, p.Key.OrgID, wid, status)
	if err != nil {
		return Webhook{}, s.storeError(err)
	}
	return NewWebhook(wh), nil
}

// DeleteWebhook deletes one of the org's webhooks.
func (s *Service) DeleteWebhook(ctx context.Context, p Principal, webhookID string) error {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return err
	}
	return s.storeError(s.opt.Store.DeleteWebhook(ctx, p.Key.OrgID, wid))
}

// assignment parses the webhook and channel ids of an assignment; the webhook is checked first.
func assignment(webhookID, channelID string) (wid, cid uuid.UUID, err error) {
	if wid, err = id(webhookID, MsgWebhookNotFound); err != nil {
		return
	}
	cid, err = id(channelID, MsgChannelNotFound)
	return
}

// AssignChannel assigns one of the org's channels to one of its webhooks (again: no change).
func (s *Service) AssignChannel(ctx context.Context, p Principal, webhookID, channelID string) (Assignment, error) {
	wid, cid, err := assignment(webhookID, channelID)
	if err != nil {
		return Assignment{}, err
	}
	if err := s.opt.Store.AssignChannel(ctx, p.Key.OrgID, wid, cid); err != nil {
		return Assignment{}, s.storeError(err)
	}
	return Assignment{WebhookConfigID: wid, ChannelID: cid}, nil
}

// UnassignChannel removes a channel from one of the org's webhooks.
func (s *Service) UnassignChannel(ctx context.Context, p Principal, webhookID, channelID string) error {
	wid, cid, err := assignment(webhookID, channelID)
	if err != nil {
		return err
	}
	return s.storeError(s.opt.Store.UnassignChannel(ctx, p.Key.OrgID, wid, cid))
}

// ---- deliveries -------------------------------------------------------------------------

const (
	defaultPageLimit = 50
	maxPageLimit     = 100
)

var deliveryStatuses = map[string]bool{"pending": true, "in_flight": true, "delivered": true, "failed": true}

// DeliveryQuery selects a page of a webhook's delivery log: the query parameters of
// GET /webhooks/{id}/deliveries as given ("" when absent).
type DeliveryQuery struct {
	Status, Limit, Cursor string
	// Since and Until keep the deliveries created in [Since, Until) (nil: unbounded). Not API
	// parameters: the dashboard's filters.
	Since, Until *time.Time
	// Newest lists newest first (the cursor then pages to older ones). Not an API parameter:
	// the dashboard's delivery log.
	Newest bool
}

// ListDeliveries returns a page of a webhook's delivery log and, when another page follows,
// the query of the next page.
func (s *Service) ListDeliveries(ctx context.Context, p Principal, webhookID string, q DeliveryQuery) ([]Delivery, url.Values, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return nil, nil, err
	}
	page := store.DeliveryPage{Status: q.Status, Limit: defaultPageLimit, Since: q.Since, Until: q.Until, Newest: q.Newest}
	if page.Status != "" && !deliveryStatuses[page.Status] {
		return nil, nil, unprocessable(`"status" must be one of: pending, in_flight, delivered, failed`)
	}
	if q.Limit != "" {
		n, err := strconv.Atoi(q.Limit)
		if err != nil || n < 1 || n > maxPageLimit {
			return nil, nil, unprocessable(`"limit" must be an integer from 1 to %d`, maxPageLimit)
		}
		page.Limit = n
	}
	if q.Cursor != "" {
		c, ok := parseID(q.Cursor)
		if !ok {
			return nil, nil, unprocessable(`"cursor" is invalid`)
		}
		page.After = &c
	}
	ds, more, err := s.opt.Store.ListDeliveries(ctx, p.Key.OrgID, wid, page)
	if err != nil {
		return nil, nil, s.storeError(err)
	}
	out := make([]Delivery, len(ds))
	for i, d := range ds {
		out[i] = newDelivery(d)
	}
	var next url.Values
	if more {
		next = url.Values{"limit": {strconv.Itoa(page.Limit)}, "cursor": {ds[len(ds)-1].ID.String()}}
		if page.Status != "" {
			next.Set("status", page.Status)
		}
	}
	return out, next, nil
}

// RetryDelivery re-queues a failed delivery with a fresh schedule.
func (s *Service) RetryDelivery(ctx context.Context, p Principal, webhookID, deliveryID string) error {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return err
	}
	did, err := id(deliveryID, MsgDeliveryNotFound)
	if err != nil {
		return err
	}
	return s.storeError(s.opt.Store.RetryDelivery(ctx, p.Key.OrgID, wid, did))
}

// RecoverDeliveries re-queues every failed delivery of a webhook created since a time (an
// ISO 8601 timestamp with a time zone) and returns how many.
func (s *Service) RecoverDeliveries(ctx context.Context, p Principal, webhookID, since string) (int, error) {
	return s.recoverDeliveries(ctx, p, webhookID, fields{"since": since})
}

func (s *Service) recoverDeliveries(ctx context.Context, p Principal, webhookID string, src source) (int, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return 0, err
	}
	since, present, e := timestamp(src, "since")
	if e != nil {
		return 0, e
	}
	if !present {
		return 0, unprocessable(`"since" is required`)
	}
	n, err := s.opt.Store.RecoverDeliveries(ctx, p.Key.OrgID, wid, since)
	return n, s.storeError(err)
}
