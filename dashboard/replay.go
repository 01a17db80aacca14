package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/wabarelay/wabarelay/managementapi"
)

// replay queues the stored events of a window again for the webhook: the webhook page's Replay
// form (since and until as YYYY-MM-DDTHH:MM in UTC, until empty for now; the kinds ticked in
// types, none for all of the webhook's), through the API's Service (Service.Replay), so its
// checks and messages are the API's. The page then says how many events were queued.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	since, ok1 := parseFormTime(r.PostFormValue("since"))
	until, ok2 := parseFormTime(r.PostFormValue("until"))
	if !ok1 || !ok2 || since == nil {
		h.webhookPage(w, r, page{Session: s, Error: `"since" and "until" must be times such as 2026-11-20T00:00 (UTC)`}, http.StatusUnprocessableEntity, id)
		return
	}
	in := managementapi.ReplayInput{Since: since.UTC().Format(time.RFC3339), Types: r.PostForm["types"]}
	for i, t := range in.Types {
		in.Types[i] = formText(t)
	}
	if until != nil {
		in.Until = until.UTC().Format(time.RFC3339)
	}
	var n int
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) (err error) {
		n, err = h.opt.API.Replay(ctx, p, id, in)
		return err
	}); e != nil {
		h.webhookPage(w, r, page{Session: s, Error: e.Message}, e.Status, id)
		return
	}
	h.webhookPage(w, r, page{Session: s, Notice: replayNotice(n)}, http.StatusOK, id)
}

// replayNotice is the webhook page's notice after a replay that queued n deliveries.
func replayNotice(n int) string {
	switch n {
	case 0:
		return "No events queued: every event of the window already has a delivery to this webhook queued."
	case 1:
		return "1 event queued."
	}
	return fmt.Sprintf("%d events queued.", n)
}
