package relay

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/window"
)

// The customer-service window on the relay (DESIGN §5c, docs/relay.md "Customer-service
// window"): every send with a "to" is answered with the Wabarelay-Window header, and with
// window_guard enforce a free-form send to a closed window is answered locally with the
// upstream's own 131047 error. The window is decided from memory: [Windows] holds, per channel,
// the customers whose window is open, loaded once from Postgres and kept current by intake's
// notifications.

// WindowHeader is the header that tells a send's caller the recipient's window.
const WindowHeader = "Wabarelay-Window"

// WindowGuard is what the relay does with the customer-service window (wabarelay_proxy
// window_guard).
type WindowGuard string

// The window guard's modes.
const (
	// GuardAnnotate: every send with a "to" gets the Wabarelay-Window header; nothing is refused.
	GuardAnnotate WindowGuard = "annotate"
	// GuardEnforce: as annotate, and a send whose type is not "template" to a customer whose
	// window is closed is answered locally (400, code 131047), without an upstream call.
	GuardEnforce WindowGuard = "enforce"
	// GuardOff: no header, no look-up (the relay as before the window existed).
	GuardOff WindowGuard = "off"
)

// DefaultWindowGuard is the guard's mode when none is configured.
const DefaultWindowGuard = GuardAnnotate

// ParseWindowGuard returns the mode s names ("" is the default).
func ParseWindowGuard(s string) (WindowGuard, error) {
	switch g := WindowGuard(s); g {
	case "":
		return DefaultWindowGuard, nil
	case GuardAnnotate, GuardEnforce, GuardOff:
		return g, nil
	}
	return "", fmt.Errorf("window_guard must be annotate, enforce or off, not %q", s)
}

// CodeReengagement is the upstream's error code of a free-form send outside the window.
const CodeReengagement = 131047

// OutcomeWindowClosed is the outcome of a free-form send to a closed window that window_guard
// enforce answered itself (400, code 131047), without an upstream call.
const OutcomeWindowClosed Outcome = "window_closed"

// WindowLookup tells a customer's window on a channel from memory ([Windows]).
type WindowLookup interface {
	State(ctx context.Context, ch *store.RelayChannel, waID string) window.State
}

// sendWindow decides the window of a send's recipient from its body: the state for the header
// ("" when the body has no "to", or the relay keeps no windows) and whether window_guard
// enforce refuses the send (a type other than "template" to a closed window).
func (relay *Relay) sendWindow(r *http.Request, ch *store.RelayChannel, body []byte) (state window.State, refuse bool) {
	if relay.Windows == nil || relay.WindowGuard == GuardOff {
		return "", false
	}
	raw, ok := member(body, "to")
	if !ok {
		return "", false
	}
	state = window.Unknown
	if to, ok := stringValue(raw); ok {
		if wa, ok := window.NormalizeWAID(to); ok {
			state = relay.Windows.State(r.Context(), ch, wa)
		}
	}
	if state != window.Closed || relay.WindowGuard != GuardEnforce {
		return state, false
	}
	typ, _ := member(body, "type")
	return state, string(typ) != `"template"`
}

// reengagementDetails is the upstream's error_data.details of code 131047.
const reengagementDetails = "Message failed to send because more than 24 hours have passed since the customer last replied to this number."

// refuseReengagement answers a free-form send to a closed window as the upstream does (400,
// the WhatsApp error envelope of code 131047 with a fresh fbtrace_id), counts it and returns
// its status.
func (relay *Relay) refuseReengagement(w http.ResponseWriter) int {
	body := make([]byte, 0, 400)
	body = append(body, `{"error":{"message":"(#131047) Re-engagement message","type":"OAuthException","code":131047,"error_data":{"messaging_product":"whatsapp","details":`...)
	body = strconv.AppendQuote(body, reengagementDetails)
	body = append(body, `},"fbtrace_id":"`...)
	body = append(body, fbtraceID()...)
	body = append(body, `"}}`...)
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=UTF-8")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(body)
	relay.count(OutcomeWindowClosed)
	return http.StatusBadRequest
}

// fbtraceID returns a trace id shaped like the upstream's (23 characters of [A-Za-z0-9_-]).
func fbtraceID() []byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
	b := make([]byte, 23)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[b[i]&63]
	}
	return b
}

// Windows defaults.
const (
	// DefaultWindowsPerChannel bounds the open windows held per channel. A channel with more
	// customers who wrote in the last 24 hours keeps the newest; a customer left out is
	// "unknown" (never refused) until the set has room again (docs/relay.md).
	DefaultWindowsPerChannel = 50_000
	// windowsTTL is how long a channel's set is used before it is loaded again, in the
	// background (a backstop: changes arrive by notification; a reload also drops expired
	// windows from memory).
	windowsTTL = 10 * time.Minute
)

// WindowStore is what [Windows] loads ([store.Store]).
type WindowStore interface {
	WindowSnapshot(ctx context.Context, channel uuid.UUID, since time.Time, limit int) (store.WindowSnapshot, error)
}

// Windows keeps, per channel, the customers whose customer-service window is open, so that the
// relay decides a send's window without a query: a channel's set is loaded from Postgres on its
// first send (the contacts of the last 24 hours, at most DefaultWindowsPerChannel), kept current
// by intake's notifications ([Windows.Apply], on store.ContactsNotifyChannel, whichever instance
// stored the message), and ages by time (window.Decide at each look-up). A customer not in the
// set is closed or unknown by the channel's receiving time (store.RelayChannel.ReceivingSince,
// which the channel cache reloads on every change of the channel), as window.Decide says for one
// who never wrote. A listener that reconnects drops every set ([Windows.Flush]); a set is
// reloaded in the background every windowsTTL, and dropped then if its channel is gone.
// Channel changes leave the sets alone: a set holds only what intake announces, and a channel
// is announced changed for every media id it is handed (channel_objects), which must not
// reload its windows.
type Windows struct {
	store      WindowStore
	clock      clock.Clock
	perChannel int
	ttl        time.Duration
	logger     *zap.Logger

	mu    sync.RWMutex
	chans map[uuid.UUID]*windowSet
}

// windowSet is one channel's open windows.
type windowSet struct {
	ready chan struct{} // closed once loaded (or failed: err)
	err   error

	mu        sync.RWMutex
	last      map[string]time.Time // wa_id → newest incoming message, within the last 24 h when loaded (any age for a young channel: Windows.since)
	truncated bool                 // customers were left out: one not in last is unknown
	loadedAt  time.Time

	refreshing atomic.Bool
}

// NewWindows returns an empty set of windows over s, on clock c (nil: the real time).
func NewWindows(s WindowStore, c clock.Clock) *Windows {
	return &Windows{store: s, clock: c, perChannel: DefaultWindowsPerChannel, ttl: windowsTTL,
		logger: zap.NewNop(), chans: map[uuid.UUID]*windowSet{}}
}

// SetLogger sets where failed loads are logged.
func (ws *Windows) SetLogger(l *zap.Logger) { ws.logger = l }

// State returns the window of customer waID (digits) on channel ch at the clock's time: from
// memory, once the channel's set is loaded (the first call for a channel waits for its load, at
// most until ctx ends). A set that cannot be loaded answers unknown.
func (ws *Windows) State(ctx context.Context, ch *store.RelayChannel, waID string) window.State {
	now := clock.Now(ws.clock)
	since := ws.since(ch, now)
	set := ws.set(ctx, ch.ID, since)
	if set == nil {
		return window.Unknown
	}
	set.mu.RLock()
	last, ok := set.last[waID]
	truncated, loadedAt := set.truncated, set.loadedAt
	set.mu.RUnlock()
	if now.Sub(loadedAt) >= ws.ttl && set.refreshing.CompareAndSwap(false, true) {
		go ws.load(ch.ID, set, true, since) // the backstop: served from memory meanwhile
	}
	if !ok && truncated {
		return window.Unknown
	}
	state, _ := window.Decide(last, ch.ReceivingSince, now)
	return state
}

// since is the oldest incoming message a load of ch's set reads: the last 24 hours; every one
// (bounded) while the channel has been receiving for less than that, so that a customer whose
// window has expired is closed, as the API says, rather than unknown like one never heard from
// (window.Decide tells them apart only while the channel is that young).
func (ws *Windows) since(ch *store.RelayChannel, now time.Time) time.Time {
	since := now.Add(-window.Length)
	if ch.ReceivingSince.After(since) {
		return time.Time{}
	}
	return since
}

// set returns the channel's loaded set, loading it (messages from since on) first when needed;
// nil when it cannot be.
func (ws *Windows) set(ctx context.Context, channel uuid.UUID, since time.Time) *windowSet {
	ws.mu.RLock()
	set := ws.chans[channel]
	ws.mu.RUnlock()
	if set == nil {
		ws.mu.Lock()
		if set = ws.chans[channel]; set == nil {
			set = &windowSet{ready: make(chan struct{}), last: map[string]time.Time{}}
			ws.chans[channel] = set
			go ws.load(channel, set, false, since)
		}
		ws.mu.Unlock()
	}
	select {
	case <-set.ready:
	default:
		select {
		case <-set.ready:
		case <-ctx.Done():
			return nil
		}
	}
	if set.err != nil {
		return nil
	}
	return set
}

// load reads the channel's set from the store and merges it into set (first load: then marks it
// ready; refresh: replaces the windows that have expired). A first load that fails drops the set,
// so that a later send tries again.
func (ws *Windows) load(channel uuid.UUID, set *windowSet, refresh bool, since time.Time) {
	defer func() {
		if v := recover(); v != nil {
			ws.logger.Error("relay: loading a channel's windows panicked", zap.Any("panic", v))
			if !refresh {
				ws.fail(channel, set, fmt.Errorf("panic: %v", v))
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	now := clock.Now(ws.clock)
	snap, err := ws.store.WindowSnapshot(ctx, channel, since, ws.perChannel)
	if err != nil {
		if refresh && errors.Is(err, store.ErrChannelNotFound) {
			ws.drop(channel, set) // the channel is gone
			return
		}
		if refresh {
			set.refreshing.Store(false)
			ws.logger.Warn("relay: reloading a channel's windows failed", zap.Error(err))
			return
		}
		ws.logger.Warn("relay: loading a channel's windows failed; its sends are unknown until it loads", zap.Error(err))
		ws.fail(channel, set, err)
		return
	}
	set.mu.Lock()
	// Notifications that arrived meanwhile are in set.last: keep each newer one that is still open.
	cutoff := now.Add(-window.Length)
	for wa, at := range set.last {
		if cur, ok := snap.Open[wa]; ok {
			if at.After(cur) {
				snap.Open[wa] = at
			}
		} else if at.After(cutoff) {
			if len(snap.Open) >= ws.perChannel {
				snap.Truncated = true
				continue
			}
			snap.Open[wa] = at
		}
	}
	set.last, set.truncated, set.loadedAt = snap.Open, snap.Truncated, now
	set.mu.Unlock()
	if refresh {
		set.refreshing.Store(false)
	} else {
		close(set.ready)
	}
}

// fail ends a first load that failed: waiters get no set, and the channel's next send loads again.
func (ws *Windows) fail(channel uuid.UUID, set *windowSet, err error) {
	ws.drop(channel, set)
	set.err = err
	close(set.ready)
}

// drop removes the channel's set, if it is still set.
func (ws *Windows) drop(channel uuid.UUID, set *windowSet) {
	ws.mu.Lock()
	if ws.chans[channel] == set {
		delete(ws.chans, channel)
	}
	ws.mu.Unlock()
}

// Apply takes a store.ContactsNotifyChannel notification: each customer named opens (or
// extends) its window in the channel's set, if this instance holds it (one it does not hold
// reads the row when it loads).
func (ws *Windows) Apply(payload string) {
	for _, u := range store.ParseContactsNotification(payload) {
		ws.mu.RLock()
		set := ws.chans[u.ChannelID]
		ws.mu.RUnlock()
		if set != nil {
			set.add(u.WAID, u.LastInboundAt, ws.perChannel, clock.Now(ws.clock))
		}
	}
}

// add records a customer's newest incoming message in the set, within its bound: when the set
// is full, the windows that have expired are dropped first; if none has, the customer is left
// out and the set marked truncated.
func (set *windowSet) add(waID string, at time.Time, limit int, now time.Time) {
	set.mu.Lock()
	defer set.mu.Unlock()
	old, ok := set.last[waID]
	if ok {
		if at.After(old) {
			set.last[waID] = at
		}
		return
	}
	if len(set.last) >= limit {
		cutoff := now.Add(-window.Length)
		for wa, t := range set.last {
			if !t.After(cutoff) {
				delete(set.last, wa)
			}
		}
		if len(set.last) >= limit {
			set.truncated = true
			return
		}
	}
	set.last[waID] = at
}

// Invalidate drops the channel's set; its next send loads it again.
func (ws *Windows) Invalidate(channel uuid.UUID) {
	ws.mu.Lock()
	delete(ws.chans, channel)
	ws.mu.Unlock()
}

// Flush drops every channel's set (notifications may have been missed).
func (ws *Windows) Flush() {
	ws.mu.Lock()
	ws.chans = map[uuid.UUID]*windowSet{}
	ws.mu.Unlock()
}
