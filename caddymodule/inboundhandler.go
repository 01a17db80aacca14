package caddymodule

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/store"
)

func init() {
	caddy.RegisterModule(new(InboundHandler))
	httpcaddyfile.RegisterHandlerDirective("wabarelay_inbound", parseInboundHandler)
	httpcaddyfile.RegisterDirectiveOrder("wabarelay_inbound", httpcaddyfile.Before, "reverse_proxy")
}

// maxInboundBody is the largest webhook body accepted: the upstream batches up to 3 MB.
const maxInboundBody = 3<<20 + 64<<10

// InboundHandler receives the upstream's webhooks (the callback URL given to the upstream app,
// e.g. `handle /webhooks/upstream { wabarelay_inbound }`). GET answers the verification with
// `meta.verify_token`; POST verifies X-Hub-Signature-256 with `meta.app_secret`, splits the
// batch into one event per message and status, and stores the events with their deliveries in
// one transaction before answering 200. It answers 503 (so the upstream retries) when the
// events could not be stored, and never 200 for anything it did not store.
type InboundHandler struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (*InboundHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.wabarelay_inbound", New: func() caddy.Module { return new(InboundHandler) }}
}

// Provision sets up the handler.
func (h *InboundHandler) Provision(ctx caddy.Context) (err error) {
	h.app, err = appFrom(ctx)
	return err
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *InboundHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		challenge, ok := inbound.Verify(q.Get("hub.mode"), q.Get("hub.verify_token"), q.Get("hub.challenge"), h.app.meta.VerifyToken)
		if !ok {
			httpx.WriteError(w, http.StatusForbidden, "Verification failed")
			return nil
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(challenge))
	case http.MethodPost:
		h.receive(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
	}
	return nil
}

// maxHandOff is how many deliveries per item an intake reserves dispatcher slots for (see
// dispatcher.Reserve; never more than the free workers); more matching webhooks than that queue
// the rest. 8 covers the usual fan-out: at 2, an event for 5 webhooks queued 3 of them, which
// also stopped the hand-off until a claim caught up (bench/events -webhooks 5 -rate 1000:
// 4,678 deliveries/s and a growing backlog at 2, 4,998/s and none at 8).
const maxHandOff = 8

func (h *InboundHandler) receive(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInboundBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			httpx.WriteError(w, http.StatusRequestEntityTooLarge, "Request body too large")
		case errors.Is(err, os.ErrDeadlineExceeded):
			// the server's read_body timeout: never a 200, the sender must send it again
			httpx.WriteError(w, http.StatusRequestTimeout, "Request body not received in time")
		default:
			httpx.WriteError(w, http.StatusBadRequest, "Request body could not be read")
		}
		return
	}
	if !inbound.VerifySignature(h.app.meta.AppSecret, body, r.Header.Get(inbound.SignatureHeader)) {
		h.app.metrics.inboundRejected.Inc()
		httpx.WriteError(w, http.StatusUnauthorized, "Invalid signature")
		return
	}
	batch, err := inbound.Parse(body)
	if err != nil {
		// Signed by the upstream but not a WhatsApp payload at all: nothing to store, and a
		// refusal would only make the upstream retry it for days.
		h.app.metrics.inboundMalformed.Inc()
		h.app.logger.Warn("inbound: signed post is not a WhatsApp payload; answered 200 and dropped", zap.Int("bytes", len(body)))
		httpx.WriteJSON(w, http.StatusOK, map[string]int{"events": 0, "duplicates": 0})
		return
	}
	items := make([]store.IncomingItem, len(batch.Items))
	for i, it := range batch.Items {
		items[i] = store.IncomingItem{Type: it.Kind, PhoneNumberID: it.PhoneNumberID, DedupeKey: it.DedupeKey, Data: it.Data,
			ObjectIDs: it.MediaIDs, Sent: it.Sent}
	}
	// At most intakeConcurrency intakes write at once; the others wait their turn, so that the
	// intake cannot take every database connection and the CPU from the dispatcher. A post that
	// has waited intakeMaxWait goes ahead anyway: the upstream is answered in time whatever the
	// load, and delivery gets what is left (see intakeConcurrency).
	release, ok := h.app.intakeTurn(r.Context())
	if !ok {
		httpx.WriteError(w, http.StatusServiceUnavailable, "Service unavailable")
		return
	}
	defer release()
	// Deliveries this instance can start at once are created already claimed and handed to its
	// dispatcher after the commit (no claim query, no wake-up round trip). An instance with no
	// dispatcher (delivery { workers 0 }) claims none: the zero Claim leaves every delivery
	// pending, and StoreEvents announces them (NOTIFY) to the dispatchers of other instances.
	disp := h.app.dispatcher
	var claim store.Claim
	if disp != nil {
		claim = store.Claim{Instance: disp.InstanceID(), Lease: disp.Lease(), Max: disp.Reserve(maxHandOff * len(items))}
	}
	res, err := h.app.store.StoreEvents(r.Context(), items, claim)
	// This instance's relay learns of media ids handed to a channel before any of these events
	// is delivered: its copy of the channel's scope is reloaded on next use. Other instances
	// reload on the change's notification.
	for _, id := range res.ObjectChannels {
		h.app.cache.Invalidate(id)
	}
	if disp != nil {
		disp.Deliver(claim.Max, res.Claimed, res.Queued > 0)
	}
	if err != nil {
		h.app.logger.Warn("inbound: storing events failed; the upstream will retry", zap.Error(err))
		w.Header().Set("Retry-After", "5")
		httpx.WriteError(w, http.StatusServiceUnavailable, httpx.MsgUnavailable)
		return
	}
	for typ, n := range res.ByType {
		h.app.metrics.inboundEvents.WithLabelValues(typ).Add(float64(n))
	}
	h.app.metrics.inboundDuplicates.Add(float64(res.Duplicates))
	if res.Unknown > 0 {
		h.app.metrics.inboundUnknown.Add(float64(res.Unknown))
		h.app.logger.Warn("inbound: items for unknown phone numbers dropped", zap.Int("count", res.Unknown))
	}
	if res.SkippedObjectIDs > 0 {
		h.app.logger.Warn("inbound: media ids not text or too long for the relay scope not recorded; events stored",
			zap.Int("count", res.SkippedObjectIDs), zap.Int("max_bytes", store.MaxObjectIDLen))
	}
	if err := h.accountChanges(r.Context(), batch.Accounts); err != nil {
		h.app.logger.Warn("inbound: account change not applied; the upstream will retry", zap.Error(err))
		w.Header().Set("Retry-After", "5")
		httpx.WriteError(w, http.StatusServiceUnavailable, httpx.MsgUnavailable)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]int{"events": res.Events, "duplicates": res.Duplicates})
}

// accountChanges applies the account-level changes that matter for channel state: a business
// account banned or deleted upstream makes its channels inactive.
func (h *InboundHandler) accountChanges(ctx context.Context, changes []inbound.AccountChange) error {
	for _, c := range changes {
		switch c.Event {
		case "DISABLED_UPDATE":
			// Only DISABLE disables the account; SCHEDULE_FOR_DISABLE is a warning ahead of it
			// and REINSTATE lifts it (Meta's account_update reference, ban_info.waba_ban_state).
			if c.BanState != inbound.BanDisable {
				h.app.logger.Warn("inbound: business account ban state changed; channels left as they are",
					zap.String("waba_id", c.WabaID), zap.String("ban_state", c.BanState))
				continue
			}
			fallthrough
		case "ACCOUNT_BANNED", "ACCOUNT_DELETED":
			n, err := h.app.store.DeactivateByWaba(ctx, c.WabaID)
			if err != nil {
				return err
			}
			h.app.logger.Warn("inbound: business account removed upstream; channels deactivated",
				zap.String("waba_id", c.WabaID), zap.String("event", c.Event), zap.Int("channels", n))
		case "PHONE_NUMBER_REMOVED":
			changed, err := h.app.store.DeactivateByDisplayNumber(ctx, c.WabaID, c.PhoneNumber)
			if err != nil {
				return err
			}
			h.app.logger.Warn("inbound: phone number removed upstream",
				zap.String("waba_id", c.WabaID), zap.Bool("channel_deactivated", changed))
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax: `wabarelay_inbound`.
func (h *InboundHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.ArgErr()
	}
	return nil
}

func parseInboundHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(InboundHandler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*InboundHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*InboundHandler)(nil)
	_ caddyfile.Unmarshaler       = (*InboundHandler)(nil)
)
