package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/managementapi"
)

// The demo page's "Send a demo broadcast" (DESIGN §5c "Broadcasts"): a broadcast of the demo
// template to demoBroadcastSize made-up customers on a connected channel, at a pace slow enough
// to watch (demoBroadcastRate a minute, or the channel's default rate when its limit is lower),
// with the fake upstream scripted (POST /_fake/script) so that one recipient is answered 130429
// once (retried after its backoff, then accepted) and another 131047 (failed): the broadcast's
// page shows both.

// demoBroadcastSize is how many made-up customers the demo broadcast sends to.
const demoBroadcastSize = 10

// demoBroadcastRate is the demo broadcast's pace, per minute.
const demoBroadcastRate = 60

// demoBroadcastTemplate is the template the demo broadcast sends: one every demo business
// account has (cmd/fakegraph), without variables.
const demoBroadcastTemplate, demoBroadcastLanguage = "hello_world", "en_US"

// The recipients the fake is scripted for (indexes into the list) and their codes.
const (
	demoRetriedIndex, demoRetriedCode = 2, 130429 // rate limit hit: retried, then accepted
	demoFailedIndex, demoFailedCode   = 6, 131047 // re-engagement message: failed
)

// demoBroadcastRecipients makes up the demo broadcast's customers: numbers of the 650-555
// range, different for each rendering of the form (its batch), so that what the fake is
// scripted for one press cannot meet another's recipients.
func demoBroadcastRecipients(batch string) []string {
	f := fnv.New32a()
	f.Write([]byte(batch))
	block := f.Sum32() % 1000
	out := make([]string, demoBroadcastSize)
	for i := range out {
		out[i] = fmt.Sprintf("1650555%03d%d", block, i) // 11 digits
	}
	return out
}

// demoBroadcast scripts the fake upstream's answers for two made-up customers, creates the
// demo broadcast through the API's Service on one of the org's connected channels and shows
// its page.
func (h *Handler) demoBroadcast(w http.ResponseWriter, r *http.Request, s *session) {
	batch, ok := h.formBatch(w, r, s)
	if !ok {
		return
	}
	ch, ok := h.formChannel(w, r, s)
	if !ok {
		return
	}
	to := demoBroadcastRecipients(batch)
	for _, sc := range []struct {
		i, code int
	}{{demoRetriedIndex, demoRetriedCode}, {demoFailedIndex, demoFailedCode}} {
		if err := h.fakePost(r.Context(), "/_fake/script", map[string]any{"to": to[sc.i], "errors": []int{sc.code}}); err != nil {
			h.logger.Warn("demo: the fake upstream did not take the script", zap.Error(err))
			h.demoPage(w, r, page{Session: s, Error: "The fake upstream did not take the demo's script: " + err.Error()}, http.StatusBadGateway)
			return
		}
	}
	tmpl, _ := json.Marshal(map[string]any{"name": demoBroadcastTemplate, "language": map[string]string{"code": demoBroadcastLanguage}})
	in := managementapi.BroadcastInput{Name: "Demo broadcast " + batch[:6], Template: tmpl}
	for _, t := range to {
		in.Recipients = append(in.Recipients, managementapi.RecipientInput{To: "+" + t})
	}
	rate := demoBroadcastRate
	in.RatePerMinute = &rate
	var b managementapi.Broadcast
	create := func(ctx context.Context, p managementapi.Principal) (err error) {
		b, err = h.opt.API.CreateBroadcast(ctx, p, ch.ID.String(), in)
		return err
	}
	e := h.act(r, s, nil, create)
	if e != nil && e.Status == http.StatusUnprocessableEntity && strings.Contains(e.Message, `"rate_per_minute"`) {
		// The channel's relay limit is below the demo's pace: take its default, half of it.
		in.RatePerMinute = nil
		e = h.act(r, s, nil, create)
	}
	if e != nil {
		h.demoPage(w, r, page{Session: s, Error: e.Message}, e.Status)
		return
	}
	h.redirect(w, r, "/broadcasts/"+b.ID.String(), "demo-broadcast")
}
