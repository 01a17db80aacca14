package dashboard

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"go.uber.org/zap"
)

// "Send 10 demo messages": the demo page sends text messages through the relay with a channel's
// token, as a customer's backend would, so that the fake upstream reports their statuses and
// each message gets a timeline (sent, delivered, read; one of them failed).

// demoSendCount is how many messages one press sends; the last goes to demoUndeliverable.
const demoSendCount = 10

// demoUndeliverable is a made-up recipient the fake upstream accepts and then reports "failed"
// with error 131026 (Message undeliverable): country calling code 999 is no one's
// (internal/fakegraph.DefaultUndeliverable; a dashboard test checks the two agree).
const demoUndeliverable = "9995550100"

// demoRecipient is the made-up customer the i-th demo message (from 0) goes to.
func demoRecipient(i int) string {
	if i == demoSendCount-1 {
		return demoUndeliverable
	}
	return fmt.Sprintf("1650555%04d", 1001+i)
}

// demoBatchRe is the shape of a send form's batch (newDemoBatch).
var demoBatchRe = regexp.MustCompile(`^[0-9a-f]{16}$`)

// newDemoBatch names the batch of idempotency keys of one rendering of the send form, so that
// posting the same form twice (a reload that re-posts it) sends nothing twice: the relay
// answers the repeats from its idempotency store.
func newDemoBatch() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// demoSent is what one press of the button did.
type demoSent struct {
	Channel  string
	Accepted int
	Sends    []demoSendResult
}

// demoSendResult is one relay call of a press.
type demoSendResult struct {
	N              int // from 1
	To             string
	IdempotencyKey string
	// Status is the relay's HTTP status, 0 when it could not be reached.
	Status int
	WAMID  string
	// Link is the message's page on the dashboard (its timeline).
	Link string
	// Error is the refusal's message (the relay's, or the upstream's as relayed).
	Error string
	// Replayed: the relay answered from its idempotency store (the form was posted before).
	Replayed bool
	// Undeliverable: the made-up recipient the upstream reports failed.
	Undeliverable bool
}

// demoSend sends demoSendCount text messages through the relay for one of the org's connected
// channels and shows what happened.
func (h *Handler) demoSend(w http.ResponseWriter, r *http.Request, s *session) {
	if h.opt.Demo.Relay == "" {
		h.demoPage(w, r, page{Session: s, Error: "The relay's address is not configured (demo { relay }): the demo cannot send."}, http.StatusConflict)
		return
	}
	batch, ok := h.formBatch(w, r, s)
	if !ok {
		return
	}
	ch, ok := h.formChannel(w, r, s)
	if !ok {
		return
	}
	sent := &demoSent{Channel: ch.Name}
	for i := range demoSendCount {
		res := demoSendResult{N: i + 1, To: demoRecipient(i), IdempotencyKey: fmt.Sprintf("demo-%s-%02d", batch, i+1)}
		res.Undeliverable = res.To == demoUndeliverable
		text := fmt.Sprintf("Demo message %d of %d", i+1, demoSendCount)
		if err := h.relaySend(r.Context(), *ch.PhoneNumberID, ch.ChannelToken, &res, text); err != nil {
			// the relay cannot be reached: the other calls would fail the same way
			h.logger.Warn("demo: the relay cannot be reached", zap.String("relay", h.opt.Demo.Relay), zap.Error(err))
			res.Error = "The relay cannot be reached at " + h.opt.Demo.Relay
			sent.Sends = append(sent.Sends, res)
			break
		}
		if res.WAMID != "" {
			sent.Accepted++
			res.Link = h.opt.BasePath + "/messages/" + url.PathEscape(res.WAMID)
		}
		sent.Sends = append(sent.Sends, res)
	}
	p, status := page{Session: s}, http.StatusOK
	if sent.Accepted == 0 {
		p.Error, status = "The relay accepted none of the demo messages (see below).", http.StatusBadGateway
	}
	h.demoPageSent(w, r, p, status, sent)
}

// relaySend makes one relay call for res: a text message to res.To with res's idempotency key,
// with the channel's token. It fills in the answer; an error means no answer.
func (h *Handler) relaySend(ctx context.Context, pnid, token string, res *demoSendResult, text string) error {
	body, err := json.Marshal(map[string]any{
		"messaging_product": "whatsapp", "to": res.To, "type": "text", "text": map[string]string{"body": text},
		"idempotency_key": res.IdempotencyKey,
	})
	if err != nil {
		return fmt.Errorf("demo send body: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u := strings.TrimRight(h.opt.Demo.Relay, "/") + "/" + url.PathEscape(pnid) + "/messages"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("demo relay URL: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.demoClient().Do(req)
	if err != nil {
		return fmt.Errorf("demo relay call: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	res.Status = resp.StatusCode
	res.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	// the upstream's answer ({"messages":[{"id"}]} or its error envelope), or the relay's own
	// refusal ({"error": "..."})
	var ans struct {
		Messages []struct {
			ID string `json:"id"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(raw, &ans)
	if resp.StatusCode == http.StatusOK && len(ans.Messages) > 0 && ans.Messages[0].ID != "" {
		res.WAMID = ans.Messages[0].ID
		return nil
	}
	res.Error = relayErrorText(resp.StatusCode, raw)
	return nil
}

// relayErrorText is a refusal's message: the relay's {"error": "..."}, or the upstream's
// {"error": {"message", "code", "error_data": {"details"}}} as relayed (upstreamReason), after
// the status: "answered 400: ...".
func relayErrorText(status int, raw []byte) string {
	if reason := upstreamReason(raw); reason != "" {
		return fmt.Sprintf("answered %d: %s", status, reason)
	}
	return fmt.Sprintf("answered %d", status)
}
