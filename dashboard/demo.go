package dashboard

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/store"
)

// Demo configures the dashboard's demo page, for a service running against the fake upstream
// (`make run` without a Meta app).
type Demo struct {
	// FakeUpstream is the fake upstream's base URL (scheme and host, e.g. http://127.0.0.1:8090):
	// the demo page asks its POST /_fake/inbound to send an incoming message to the service.
	FakeUpstream string
	// ReceiverBase is the HTTPS origin under which the service serves this dashboard for the
	// fake receiver (webhook URLs must be https), e.g. https://localhost:8443.
	ReceiverBase string
	// Client calls the fake upstream. Nil means a client with a 10 s timeout.
	Client *http.Client
}

// received is one delivery the demo receiver got.
type received struct {
	At        time.Time
	WebhookID uuid.UUID
	OrgID     uuid.UUID
	EventID   string
	Type      string
	Verified  bool
	Reason    string
	Body      string
}

// receivedLog keeps the latest deliveries of the demo receiver, in memory (shared across config
// reloads; a demo does not need them to survive a restart).
var receivedLog = struct {
	sync.Mutex
	items []received
}{}

const receivedMax = 200

func recordReceived(it received) {
	receivedLog.Lock()
	defer receivedLog.Unlock()
	receivedLog.items = append(receivedLog.items, it)
	if len(receivedLog.items) > receivedMax {
		receivedLog.items = append([]received(nil), receivedLog.items[len(receivedLog.items)-receivedMax:]...)
	}
}

// receivedFor returns the org's received deliveries, newest first.
func receivedFor(org uuid.UUID) []received {
	receivedLog.Lock()
	defer receivedLog.Unlock()
	var out []received
	for i := len(receivedLog.items) - 1; i >= 0; i-- {
		if receivedLog.items[i].OrgID == org {
			out = append(out, receivedLog.items[i])
		}
	}
	return out
}

// receiverURL is the demo receiver's address for an org.
func (h *Handler) receiverURL(org uuid.UUID) string {
	return strings.TrimRight(h.opt.Demo.ReceiverBase, "/") + h.opt.BasePath + "/demo/receiver/" + org.String()
}

// demoReceive is the demo webhook receiver: it verifies the delivery's X-Svc-Signature with the
// secret of the org's webhook that points here, as a receiver following the guide would, and
// records it. 200 when verified, 401 otherwise.
func (h *Handler) demoReceive(w http.ResponseWriter, r *http.Request, orgParam string) {
	org, err := uuid.Parse(orgParam)
	if err != nil || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	it := received{At: time.Now().UTC(), OrgID: org, EventID: r.Header.Get("webhook-id"), Body: string(body)}
	var ev struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &ev)
	it.Type = ev.Type
	hooks, err := h.opt.Store.ListWebhooks(r.Context(), org)
	if err != nil {
		h.logger.Warn("demo receiver: listing webhooks failed", zap.Error(err))
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	it.Reason = "no webhook of this org points at this receiver"
	self := h.receiverURL(org)
	for _, wh := range hooks {
		if wh.URL != self {
			continue
		}
		secret, err := h.opt.Store.WebhookSecret(r.Context(), wh.ID)
		if err != nil {
			continue
		}
		it.WebhookID = wh.ID
		if reason := verifySignature(secret, body, r.Header.Get("X-Svc-Signature"), time.Now()); reason == "" {
			it.Verified, it.Reason = true, ""
			break
		} else {
			it.Reason = reason
		}
	}
	recordReceived(it)
	if !it.Verified {
		http.Error(w, "signature not verified", http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusOK)
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
	Channels     []store.Channel
	Received     []received
	ReceiverURL  string
	HasReceiver  bool
	CreatedHook  string
	FakeUpstream string
}

func (h *Handler) demo(w http.ResponseWriter, r *http.Request, s *session) {
	h.demoPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK)
}

func (h *Handler) demoPage(w http.ResponseWriter, r *http.Request, p page, status int) {
	org := p.Session.Key.OrgID
	chans, err := h.opt.Store.ListChannels(r.Context(), org)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	d := demoData{ReceiverURL: h.receiverURL(org), Received: receivedFor(org), FakeUpstream: h.opt.Demo.FakeUpstream}
	for _, c := range chans {
		if c.Status == store.ChannelActive && c.PhoneNumberID != nil {
			d.Channels = append(d.Channels, c)
		}
	}
	hooks, err := h.opt.Store.ListWebhooks(r.Context(), org)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	for _, wh := range hooks {
		d.HasReceiver = d.HasReceiver || wh.URL == d.ReceiverURL
	}
	p.Title, p.Nav, p.Data = "Demo", "demo", d
	h.render(w, r, status, "demo", p)
}

// demoWebhook creates an org-scoped webhook pointing at the demo receiver, through the API.
func (h *Handler) demoWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	res := h.call(r, s, http.MethodPost, "/webhooks", map[string]any{"name": "Demo receiver",
		"url": h.receiverURL(s.Key.OrgID), "events": []string{"messages", "message_status"}})
	if msg := res.Err(); msg != "" {
		h.demoPage(w, r, page{Session: s, Error: msg}, res.Status)
		return
	}
	h.demoPage(w, r, page{Session: s, Notice: "Demo webhook created: deliveries to it are verified with its secret and listed below."}, http.StatusCreated)
}

// demoEmit asks the fake upstream to send the service an incoming message for one of the org's
// connected numbers.
func (h *Handler) demoEmit(w http.ResponseWriter, r *http.Request, s *session) {
	pnid, text := r.PostFormValue("phone_number_id"), r.PostFormValue("text")
	owned := false
	if chans, err := h.opt.Store.ListChannels(r.Context(), s.Key.OrgID); err == nil {
		for _, c := range chans {
			owned = owned || (c.PhoneNumberID != nil && *c.PhoneNumberID == pnid && c.Status == store.ChannelActive)
		}
	}
	if !owned {
		h.demoPage(w, r, page{Session: s, Error: "Pick one of your connected channels."}, http.StatusUnprocessableEntity)
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
	c := h.opt.Demo.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("fake upstream unreachable")
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("fake upstream answered %d", resp.StatusCode)
	}
	return nil
}
