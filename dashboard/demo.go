package dashboard

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// Demo configures the dashboard's demo page, for a service running against the fake upstream
// (`make run` without a Meta app).
type Demo struct {
	// FakeUpstream is the fake upstream's base URL (scheme and host, e.g. http://127.0.0.1:8090):
	// the demo page asks its POST /_fake/inbound to send an incoming message to the service.
	FakeUpstream string
	// Receiver is the base URL of the fake's webhook receiver (HTTPS, as webhook URLs must be),
	// e.g. https://127.0.0.1:8091. The demo webhook of an org points at Receiver/<org id>; the
	// page reads what the receiver got (a GET of Receiver) and verifies each delivery's signature
	// with that webhook's secret, as a receiver following the guide would.
	Receiver string
	// Relay is the relay's base URL ({proxy_url}, e.g. http://localhost:8080/upstream-proxy):
	// "Send 10 demo messages" calls its POST /<phone_number_id>/messages with the channel's
	// token, as a customer's backend would. Empty leaves that button off.
	Relay string
	// Client calls the fake upstream, its receiver and the relay; it must trust the receiver's
	// certificate. Nil means http.DefaultClient.
	Client *http.Client
}

// received is one delivery the demo receiver got, checked.
type received struct {
	At       time.Time
	EventID  string
	Type     string
	Verified bool
	Reason   string
	Body     string
}

// receiverURL is the demo webhook's address for an org.
func (h *Handler) receiverURL(org uuid.UUID) string {
	return strings.TrimRight(h.opt.Demo.Receiver, "/") + "/" + org.String()
}

func (h *Handler) demoClient() *http.Client {
	if h.opt.Demo.Client != nil {
		return h.opt.Demo.Client
	}
	return http.DefaultClient
}

// receivedFor reads what the fake receiver got for the org's demo webhook, newest first, and
// verifies each delivery's X-Svc-Signature with the webhook's secret at the time it arrived.
func (h *Handler) receivedFor(ctx context.Context, org uuid.UUID, secrets []string) ([]received, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(h.opt.Demo.Receiver, "/")+"/", nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.demoClient().Do(req)
	if err != nil {
		return nil, errors.New("the demo receiver cannot be reached")
	}
	defer resp.Body.Close()
	// The receiver's list (internal/fakegraph.Receiver): the exact bytes of each body are in raw.
	var all []struct {
		ReceivedAt time.Time         `json:"received_at"`
		Path       string            `json:"path"`
		Headers    map[string]string `json:"headers"`
		Raw        []byte            `json:"raw"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&all); err != nil {
		return nil, errors.New("the demo receiver did not answer with its list")
	}
	path := "/" + org.String()
	var out []received
	for i := len(all) - 1; i >= 0; i-- {
		d := all[i]
		if d.Path != path {
			continue
		}
		it := received{At: d.ReceivedAt, EventID: d.Headers["Webhook-Id"], Body: string(d.Raw), Reason: "no demo webhook of this org"}
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(d.Raw, &ev)
		it.Type = ev.Type
		for _, secret := range secrets {
			if it.Reason = verifySignature(secret, d.Raw, d.Headers["X-Svc-Signature"], d.ReceivedAt); it.Reason == "" {
				it.Verified = true
				break
			}
		}
		out = append(out, it)
	}
	return out, nil
}

// verifySignature checks an X-Svc-Signature header (t=<unix>,v1=<hex HMAC-SHA256 of "t.body"
// keyed with the whole secret>), as the receiver guide does. It returns "" when it verifies,
// else the reason.
func verifySignature(secret string, body []byte, header string, now time.Time) string {
	var t, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			t = v
		case "v1":
			sig = v
		}
	}
	ts, err := strconv.ParseInt(t, 10, 64)
	if err != nil || sig == "" {
		return "no X-Svc-Signature"
	}
	if d := now.Sub(time.Unix(ts, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return "stale signature timestamp"
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(t + "."))
	mac.Write(body)
	if !hmac.Equal([]byte(hex.EncodeToString(mac.Sum(nil))), []byte(sig)) {
		return "signature mismatch"
	}
	return ""
}

type demoData struct {
	Channels     []managementapi.Channel
	Received     []received
	ReceiverURL  string
	HasReceiver  bool
	FakeUpstream string
	// ReceiverError says why the receiver's list could not be read.
	ReceiverError string
	// Relay is the relay's base URL ("" when the send button is off); Batch names the send
	// form's batch of idempotency keys; Sent is what the last press of the button did.
	Relay string
	Batch string
	Sent  *demoSent
}

func (h *Handler) demo(w http.ResponseWriter, r *http.Request, s *session) {
	h.demoPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK)
}

func (h *Handler) demoPage(w http.ResponseWriter, r *http.Request, p page, status int) {
	h.demoPageSent(w, r, p, status, nil)
}

// demoPageSent renders the demo page, with what "Send 10 demo messages" did when sent is set.
func (h *Handler) demoPageSent(w http.ResponseWriter, r *http.Request, p page, status int, sent *demoSent) {
	org, pr := p.Session.Key.OrgID, h.principal(r, p.Session)
	chans, err := h.opt.API.ListChannels(r.Context(), pr)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	d := demoData{ReceiverURL: h.receiverURL(org), FakeUpstream: h.opt.Demo.FakeUpstream,
		Relay: h.opt.Demo.Relay, Batch: newDemoBatch(), Sent: sent}
	d.Channels = demoChannels(chans)
	hooks, err := h.opt.API.ListWebhooks(r.Context(), pr)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	// The demo verifies what its receiver got as a receiver would, with the webhook's secret:
	// read from the store, since the Service hands a secret out only when it is made.
	var secrets []string
	for _, wh := range hooks {
		if wh.URL != d.ReceiverURL {
			continue
		}
		d.HasReceiver = true
		secret, err := h.opt.Store.WebhookSecret(r.Context(), wh.ID)
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		secrets = append(secrets, secret)
	}
	if d.HasReceiver {
		if d.Received, err = h.receivedFor(r.Context(), org, secrets); err != nil {
			d.ReceiverError = err.Error()
		}
	}
	p.Title, p.Nav, p.Data = "Demo", "demo", d
	h.render(w, r, status, "demo", p)
}

// demoWebhook creates an org-scoped webhook pointing at the demo receiver, through the API.
func (h *Handler) demoWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	in := managementapi.WebhookInput{Name: "Demo receiver", URL: h.receiverURL(s.Key.OrgID), Events: []string{"messages", "message_status", "channel_health"}}
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) error {
		_, err := h.opt.API.CreateWebhook(ctx, p, in)
		return err
	}); e != nil {
		h.demoPage(w, r, page{Session: s, Error: e.Message}, e.Status)
		return
	}
	h.demoPage(w, r, page{Session: s, Notice: "Demo webhook created: deliveries to it are verified with its secret and listed below."}, http.StatusCreated)
}

// msgPickChannel answers a demo form naming no active channel of the org.
const msgPickChannel = "Pick one of your connected channels."

// formChannel returns the org's active channel that a demo form's phone_number_id names; when
// there is none, or the channels cannot be read, it has answered the request and ok is false.
func (h *Handler) formChannel(w http.ResponseWriter, r *http.Request, s *session) (c managementapi.Channel, ok bool) {
	c, ok, err := h.connectedChannel(r.Context(), h.principal(r, s), r.PostFormValue("phone_number_id"))
	switch {
	case err != nil:
		h.serverError(w, r, err)
	case !ok:
		h.demoPage(w, r, page{Session: s, Error: msgPickChannel}, http.StatusUnprocessableEntity)
	}
	return c, ok && err == nil
}

// formBatch returns a demo form's batch (demoBatchRe); when it has none, it has answered the
// request and ok is false.
func (h *Handler) formBatch(w http.ResponseWriter, r *http.Request, s *session) (batch string, ok bool) {
	batch = r.PostFormValue("batch")
	if !demoBatchRe.MatchString(batch) {
		h.demoPage(w, r, page{Session: s, Error: "The form is incomplete. Reload the page and try again."}, http.StatusUnprocessableEntity)
		return "", false
	}
	return batch, true
}

// connectedChannel returns the org's active channel with the phone number id pnid; ok is false
// when the org has none.
func (h *Handler) connectedChannel(ctx context.Context, p managementapi.Principal, pnid string) (c managementapi.Channel, ok bool, err error) {
	chans, err := h.opt.API.ListChannels(ctx, p)
	if err != nil {
		return c, false, fmt.Errorf("demo: listing channels: %w", err)
	}
	for _, c := range chans {
		if pnid != "" && c.PhoneNumberID != nil && *c.PhoneNumberID == pnid && c.Status == store.ChannelActive {
			return c, true, nil
		}
	}
	return c, false, nil
}

// demoEmit asks the fake upstream to send the service an incoming message for one of the org's
// connected numbers.
func (h *Handler) demoEmit(w http.ResponseWriter, r *http.Request, s *session) {
	pnid, text := r.PostFormValue("phone_number_id"), r.PostFormValue("text")
	if _, ok := h.formChannel(w, r, s); !ok {
		return
	}
	if strings.TrimSpace(text) == "" {
		text = "Hello from the demo"
	}
	if err := h.emit(r.Context(), pnid, text); err != nil {
		h.logger.Warn("demo: the fake upstream did not send the message", zap.Error(err))
		h.demoPage(w, r, page{Session: s, Error: "The fake upstream did not send the message: " + err.Error()}, http.StatusBadGateway)
		return
	}
	h.redirect(w, r, "/demo", "emitted")
}

func (h *Handler) emit(ctx context.Context, pnid, text string) error {
	b, _ := json.Marshal(map[string]string{"phone_number_id": pnid, "text": text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(h.opt.Demo.FakeUpstream, "/")+"/_fake/inbound", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := h.demoClient().Do(req.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("fake upstream unreachable")
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 {
		if reason := upstreamReason(raw); reason != "" {
			return fmt.Errorf("fake upstream answered %d: %s", resp.StatusCode, reason)
		}
		return fmt.Errorf("fake upstream answered %d", resp.StatusCode)
	}
	return nil
}

// demoChannels are the org's connected channels the demo can use, the likeliest to work first
// (the forms' default): those whose upstream token is not known dead before the others, then the
// newest connected. After a `make run` restart the fake upstream has forgotten the numbers
// connected before (its state is in memory), so the channel connected since comes first; an
// old one is known dead once a call or a health read has found its token refused.
func demoChannels(chans []managementapi.Channel) []managementapi.Channel {
	var out []managementapi.Channel
	for _, c := range chans {
		if c.Status == store.ChannelActive && c.PhoneNumberID != nil {
			out = append(out, c)
		}
	}
	at := func(c managementapi.Channel) time.Time {
		if c.ConnectedAt != nil {
			return time.Time(*c.ConnectedAt)
		}
		return time.Time(c.CreatedAt)
	}
	slices.SortStableFunc(out, func(a, b managementapi.Channel) int {
		if da, db := a.UpstreamDisconnectedAt != nil, b.UpstreamDisconnectedAt != nil; da != db {
			if da {
				return 1
			}
			return -1
		}
		return at(b).Compare(at(a))
	})
	return out
}

// upstreamReason is the reason in an error answer of the fake upstream or the relay: the
// fake's and the relay's {"error": "..."}, or Graph's {"error": {"message", "code",
// "error_data": {"details"}}} as "message (code N): details"; "" when the body has none.
func upstreamReason(raw []byte) string {
	var body struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &body) != nil || len(body.Error) == 0 {
		return ""
	}
	var msg string
	if json.Unmarshal(body.Error, &msg) == nil {
		return msg
	}
	var g struct {
		Message   string `json:"message"`
		Code      int    `json:"code"`
		ErrorData struct {
			Details string `json:"details"`
		} `json:"error_data"`
	}
	if json.Unmarshal(body.Error, &g) != nil || g.Message == "" {
		return ""
	}
	out := g.Message
	if g.Code != 0 {
		out += fmt.Sprintf(" (code %d)", g.Code)
	}
	if g.ErrorData.Details != "" && g.ErrorData.Details != g.Message {
		out += ": " + g.ErrorData.Details
	}
	return out
}
