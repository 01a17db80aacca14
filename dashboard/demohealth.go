package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"
)

// The demo page's health and window buttons (DESIGN §5c): the fake upstream does what the real
// one does, and the service reacts as it would to Meta.
//
//   - "Lower this number's quality": the fake lowers the number's quality_rating to YELLOW and
//     posts a signed phone_number_quality_update webhook (FLAGGED) to the service, as the upstream
//     does; the service reads the number's health after it, and the channels page shows the badge.
//   - "Show a closed window": the fake posts an incoming message from demoLapsedCustomer whose
//     upstream timestamp is 25 hours old (as a late webhook carries it), then the page sends that
//     customer one text through the relay; the message's page shows the customer's window closed.

// demoLapsedCustomer is the made-up customer whose last message is demoLapsedAge old.
const demoLapsedCustomer = "16505550125"

// demoLapsedAge is how long ago demoLapsedCustomer wrote: more than the 24-hour window.
const demoLapsedAge = "25h"

// demoQuality asks the fake upstream to lower the quality of one of the org's connected numbers.
func (h *Handler) demoQuality(w http.ResponseWriter, r *http.Request, s *session) {
	pnid := r.PostFormValue("phone_number_id")
	if _, ok := h.formChannel(w, r, s); !ok {
		return
	}
	err := h.fakePost(r.Context(), "/_fake/account_webhook", map[string]string{
		"phone_number_id": pnid, "field": "phone_number_quality_update", "event": "FLAGGED", "quality_rating": "YELLOW"})
	if err != nil {
		h.logger.Warn("demo: the fake upstream did not post the quality update", zap.Error(err))
		h.demoPage(w, r, page{Session: s, Error: "The fake upstream did not post the quality update: " + err.Error()}, http.StatusBadGateway)
		return
	}
	h.redirect(w, r, "/demo", "quality-lowered")
}

// demoWindow has a customer whose last message is 25 hours old write to one of the org's
// connected numbers, and sends that customer a text through the relay.
func (h *Handler) demoWindow(w http.ResponseWriter, r *http.Request, s *session) {
	batch, ok := h.formBatch(w, r, s)
	if !ok {
		return
	}
	ch, ok := h.formChannel(w, r, s)
	if !ok {
		return
	}
	err := h.fakePost(r.Context(), "/_fake/inbound", map[string]string{"phone_number_id": *ch.PhoneNumberID,
		"from": demoLapsedCustomer, "name": "Lapsed Customer", "text": "Is my order on its way?", "age": demoLapsedAge})
	if err != nil {
		h.logger.Warn("demo: the fake upstream did not send the message", zap.Error(err))
		h.demoPage(w, r, page{Session: s, Error: "The fake upstream did not send the message: " + err.Error()}, http.StatusBadGateway)
		return
	}
	notice := "Customer +" + demoLapsedCustomer + " last wrote " + demoLapsedAge + " ago (the fake's message carries that time): their window is closed."
	if h.opt.Demo.Relay == "" {
		h.demoPage(w, r, page{Session: s, Notice: notice + " The relay's address is not configured (demo { relay }): nothing was sent to them."}, http.StatusOK)
		return
	}
	res := demoSendResult{N: 1, To: demoLapsedCustomer, IdempotencyKey: "demo-window-" + batch}
	if err := h.relaySend(r.Context(), *ch.PhoneNumberID, ch.ChannelToken, &res, "Your order shipped yesterday."); err != nil {
		h.logger.Warn("demo: the relay cannot be reached", zap.String("relay", h.opt.Demo.Relay), zap.Error(err))
		res.Error = "The relay cannot be reached at " + h.opt.Demo.Relay
	}
	sent := &demoSent{Channel: ch.Name}
	if res.WAMID != "" {
		sent.Accepted = 1
		res.Link = h.opt.BasePath + "/messages/" + url.PathEscape(res.WAMID)
		notice += " A text was sent to them through the relay: its message page shows the window."
	}
	sent.Sends = []demoSendResult{res}
	h.demoPageSent(w, r, page{Session: s, Notice: notice}, http.StatusOK, sent)
}

// fakePost posts a JSON body to one of the fake upstream's /_fake/ endpoints; an error names the
// fake's answer (its status and its "error").
func (h *Handler) fakePost(ctx context.Context, path string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("demo: body of %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(h.opt.Demo.FakeUpstream, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("demo: fake upstream URL: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.demoClient().Do(req)
	if err != nil {
		return fmt.Errorf("fake upstream unreachable")
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error != "" {
		return fmt.Errorf("fake upstream answered %d: %s", resp.StatusCode, e.Error)
	}
	return fmt.Errorf("fake upstream answered %d", resp.StatusCode)
}
