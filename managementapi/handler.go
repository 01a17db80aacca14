// Package managementapi serves wabarelay's management API: channels, webhook configs and their
// channel assignments, delivery logs and the org's API keys, authenticated by API key and rate
// limited per key. Service holds the operations, their checks and messages, and the reads of
// the dashboard's pages; Handler is the plain net/http front end over it (decode, call,
// encode) that the Caddy module wabarelay_api mounts; the dashboard and the CLI call the
// Service directly.
package managementapi

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/authguard"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/ratelimit"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/usage"
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

// Options configure a Service and its Handler.
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
	// OnReplayBacklog, if set, is called when a replay is refused because the webhook's queued
	// deliveries would exceed store.MaxReplayBacklog (a metric counts them).
	OnReplayBacklog func()
	// OnAuthenticated, if set, is called after a request's API key is accepted, e.g. to put
	// the key id into the access log.
	OnAuthenticated func(r *http.Request, key store.APIKey)
	// AuthGuard, if set, counts failed authentications per client address (httpx.ClientAddr)
	// and refuses an address that failed too often with 429 before any lookup, so a flood of
	// bad keys costs no queries. A key that authenticated is known to the guard (Guard.Valid)
	// and never refused by it, whatever its address did.
	AuthGuard *authguard.Guard
	// MaxWebhooksPerOrg is the most webhooks an org may have: creating one more is refused
	// with 422 (MsgWebhookLimit). 0 means DefaultMaxWebhooksPerOrg.
	MaxWebhooksPerOrg int
	// MaxAPIKeysPerOrg is the most live API keys (neither revoked nor expired) an org may
	// have: creating one more through the API is refused with 422 (MsgAPIKeyLimit). 0 means
	// DefaultMaxAPIKeysPerOrg.
	MaxAPIKeysPerOrg int
	// Retention is the event retention (the delivery option retention): a replay's window must
	// start within it. 0 means store.RetentionPolicy's default.
	Retention time.Duration
	// RateCard prices the usage's billable messages (GET /usage, the wabarelay option
	// rate_card). Nil means no costs: every cost is null.
	RateCard *usage.RateCard
	// RelayLimitPerMinute, if set, returns the relay's per-channel limit per minute: the most a
	// broadcast's rate_per_minute may be, and twice its default (callers keep the other half).
	// Nil, or a result of 0 (no relay handler), means DefaultRelayLimitPerMinute.
	RelayLimitPerMinute func() int
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

// Handler serves the management API over a Service. Paths are relative to {base_url}: the
// mount point must strip its prefix (Caddy's handle_path).
type Handler struct {
	svc *Service
	mux *http.ServeMux
}

// route is one operation of the interface: a net/http.ServeMux pattern's method and path (its
// wildcards named as in docs/openapi.yaml) and the handler serving it.
type route struct {
	method, path string
	serve        func(*Handler, *call)
}

// routes are the interface's operations. GET /health and GET /openapi.yaml are served before
// authentication, for every method (405 for the others); they are listed for Routes.
var routes = []route{
	{http.MethodGet, "/health", nil},
	{http.MethodGet, "/openapi.yaml", nil},
	{http.MethodGet, "/channels", (*Handler).listChannels},
	{http.MethodPost, "/channels", (*Handler).createChannel},
	{http.MethodGet, "/channels/{id}", (*Handler).getChannel},
	{http.MethodDelete, "/channels/{id}", (*Handler).deleteChannel},
	{http.MethodPost, "/channels/{id}/reconnect", (*Handler).reconnectChannel},
	{http.MethodGet, "/channels/{id}/messages", (*Handler).listMessages},
	{http.MethodGet, "/channels/{id}/contacts/{wa_id}", (*Handler).getContact},
	{http.MethodGet, "/messages/{wamid...}", (*Handler).getMessage}, // (a wamid may hold "/")
	{http.MethodGet, "/webhooks", (*Handler).listWebhooks},
	{http.MethodPost, "/webhooks", (*Handler).createWebhook},
	{http.MethodGet, "/webhooks/{id}", (*Handler).getWebhook},
	{http.MethodPatch, "/webhooks/{id}", (*Handler).patchWebhook},
	{http.MethodDelete, "/webhooks/{id}", (*Handler).deleteWebhook},
	{http.MethodPost, "/webhooks/{wid}/channels/{cid}", (*Handler).assignChannel},
	{http.MethodDelete, "/webhooks/{wid}/channels/{cid}", (*Handler).unassignChannel},
	{http.MethodGet, "/webhooks/{id}/deliveries", (*Handler).listDeliveries},
	{http.MethodPost, "/webhooks/{id}/deliveries/{did}/retry", (*Handler).retryDelivery},
	{http.MethodPost, "/webhooks/{id}/recover", (*Handler).recoverDeliveries},
	{http.MethodPost, "/webhooks/{id}/replay", (*Handler).replay},
	{http.MethodPost, "/webhooks/{id}/rotate_secret", (*Handler).rotateSecret},
	{http.MethodGet, "/api_keys", (*Handler).listAPIKeys},
	{http.MethodPost, "/api_keys", (*Handler).createAPIKey},
	{http.MethodDelete, "/api_keys/{id}", (*Handler).revokeAPIKey},
	{http.MethodGet, "/usage", (*Handler).usage},
	{http.MethodPost, "/channels/{id}/broadcasts", (*Handler).createBroadcast},
	{http.MethodGet, "/channels/{id}/broadcasts", (*Handler).listBroadcasts},
	{http.MethodGet, "/broadcasts/{id}", (*Handler).getBroadcast},
	{http.MethodGet, "/broadcasts/{id}/recipients", (*Handler).broadcastRecipients},
	{http.MethodPost, "/broadcasts/{id}/pause", (*Handler).pauseBroadcast},
	{http.MethodPost, "/broadcasts/{id}/resume", (*Handler).resumeBroadcast},
	{http.MethodPost, "/broadcasts/{id}/cancel", (*Handler).cancelBroadcast},
}

// Routes returns the pattern ("METHOD /path/{param}") of every operation the handler serves,
// for checking against the OpenAPI document.
func Routes() []string {
	out := make([]string, len(routes))
	for i, rt := range routes {
		out[i] = rt.method + " " + strings.ReplaceAll(rt.path, "...}", "}")
	}
	return out
}

// New returns a Handler over a new Service.
func New(opt Options) *Handler { return NewHandler(NewService(opt)) }

// NewHandler returns a Handler over svc, shared with the service's other front ends.
func NewHandler(svc *Service) *Handler {
	h := &Handler{svc: svc, mux: http.NewServeMux()}
	for _, rt := range routes {
		if serve := rt.serve; serve != nil {
			h.mux.HandleFunc(rt.method+" "+rt.path, func(w http.ResponseWriter, r *http.Request) {
				serve(h, &call{h: h, w: w, r: r, p: r.Context().Value(principalKey{}).(Principal)})
			})
		}
	}
	return h
}

// Service returns the handler's Service.
func (h *Handler) Service() *Service { return h.svc }

// call is one admitted API request.
type call struct {
	h *Handler
	w http.ResponseWriter
	r *http.Request
	p Principal
}

type principalKey struct{}

// ServeHTTP implements http.Handler: GET /health, else the x-api-key header is authenticated,
// the key admitted (Service.Admit) and the request routed to its operation.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, nil)
}

// headProbe is the method HEAD requests are routed as: no route has it, so they get the
// route's 405 (only GET /health serves HEAD), where a ServeMux would serve them with the GET
// route.
const headProbe = "HEAD (not served)"

// serve serves r on behalf of key, or of the key r's x-api-key names when key is nil. Requests
// are authenticated and charged to the rate limit before routing: a path or method the
// interface does not have is answered 404 or 405 only to an admitted key.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, key *store.APIKey) {
	rr := routed(r, strings.TrimPrefix(r.URL.Path, "/"))
	switch rr.URL.Path {
	case "/health":
		h.health(w, r)
		return
	case "/openapi.yaml":
		serveOpenAPI(w, r)
		return
	}
	if key == nil {
		k, ok := h.authenticate(w, r)
		if !ok {
			return
		}
		key = &k
	}
	if err := h.svc.Admit(r, *key, w.Header()); err != nil {
		h.fail(w, r, err)
		return
	}
	if r.Method == http.MethodHead {
		rr.Method = headProbe
	}
	if fallback, pattern := h.mux.Handler(rr); pattern == "" {
		unrouted(w, rr, fallback)
		return
	}
	rr.Method = r.Method
	p := Principal{Key: *key, Origin: httpx.Origin(r)}
	h.mux.ServeHTTP(w, rr.WithContext(context.WithValue(rr.Context(), principalKey{}, p)))
}

// routed returns a copy of r whose path, for the ServeMux, is path's segments (as split on "/"
// after decoding, so an encoded slash separates too) with each empty, "." or ".." segment
// replaced by "-". Such a segment then matches no fixed part of a pattern and, as a wildcard,
// names nothing (no id has that form), where a ServeMux would redirect to the cleaned path.
func routed(r *http.Request, path string) *http.Request {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if s == "" || s == "." || s == ".." {
			segs[i] = "-"
		}
	}
	rr := r.Clone(r.Context())
	rr.URL.Path, rr.URL.RawPath = "/"+strings.Join(segs, "/"), ""
	return rr
}

// unrouted answers a request no route serves with the JSON 404, or 405 with an Allow header
// (never listing HEAD), from what the ServeMux's own fallback handler would have answered.
func unrouted(w http.ResponseWriter, r *http.Request, fallback http.Handler) {
	probe := &headerProbe{header: http.Header{}}
	fallback.ServeHTTP(probe, r)
	if probe.status != http.StatusMethodNotAllowed {
		httpx.WriteError(w, http.StatusNotFound, httpx.MsgNotFound)
		return
	}
	allowed := slices.DeleteFunc(strings.Split(probe.header.Get("Allow"), ", "), func(m string) bool { return m == http.MethodHead })
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
}

// headerProbe records the status and headers a handler answers, dropping the body.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *headerProbe) WriteHeader(code int)        { p.status = code }

func (h *Handler) health(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := h.svc.opt.Health(ctx); err != nil {
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
	guard := h.svc.opt.AuthGuard
	if guard != nil {
		// A key known valid is let through whatever its address did (authguard.Guard.Admit).
		if retry, ok := guard.Admit(addr, raw); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
			httpx.WriteError(w, http.StatusTooManyRequests, httpx.MsgRateLimited)
			return store.APIKey{}, false
		}
	}
	key, err := h.svc.opt.Store.AuthenticateAPIKey(r.Context(), raw)
	if err == nil {
		if guard != nil {
			guard.Valid(raw)
		}
		return key, true
	}
	msg := MsgKeyInvalid
	switch {
	case errors.Is(err, store.ErrAPIKeyExpired):
		msg = MsgKeyExpired
	case !errors.Is(err, store.ErrInvalidAPIKey):
		h.fail(w, r, err)
		return key, false
	}
	if guard != nil {
		guard.Forget(raw)
		guard.Fail(addr)
	}
	httpx.WriteError(w, http.StatusUnauthorized, msg)
	return key, false
}

// fail answers an operation's error as Service.ErrorFor says (a 503 with Retry-After: 5);
// nothing when the client has gone away.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := h.svc.ErrorFor(r, err)
	if e == nil {
		return
	}
	if e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	httpx.WriteError(w, e.Status, e.Message)
}

// answer writes v with status, or the failure err.
func answer[T any](q *call, status int, v T, err error) {
	if err != nil {
		q.fail(err)
		return
	}
	httpx.WriteJSON(q.w, status, v)
}

// noContent answers 204, or the failure err.
func noContent(q *call, err error) {
	if err != nil {
		q.fail(err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

func (q *call) fail(err error) { q.h.fail(q.w, q.r, err) }

// body reads the request's JSON object of at most MaxBodyBytes; a refusal is answered and nil
// returned.
func (q *call) body() object { return q.bodyUpTo(MaxBodyBytes) }

// bodyUpTo is body for a route whose body may be longer than MaxBodyBytes: at most limit bytes.
func (q *call) bodyUpTo(limit int64) object {
	obj, e := readObjectMax(q.w, q.r, limit)
	if e != nil {
		q.fail(e)
	}
	return obj
}

func (q *call) ctx() context.Context { return q.r.Context() }

func (h *Handler) listChannels(q *call) {
	out, err := h.svc.ListChannels(q.ctx(), q.p)
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) createChannel(q *call) {
	if obj := q.body(); obj != nil {
		out, err := h.svc.createChannel(q.ctx(), q.p, obj)
		answer(q, http.StatusCreated, out, err)
	}
}

func (h *Handler) getChannel(q *call) {
	out, err := h.svc.GetChannel(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) deleteChannel(q *call) {
	force := false
	if v := q.r.URL.Query().Get("force"); v != "" {
		var err error
		if force, err = strconv.ParseBool(v); err != nil {
			if _, err := id(q.r.PathValue("id"), MsgChannelNotFound); err != nil {
				q.fail(err) // the path is checked before the query
				return
			}
			q.fail(errForceBoolean)
			return
		}
	}
	noContent(q, h.svc.DeleteChannel(q.ctx(), q.p, q.r.PathValue("id"), force))
}

func (h *Handler) reconnectChannel(q *call) {
	out, err := h.svc.ReconnectChannel(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) listWebhooks(q *call) {
	out, err := h.svc.ListWebhooks(q.ctx(), q.p)
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) createWebhook(q *call) {
	if obj := q.body(); obj != nil {
		out, err := h.svc.createWebhook(q.ctx(), q.p, obj)
		answer(q, http.StatusCreated, out, err)
	}
}

func (h *Handler) getWebhook(q *call) {
	out, err := h.svc.GetWebhook(q.ctx(), q.p, q.r.PathValue("id"))
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) patchWebhook(q *call) {
	if _, err := id(q.r.PathValue("id"), MsgWebhookNotFound); err != nil {
		q.fail(err) // the path is checked before the body
		return
	}
	if obj := q.body(); obj != nil {
		out, err := h.svc.setWebhookStatus(q.ctx(), q.p, q.r.PathValue("id"), obj)
		answer(q, http.StatusOK, out, err)
	}
}

func (h *Handler) deleteWebhook(q *call) {
	noContent(q, h.svc.DeleteWebhook(q.ctx(), q.p, q.r.PathValue("id")))
}

func (h *Handler) assignChannel(q *call) {
	out, err := h.svc.AssignChannel(q.ctx(), q.p, q.r.PathValue("wid"), q.r.PathValue("cid"))
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) unassignChannel(q *call) {
	noContent(q, h.svc.UnassignChannel(q.ctx(), q.p, q.r.PathValue("wid"), q.r.PathValue("cid")))
}

// listDeliveries answers a page of a webhook's deliveries; the next page is in a Link header
// (a relative reference carrying the cursor).
func (h *Handler) listDeliveries(q *call) {
	qs := q.r.URL.Query()
	out, next, err := h.svc.ListDeliveries(q.ctx(), q.p, q.r.PathValue("id"),
		DeliveryQuery{Status: qs.Get("status"), Limit: qs.Get("limit"), Cursor: qs.Get("cursor")})
	if next != nil {
		q.w.Header().Set("Link", `<?`+next.Encode()+`>; rel="next"`)
	}
	answer(q, http.StatusOK, out, err)
}

// retryDelivery re-queues a failed delivery with a fresh schedule.
func (h *Handler) retryDelivery(q *call) {
	err := h.svc.RetryDelivery(q.ctx(), q.p, q.r.PathValue("id"), q.r.PathValue("did"))
	did, _ := parseID(q.r.PathValue("did"))
	answer(q, http.StatusAccepted, map[string]string{"id": did.String(), "status": "pending"}, err)
}

// recoverDeliveries re-queues every failed delivery since a time.
func (h *Handler) recoverDeliveries(q *call) {
	if _, err := id(q.r.PathValue("id"), MsgWebhookNotFound); err != nil {
		q.fail(err) // the path is checked before the body
		return
	}
	if obj := q.body(); obj != nil {
		n, err := h.svc.recoverDeliveries(q.ctx(), q.p, q.r.PathValue("id"), obj)
		answer(q, http.StatusAccepted, map[string]int{"requeued": n}, err)
	}
}

func (h *Handler) listAPIKeys(q *call) {
	out, err := h.svc.ListAPIKeys(q.ctx(), q.p)
	answer(q, http.StatusOK, out, err)
}

func (h *Handler) createAPIKey(q *call) {
	if obj := q.body(); obj != nil {
		out, err := h.svc.createAPIKey(q.ctx(), q.p, obj)
		answer(q, http.StatusCreated, out, err)
	}
}

func (h *Handler) revokeAPIKey(q *call) {
	noContent(q, h.svc.RevokeAPIKey(q.ctx(), q.p, q.r.PathValue("id")))
}
