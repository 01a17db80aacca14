// Package managementapi serves wabarelay's management API: channels, webhook configs and their
// channel assignments, delivery logs and the org's API keys, authenticated by API key and rate
// limited per key. It is a plain net/http handler; the Caddy module wabarelay_api mounts it, and
// the dashboard serves its actions through Handler.ServeAuthenticated.
package managementapi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
)

// Error messages of the interface document.
const (
	MsgKeyRequired     = "x-api-key header required"
	MsgKeyInvalid      = "Invalid or revoked API key"
	MsgKeyExpired      = "API key expired"
	MsgChannelNotFound = "Channel not found"
	MsgWebhookNotFound = "Webhook not found"
	MsgAPIKeyNotFound  = "API key not found"
	MsgChannelActive   = "Channel is active. Use ?force=true to delete it."

	MsgDeliveryNotFound    = "Delivery not found"
	MsgDeliveryNotFailed   = "Only failed deliveries can be retried"
	MsgOperatorDeactivated = "Channel was deactivated by the operator; only the operator can reopen it"
	MsgNotReconnectable    = "Channel has nothing to reconnect: it is connected, or its link is still open"
)

// HealthFunc checks the service's dependencies and returns an error naming the first one that
// is down ("Postgres unavailable"). The message is shown to clients, so it must hold no secret.
type HealthFunc func(ctx context.Context) error

// Options configure a Handler.
type Options struct {
	// Store is the data layer. Required.
	Store *store.Store
	// Limiter limits requests per API key. Nil means no limit.
	Limiter ratelimit.Limiter
	// Health backs GET /health. Nil means a Postgres ping.
	Health HealthFunc
	// ConnectBase is the prefix of connect_url ({connect_base}). Empty means the scheme and
	// host of each request.
	ConnectBase string
	// ConnectLinkTTL is how long a new channel's connect link stays valid.
	ConnectLinkTTL time.Duration
	// Logger receives request failures (never keys or secrets). Nil means no logging.
	Logger *zap.Logger
	// AfterChannelDeleted, if set, is called (in its own goroutine) after a connected channel
	// was deleted whose business account no other channel uses: the place to unsubscribe the
	// app from it upstream, best effort.
	AfterChannelDeleted func(store.DeletedChannel)
	// OnAuthenticated, if set, is called after a request's API key is accepted, e.g. to put
	// the key id into the access log.
	OnAuthenticated func(r *http.Request, key store.APIKey)
	// AuthGuard, if set, counts failed authentications per client address (httpx.ClientAddr)
	// and refuses an address that failed too often with 429 before any lookup, so a flood of
	// bad keys costs no queries.
	AuthGuard *authguard.Guard
	// MaxWebhooksPerOrg is the most webhooks an org may have: creating one more is refused
	// with 422 (MsgWebhookLimit). 0 means DefaultMaxWebhooksPerOrg.
	MaxWebhooksPerOrg int
	// MaxAPIKeysPerOrg is the most live API keys (neither revoked nor expired) an org may
	// have: creating one more through the API is refused with 422 (MsgAPIKeyLimit). 0 means
	// DefaultMaxAPIKeysPerOrg.
	MaxAPIKeysPerOrg int
}

// Default per-org caps (Options.MaxWebhooksPerOrg, Options.MaxAPIKeysPerOrg).
const (
	DefaultMaxWebhooksPerOrg = 100
	DefaultMaxAPIKeysPerOrg  = 100
)

// Messages of the per-org caps, formatted with the cap.
const (
	MsgWebhookLimit = "Webhook limit reached: an organization may have at most %d webhooks (wabarelay limits webhooks_per_org)"
	MsgAPIKeyLimit  = "API key limit reached: an organization may have at most %d API keys that are neither revoked nor expired (wabarelay limits api_keys_per_org)"
)

// Handler serves the management API. Paths are relative to {base_url}: the mount point must
// strip its prefix (Caddy's handle_path).
type Handler struct {
	opt    Options
	logger *zap.Logger
}

// New returns a Handler.
func New(opt Options) *Handler {
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
	return &Handler{opt: opt, logger: logger}
}

// request is one authenticated API call.
type request struct {
	w     http.ResponseWriter
	r     *http.Request
	orgID uuid.UUID
	// key is the API key making the call.
	key store.APIKey
	// params are the path segments after the route's fixed part (ids).
	params []string
}

// route is one path shape: segments with "*" for an id, and a handler per method. The ids'
// names (for the OpenAPI document) are "id", or "wid" and "cid" for assignments.
type route struct {
	pattern []string
	methods map[string]func(*Handler, *request)
	names   []string
}

var routes = []route{
	{[]string{"channels"}, map[string]func(*Handler, *request){
		http.MethodGet: (*Handler).listChannels, http.MethodPost: (*Handler).createChannel}, nil},
	{[]string{"channels", "*"}, map[string]func(*Handler, *request){
		http.MethodGet: (*Handler).getChannel, http.MethodDelete: (*Handler).deleteChannel}, nil},
	{[]string{"channels", "*", "reconnect"}, map[string]func(*Handler, *request){
		http.MethodPost: (*Handler).reconnectChannel}, nil},
	{[]string{"webhooks"}, map[string]func(*Handler, *request){
		http.MethodGet: (*Handler).listWebhooks, http.MethodPost: (*Handler).createWebhook}, nil},
	{[]string{"webhooks", "*"}, map[string]func(*Handler, *request){
		http.MethodGet: (*Handler).getWebhook, http.MethodPatch: (*Handler).patchWebhook,
		http.MethodDelete: (*Handler).deleteWebhook}, nil},
	{[]string{"webhooks", "*", "channels", "*"}, map[string]func(*Handler, *request){
		http.MethodPost: (*Handler).assignChannel, http.MethodDelete: (*Handler).unassignChannel}, []string{"wid", "cid"}},
	{[]string{"webhooks", "*", "deliveries"}, map[string]func(*Handler, *request){
		http.MethodGet: (*Handler).listDeliveries}, nil},
	{[]string{"webhooks", "*", "deliveries", "*", "retry"}, map[string]func(*Handler, *request){
		http.MethodPost: (*Handler).retryDelivery}, []string{"id", "did"}},
	{[]string{"webhooks", "*", "recover"}, map[string]func(*Handler, *request){
		http.MethodPost: (*Handler).recoverDeliveries}, nil},
	{[]string{"api_keys"}, map[string]func(*Handler, *request){
		http.MethodGet: (*Handler).listAPIKeys, http.MethodPost: (*Handler).createAPIKey}, nil},
	{[]string{"api_keys", "*"}, map[string]func(*Handler, *request){
		http.MethodDelete: (*Handler).revokeAPIKey}, nil},
}

// Routes returns "METHOD /path/{param}" for every operation the handler serves, for checking
// against the OpenAPI document.
func Routes() []string {
	out := []string{"GET /health"}
	for _, rt := range routes {
		params := rt.names
		if params == nil {
			params = []string{"id"}
		}
		segs := make([]string, len(rt.pattern))
		p := 0
		for i, s := range rt.pattern {
			if s == "*" {
				s = "{" + params[p] + "}"
				p++
			}
			segs[i] = s
		}
		for m := range rt.methods {
			out = append(out, m+" /"+strings.Join(segs, "/"))
		}
	}
	return out
}

func match(pattern, segs []string) ([]string, bool) {
	if len(pattern) != len(segs) {
		return nil, false
	}
	var params []string
	for i, p := range pattern {
		switch {
		case p == "*":
			params = append(params, segs[i])
		case p != segs[i]:
			return nil, false
		}
	}
	return params, true
}

// ServeHTTP implements http.Handler: GET /health, else the x-api-key header is authenticated and
// the request is served as by ServeAuthenticated.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, nil)
}

// ServeAuthenticated serves r exactly as ServeHTTP does once r's API key has been accepted, on
// behalf of key: the same routes (r.URL.Path relative to {base_url}), Options.OnAuthenticated
// hook, per-key rate limit and RateLimit headers, validation and answers, scoped to key.OrgID.
// It does not read x-api-key and does not consult Options.AuthGuard. It exists so that another
// front end authenticated by an API key (the dashboard's sessions, tied to a key id) runs every
// check of the API instead of a copy of them.
//
// The caller is responsible for key being the current record of a valid key: one that exists,
// is not revoked and is not past its expiry (store.Store.ActiveAPIKey checks exactly that), as
// the key is not checked again here. GET /health is served as by ServeHTTP.
func (h *Handler) ServeAuthenticated(w http.ResponseWriter, r *http.Request, key store.APIKey) {
	h.serve(w, r, &key)
}

// serve serves r on behalf of key, or of the key r's x-api-key names when key is nil.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, key *store.APIKey) {
	path := strings.TrimPrefix(r.URL.Path, "/")
	if path == "health" {
		h.health(w, r)
		return
	}
	if key == nil {
		k, ok := h.authenticate(w, r)
		if !ok {
			return
		}
		key = &k
	}
	if h.opt.OnAuthenticated != nil {
		h.opt.OnAuthenticated(r, *key)
	}
	if !h.allow(w, r, *key) {
		return
	}
	segs := strings.Split(path, "/")
	for _, rt := range routes {
		params, ok := match(rt.pattern, segs)
		if !ok {
			continue
		}
		fn := rt.methods[r.Method]
		if fn == nil {
			allowed := make([]string, 0, len(rt.methods))
			for m := range rt.methods {
				allowed = append(allowed, m)
			}
			slices.Sort(allowed) // one answer for one route (map order varies)
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
			return
		}
		fn(h, &request{w: w, r: r, orgID: key.OrgID, key: *key, params: params})
		return
	}
	httpx.WriteError(w, http.StatusNotFound, httpx.MsgNotFound)
}

func (h *Handler) health(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := h.opt.Health(ctx); err != nil {
		httpx.WriteError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// authenticate checks r's x-api-key header and answers the failures.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request) (store.APIKey, bool) {
	raw := strings.TrimSpace(r.Header.Get("X-Api-Key"))
	if raw == "" {
		httpx.WriteError(w, http.StatusUnauthorized, MsgKeyRequired)
		return store.APIKey{}, false
	}
	addr := httpx.ClientAddr(r)
	if g := h.opt.AuthGuard; g != nil {
		if retry, ok := g.Check(addr); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
			httpx.WriteError(w, http.StatusTooManyRequests, httpx.MsgRateLimited)
			return store.APIKey{}, false
		}
	}
	key, err := h.opt.Store.AuthenticateAPIKey(r.Context(), raw)
	switch {
	case errors.Is(err, store.ErrInvalidAPIKey):
		h.authFailed(addr)
		httpx.WriteError(w, http.StatusUnauthorized, MsgKeyInvalid)
		return key, false
	case errors.Is(err, store.ErrAPIKeyExpired):
		h.authFailed(addr)
		httpx.WriteError(w, http.StatusUnauthorized, MsgKeyExpired)
		return key, false
	case err != nil:
		h.serverError(w, r, err)
		return key, false
	}
	return key, true
}

func (h *Handler) authFailed(addr string) {
	if h.opt.AuthGuard != nil {
		h.opt.AuthGuard.Fail(addr)
	}
}

// LimitKey names an API key's bucket in the management rate limiter. The dashboard charges its
// page reads to the same bucket, so a key's API calls and page loads share one budget.
func LimitKey(keyID uuid.UUID) string { return "mgmt:" + keyID.String() }

// allow applies the per-key rate limit. A limiter failure lets the request through (logged):
// the management API is not worth an outage when the limiter's store is down.
func (h *Handler) allow(w http.ResponseWriter, r *http.Request, key store.APIKey) bool {
	if h.opt.Limiter == nil {
		return true
	}
	d, err := h.opt.Limiter.Allow(r.Context(), LimitKey(key.ID))
	if err != nil {
		h.logger.Warn("management rate limiter unavailable; request allowed", zap.Error(err))
		return true
	}
	d.SetHeaders(w.Header())
	if !d.Allowed {
		httpx.WriteError(w, http.StatusTooManyRequests, httpx.MsgRateLimited)
		return false
	}
	return true
}

// serverError answers a failure that is not the client's: 503 when Postgres cannot be reached
// (the client may retry), else 500. The error is logged; it never holds secrets.
func (h *Handler) serverError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away
	}
	if unavailable(err) {
		h.logger.Warn("database unavailable", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
		w.Header().Set("Retry-After", "5")
		httpx.WriteError(w, http.StatusServiceUnavailable, httpx.MsgUnavailable)
		return
	}
	h.logger.Error("management request failed", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
	httpx.WriteError(w, http.StatusInternalServerError, httpx.MsgInternal)
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

func (h *Handler) connectBase(r *http.Request) string {
	if h.opt.ConnectBase != "" {
		return h.opt.ConnectBase
	}
	return httpx.Origin(r)
}

// clientError writes an apiError.
func clientError(w http.ResponseWriter, e *apiError) { httpx.WriteError(w, e.status, e.msg) }

func (h *Handler) listChannels(q *request) {
	cs, err := h.opt.Store.ListChannels(q.r.Context(), q.orgID)
	if err != nil {
		h.serverError(q.w, q.r, err)
		return
	}
	base := h.connectBase(q.r)
	out := make([]Channel, len(cs))
	for i, c := range cs {
		out[i] = NewChannel(c, base)
	}
	httpx.WriteJSON(q.w, http.StatusOK, out)
}

func (h *Handler) createChannel(q *request) {
	obj, e := readObject(q.w, q.r)
	if e != nil {
		clientError(q.w, e)
		return
	}
	in, e := parseChannelInput(obj)
	if e != nil {
		clientError(q.w, e)
		return
	}
	c, err := h.opt.Store.CreateChannel(q.r.Context(), q.orgID, in.name, h.opt.ConnectLinkTTL)
	if err != nil {
		h.serverError(q.w, q.r, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusCreated, NewChannel(c, h.connectBase(q.r)))
}

// channelID parses params[i] as a channel id; a malformed id is an unknown channel.
func (q *request) id(i int, notFound string) (uuid.UUID, bool) {
	id, ok := parseID(q.params[i])
	if !ok {
		httpx.WriteError(q.w, http.StatusNotFound, notFound)
	}
	return id, ok
}

func (h *Handler) getChannel(q *request) {
	id, ok := q.id(0, MsgChannelNotFound)
	if !ok {
		return
	}
	c, err := h.opt.Store.GetChannel(q.r.Context(), q.orgID, id)
	if err != nil {
		h.storeError(q, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusOK, NewChannel(c, h.connectBase(q.r)))
}

func (h *Handler) deleteChannel(q *request) {
	id, ok := q.id(0, MsgChannelNotFound)
	if !ok {
		return
	}
	force := false
	if v := q.r.URL.Query().Get("force"); v != "" {
		var err error
		if force, err = strconv.ParseBool(v); err != nil {
			clientError(q.w, errForceBoolean)
			return
		}
	}
	deleted, err := h.opt.Store.DeleteChannel(q.r.Context(), q.orgID, id, force)
	if err != nil {
		h.storeError(q, err)
		return
	}
	if h.opt.AfterChannelDeleted != nil && deleted.WabaID != "" {
		go func() {
			defer func() {
				if v := recover(); v != nil {
					h.logger.Error("after-delete hook panicked", zap.Any("panic", v))
				}
			}()
			h.opt.AfterChannelDeleted(deleted)
		}()
	}
	q.w.WriteHeader(http.StatusNoContent)
}

// reconnectChannel reopens the connect link of a channel whose link expired or whose upstream
// token died.
func (h *Handler) reconnectChannel(q *request) {
	id, ok := q.id(0, MsgChannelNotFound)
	if !ok {
		return
	}
	orgID := q.orgID
	c, err := h.opt.Store.ReopenLink(q.r.Context(), &orgID, id, h.opt.ConnectLinkTTL, false)
	switch {
	case errors.Is(err, store.ErrOperatorDeactivated):
		httpx.WriteError(q.w, http.StatusConflict, MsgOperatorDeactivated)
	case errors.Is(err, store.ErrNotReconnectable):
		httpx.WriteError(q.w, http.StatusConflict, MsgNotReconnectable)
	case err != nil:
		h.storeError(q, err)
	default:
		httpx.WriteJSON(q.w, http.StatusOK, NewChannel(c, h.connectBase(q.r)))
	}
}

func (h *Handler) listWebhooks(q *request) {
	ws, err := h.opt.Store.ListWebhooks(q.r.Context(), q.orgID)
	if err != nil {
		h.serverError(q.w, q.r, err)
		return
	}
	out := make([]Webhook, len(ws))
	for i, wh := range ws {
		out[i] = NewWebhook(wh)
	}
	httpx.WriteJSON(q.w, http.StatusOK, out)
}

func (h *Handler) createWebhook(q *request) {
	obj, e := readObject(q.w, q.r)
	if e != nil {
		clientError(q.w, e)
		return
	}
	in, e := parseWebhookInput(obj)
	if e != nil {
		clientError(q.w, e)
		return
	}
	in.MaxPerOrg = h.opt.MaxWebhooksPerOrg
	wh, secret, err := h.opt.Store.CreateWebhook(q.r.Context(), q.orgID, in)
	if err != nil {
		h.storeError(q, err)
		return
	}
	out := NewWebhook(wh)
	out.HMACSecret = secret
	httpx.WriteJSON(q.w, http.StatusCreated, out)
}

func (h *Handler) getWebhook(q *request) {
	id, ok := q.id(0, MsgWebhookNotFound)
	if !ok {
		return
	}
	wh, err := h.opt.Store.GetWebhook(q.r.Context(), q.orgID, id)
	if err != nil {
		h.storeError(q, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusOK, NewWebhook(wh))
}

func (h *Handler) patchWebhook(q *request) {
	id, ok := q.id(0, MsgWebhookNotFound)
	if !ok {
		return
	}
	obj, e := readObject(q.w, q.r)
	if e != nil {
		clientError(q.w, e)
		return
	}
	status, e := parseStatus(obj)
	if e != nil {
		clientError(q.w, e)
		return
	}
	wh, err := h.opt.Store.SetWebhookStatus(q.r.Context(), q.orgID, id, status)
	if err != nil {
		h.storeError(q, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusOK, NewWebhook(wh))
}

func (h *Handler) deleteWebhook(q *request) {
	id, ok := q.id(0, MsgWebhookNotFound)
	if !ok {
		return
	}
	if err := h.opt.Store.DeleteWebhook(q.r.Context(), q.orgID, id); err != nil {
		h.storeError(q, err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

// assignmentIDs parses the webhook and channel ids of an assignment path; the webhook is
// checked first.
func (q *request) assignmentIDs() (wid, cid uuid.UUID, ok bool) {
	if wid, ok = q.id(0, MsgWebhookNotFound); !ok {
		return
	}
	cid, ok = q.id(1, MsgChannelNotFound)
	return
}

func (h *Handler) assignChannel(q *request) {
	wid, cid, ok := q.assignmentIDs()
	if !ok {
		return
	}
	if err := h.opt.Store.AssignChannel(q.r.Context(), q.orgID, wid, cid); err != nil {
		h.storeError(q, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusOK, Assignment{WebhookConfigID: wid, ChannelID: cid})
}

func (h *Handler) unassignChannel(q *request) {
	wid, cid, ok := q.assignmentIDs()
	if !ok {
		return
	}
	if err := h.opt.Store.UnassignChannel(q.r.Context(), q.orgID, wid, cid); err != nil {
		h.storeError(q, err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

// storeError maps the store's errors to responses.
func (h *Handler) storeError(q *request, err error) {
	switch {
	case errors.Is(err, store.ErrChannelNotFound):
		httpx.WriteError(q.w, http.StatusNotFound, MsgChannelNotFound)
	case errors.Is(err, store.ErrWebhookNotFound):
		httpx.WriteError(q.w, http.StatusNotFound, MsgWebhookNotFound)
	case errors.Is(err, store.ErrAPIKeyNotFound):
		httpx.WriteError(q.w, http.StatusNotFound, MsgAPIKeyNotFound)
	case errors.Is(err, store.ErrChannelActive):
		httpx.WriteError(q.w, http.StatusConflict, MsgChannelActive)
	case errors.Is(err, store.ErrDeliveryNotFound):
		httpx.WriteError(q.w, http.StatusNotFound, MsgDeliveryNotFound)
	case errors.Is(err, store.ErrDeliveryNotFailed):
		httpx.WriteError(q.w, http.StatusConflict, MsgDeliveryNotFailed)
	case errors.Is(err, store.ErrChannelsNotInOrg):
		clientError(q.w, errChannelsOrg)
	case errors.Is(err, store.ErrWebhookLimit):
		clientError(q.w, unprocessable(MsgWebhookLimit, h.opt.MaxWebhooksPerOrg))
	case errors.Is(err, store.ErrAPIKeyLimit):
		clientError(q.w, unprocessable(MsgAPIKeyLimit, h.opt.MaxAPIKeysPerOrg))
	default:
		h.serverError(q.w, q.r, err)
	}
}
