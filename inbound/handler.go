package inbound

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/traces"
)

// MaxBody is the largest webhook body accepted (413 beyond): the upstream batches up to 3 MB.
const MaxBody = 3<<20 + 64<<10

// maxHandOff is how many deliveries per item a post reserves hand-off slots for (HandOff.Reserve
// never gives more than the free workers); more matching webhooks than that queue the rest. 8
// covers the usual fan-out: at 2, an event for 5 webhooks queued 3 of them, which also stopped
// the hand-off until a claim caught up ([figures]).
//
// [figures]: https://github.com/wabarelay/wabarelay/blob/main/bench/README.md#figures-behind-the-defaults-inbound-delivery
const maxHandOff = 8

// defaultMaxWait is Config.MaxWait's default (stated there).
const defaultMaxWait = 500 * time.Millisecond

// Store is what the Handler needs of the data layer; *store.Store implements it.
type Store interface {
	// StoreEvents stores the items as events with their deliveries in one transaction,
	// inserting up to claim.Max of them already claimed (see store.Claim).
	StoreEvents(ctx context.Context, items []store.IncomingItem, claim store.Claim) (store.InboundResult, error)
	// DeactivateByWaba marks the channels of a business account inactive for reason
	// (store.ReasonAccountBanned, store.ReasonAccountDeleted).
	DeactivateByWaba(ctx context.Context, wabaID, reason string) (int, error)
	// DeactivateByDisplayNumber marks the channel of a business account with that display
	// number inactive.
	DeactivateByDisplayNumber(ctx context.Context, wabaID, phoneNumber string) (bool, error)
	// PromptHealth asks for a read of the health of the business account's channels after an
	// account webhook (IsHealthField), coalesced with the others of the next moments.
	PromptHealth(ctx context.Context, wabaID, field string, value json.RawMessage) (int, error)
}

// HandOff is the direct hand-off of new deliveries to the dispatcher of this instance
// (*dispatcher.Dispatcher implements it): the deliveries a post creates for webhooks with free
// slots are inserted already claimed for this instance and started after the commit, without a
// claim query or a wake-up round trip. The protocol, for every post that stores events:
//
//  1. n := Reserve(want) takes up to want free worker slots (0 while the dispatcher is not
//     running, or when it has no free worker to spare);
//  2. the post stores its events with store.Claim{Instance: InstanceID(), Lease: Lease(),
//     Max: n}, which inserts at most n deliveries claimed (only for unordered webhooks with no
//     due first attempt waiting in the queue, so that a new event never overtakes an older due
//     first attempt; it may overtake due retries, which are out of order by nature);
//  3. Deliver(n, claimed, queued) follows every Reserve(n) exactly once, whatever happened to
//     the transaction (failed: no jobs): it starts the claimed deliveries on the reserved slots
//     (those over a per-webhook or per-org cap may wait in its memory, still claimed, bounded,
//     or go back to the queue) and frees the rest; queued reports that the post also queued due
//     deliveries, for which the dispatcher claims again.
//
// Reserved slots idle until Deliver, so a dispatcher may refuse reservations under a backlog.
type HandOff interface {
	// InstanceID is the claim owner written to the deliveries handed off.
	InstanceID() string
	// Lease is how long a handed-off delivery stays claimed.
	Lease() time.Duration
	// Reserve takes up to n free worker slots and returns how many it took.
	Reserve(n int) int
	// Deliver starts jobs (at most reserved) on the slots taken by Reserve(reserved) and
	// frees the others; queued reports due deliveries left in the queue.
	Deliver(reserved int, jobs []store.ClaimedDelivery, queued bool)
}

// Observer is told what the Handler did, for metrics. Its methods must be safe for concurrent
// use and must not block.
type Observer interface {
	// Rejected: a post refused for a bad or missing signature (401).
	Rejected()
	// Malformed: a signed post that is not a WhatsApp payload (answered 200, dropped).
	Malformed()
	// Overflow: a post stored outside the concurrency limit after waiting Config.MaxWait.
	Overflow()
	// Stored: a post stored; res counts its new events by type, duplicates and items for
	// unknown numbers (and, reported apart, health changes of business accounts no channel has).
	Stored(res store.InboundResult)
}

// Config configures a Handler.
type Config struct {
	// AppSecret is the upstream app's secret: a POST must carry its X-Hub-Signature-256 over the
	// body (401 otherwise). Empty: every POST is refused.
	AppSecret string
	// VerifyToken answers the upstream's verification GET. Empty: every verification is
	// refused (403).
	VerifyToken string
	// Store stores the events and applies the account changes. Required.
	Store Store
	// HandOff returns the dispatcher to hand new deliveries to, or nil for none: every delivery
	// is then left pending and announced (NOTIFY) to the dispatchers of every instance. It is
	// called for each post (the dispatcher may start after the Handler is made). Nil: no
	// hand-off.
	HandOff func() HandOff
	// Invalidate, if set, is called for each channel handed new objects (media ids) by a post,
	// before any of its events is delivered: the caller's relay reloads that channel's scope.
	// Other instances learn of the change through its notification.
	Invalidate func(channelID uuid.UUID)
	// Concurrency is how many posts store their events at once; the others wait their turn (see
	// the package documentation). wabarelay_inbound gives half its database connections, at
	// least one. Default (0 or less): 1.
	Concurrency int
	// MaxWait is the longest a post waits for its turn (Concurrency) before it is stored anyway,
	// counted by Observer.Overflow, so that the upstream is always answered within its timeout.
	// Default (0 or less): 500ms.
	MaxWait time.Duration
	// Observer, if set, is told about posts refused, dropped, overflowing and stored.
	Observer Observer
	// Logger logs what the operator should know: posts dropped, storing failures, account
	// changes. Default (nil): nothing is logged.
	Logger *zap.Logger
	// Traces, if set, remembers the TracerProvider of traced posts (Caddy's `tracing`
	// directive) for the dispatcher's spans. A traced post stores its events in a
	// "wabarelay.inbound.store" span, whose traceparent its events keep; that happens whether
	// or not Traces is set. Default (nil): nothing remembered.
	Traces *traces.Provider
}

// Handler is the endpoint of the upstream's webhooks (an http.Handler): GET answers the
// verification, POST verifies, parses, stores and hands off. It is safe for concurrent use.
type Handler struct {
	cfg   Config
	slots chan struct{} // a post holds one while it stores (Config.Concurrency), without group
	group *grouper      // group commit, when the Store is a GroupStore
}

// New returns a Handler for cfg, its defaults filled in (see the fields of Config).
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("inbound: a store is required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = defaultMaxWait
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	h := &Handler{cfg: cfg, slots: make(chan struct{}, cfg.Concurrency)}
	if gs, ok := cfg.Store.(GroupStore); ok {
		h.group = &grouper{st: gs, limit: cfg.Concurrency}
	}
	return h, nil
}

// ServeHTTP answers GET (verification), POST (a batch) and refuses other methods (405).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		challenge, ok := Verify(q.Get("hub.mode"), q.Get("hub.verify_token"), q.Get("hub.challenge"), h.cfg.VerifyToken)
		if !ok {
			httpx.WriteError(w, http.StatusForbidden, "Verification failed")
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(challenge))
	case http.MethodPost:
		h.receive(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
	}
}

// receive answers a POST: 200 only once its events are stored (or when it holds nothing to
// store), 503 with Retry-After when they could not be, so that the upstream sends it again.
func (h *Handler) receive(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
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
	if !VerifySignature(h.cfg.AppSecret, body, r.Header.Get(SignatureHeader)) {
		h.cfg.Observer.Rejected()
		httpx.WriteError(w, http.StatusUnauthorized, "Invalid signature")
		return
	}
	batch, err := Parse(body)
	if err != nil {
		// Signed by the upstream but not a WhatsApp payload at all: nothing to store, and a
		// refusal would only make the upstream retry it for days.
		h.cfg.Observer.Malformed()
		h.cfg.Logger.Warn("inbound: signed post is not a WhatsApp payload; answered 200 and dropped", zap.Int("bytes", len(body)))
		httpx.WriteJSON(w, http.StatusOK, map[string]int{"events": 0, "duplicates": 0})
		return
	}
	res, ok, err := h.store(r.Context(), batch.Items)
	if !ok {
		httpx.WriteError(w, http.StatusServiceUnavailable, "Service unavailable")
		return
	}
	if err != nil {
		h.cfg.Logger.Warn("inbound: storing events failed; the upstream will retry", zap.Error(err))
		unavailable(w)
		return
	}
	h.cfg.Observer.Stored(res)
	if res.Unknown > 0 {
		h.cfg.Logger.Warn("inbound: items for unknown phone numbers dropped", zap.Int("count", res.Unknown))
	}
	if res.SkippedObjectIDs > 0 {
		h.cfg.Logger.Warn("inbound: media ids not text or too long for the relay scope not recorded; events stored",
			zap.Int("count", res.SkippedObjectIDs), zap.Int("max_bytes", store.MaxObjectIDLen))
	}
	if err := h.accountChanges(r.Context(), batch.Accounts); err != nil {
		h.cfg.Logger.Warn("inbound: account change not applied; the upstream will retry", zap.Error(err))
		unavailable(w)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]int{"events": res.Events, "duplicates": res.Duplicates})
}

// unavailable answers 503 with Retry-After: the upstream sends the post again.
func unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "5")
	httpx.WriteError(w, http.StatusServiceUnavailable, httpx.MsgUnavailable)
}

// storeSpan is the span of a traced post's storing.
const storeSpan = "wabarelay.inbound.store"

// store stores items when their turn comes (grouped with other posts' when the Store is a
// GroupStore), handing what it can to the dispatcher (HandOff), and has the relay reload the
// scope of channels handed new objects; ok is false when ctx ended while the post waited for
// its turn (nothing stored). In a traced request (Caddy's `tracing`) it
// runs in a child span of the request's, and every item keeps that span's traceparent (the
// request's own when it is not sampled), which the items' delivery attempts continue.
func (h *Handler) store(ctx context.Context, items []store.IncomingItem) (res store.InboundResult, ok bool, err error) {
	ctx, span := traces.Child(ctx, storeSpan)
	if span != nil {
		h.cfg.Traces.Remember(span)
		defer func() {
			span.SetAttributes(attribute.Int("wabarelay.events", res.Events), attribute.Int("wabarelay.duplicates", res.Duplicates),
				attribute.Int("wabarelay.deliveries", res.Deliveries))
			if err != nil {
				span.SetStatus(codes.Error, "storing events failed")
			}
			span.End()
		}()
	}
	if tp := traces.Format(trace.SpanContextFromContext(ctx)); tp != "" {
		for i := range items {
			items[i].Traceparent = tp
		}
	}
	var disp HandOff
	if h.cfg.HandOff != nil {
		disp = h.cfg.HandOff()
	}
	if h.group != nil {
		return h.storeGrouped(ctx, items, disp)
	}
	release, ok := h.turn(ctx)
	if !ok {
		return res, false, nil
	}
	defer release()
	// Without a dispatcher the zero Claim leaves every delivery pending, and StoreEvents
	// announces them to the dispatchers of other instances.
	var claim store.Claim
	if disp != nil {
		claim = store.Claim{Instance: disp.InstanceID(), Lease: disp.Lease(), Max: disp.Reserve(maxHandOff * len(items))}
	}
	res, err = h.cfg.Store.StoreEvents(ctx, items, claim)
	if h.cfg.Invalidate != nil {
		for _, id := range res.ObjectChannels {
			h.cfg.Invalidate(id)
		}
	}
	if disp != nil {
		disp.Deliver(claim.Max, res.Claimed, res.Queued > 0)
	}
	return res, true, err
}

// turn waits for a slot (Config.Concurrency), at most Config.MaxWait, and returns the function
// that frees it; past MaxWait the post goes ahead without one (Observer.Overflow). ok is false
// when ctx ended first (the caller gave up).
func (h *Handler) turn(ctx context.Context) (release func(), ok bool) {
	free := func() { <-h.slots }
	select {
	case h.slots <- struct{}{}: // a slot is free: no timer
		return free, true
	default:
	}
	wait := time.NewTimer(h.cfg.MaxWait)
	defer wait.Stop()
	select {
	case h.slots <- struct{}{}:
		return free, true
	case <-wait.C:
		h.cfg.Observer.Overflow()
		return func() {}, true
	case <-ctx.Done():
		return nil, false
	}
}

// accountChanges applies the account-level changes that matter for channel state: a business
// account banned or deleted upstream makes its channels inactive, and so does a number removed
// upstream its channel; the four account webhooks of IsHealthField ask for a read of the
// account's channels' health.
func (h *Handler) accountChanges(ctx context.Context, changes []AccountChange) error {
	unknown := 0
	defer func() {
		if unknown > 0 { // counted as the items for numbers no channel has are
			h.cfg.Observer.Stored(store.InboundResult{Unknown: unknown})
		}
	}()
	for _, c := range changes {
		if IsHealthField(c.Field) {
			// the numbers' health is read again (package health); no channel: nothing to do
			n, err := h.cfg.Store.PromptHealth(ctx, c.WabaID, c.Field, c.Value)
			if err != nil {
				return err
			}
			if n == 0 {
				unknown++
			}
		}
		switch c.Event {
		case "DISABLED_UPDATE":
			// Only DISABLE disables the account; SCHEDULE_FOR_DISABLE is a warning ahead of it
			// and REINSTATE lifts it (Meta's account_update reference, ban_info.waba_ban_state).
			if c.BanState != BanDisable {
				h.cfg.Logger.Warn("inbound: business account ban state changed; channels left as they are",
					zap.String("waba_id", c.WabaID), zap.String("ban_state", c.BanState))
				continue
			}
			fallthrough
		case "ACCOUNT_BANNED", "ACCOUNT_DELETED":
			reason := store.ReasonAccountBanned
			if c.Event == "ACCOUNT_DELETED" {
				reason = store.ReasonAccountDeleted
			}
			n, err := h.cfg.Store.DeactivateByWaba(ctx, c.WabaID, reason)
			if err != nil {
				return err
			}
			h.cfg.Logger.Warn("inbound: business account removed upstream; channels deactivated",
				zap.String("waba_id", c.WabaID), zap.String("event", c.Event), zap.Int("channels", n))
		case "PHONE_NUMBER_REMOVED":
			changed, err := h.cfg.Store.DeactivateByDisplayNumber(ctx, c.WabaID, c.PhoneNumber)
			if err != nil {
				return err
			}
			h.cfg.Logger.Warn("inbound: phone number removed upstream",
				zap.String("waba_id", c.WabaID), zap.Bool("channel_deactivated", changed))
		}
	}
	return nil
}

type noObserver struct{}

func (noObserver) Rejected()                  {}
func (noObserver) Malformed()                 {}
func (noObserver) Overflow()                  {}
func (noObserver) Stored(store.InboundResult) {}

// Interface guards.
var (
	_ http.Handler = (*Handler)(nil)
	_ Store        = (*store.Store)(nil)
)
