package managementapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

// Messages of POST /webhooks/{id}/replay (the window's are formatted with the limit).
const (
	MsgReplayTooLarge = "Replay window holds more than 100000 events; narrow it"
	// MsgReplayBacklog: the webhook's queued deliveries and the replay's would exceed
	// store.MaxReplayBacklog.
	MsgReplayBacklog    = "Replay would leave more than 200000 deliveries queued for this webhook; wait for them to go out or narrow the window"
	MsgReplayUntilOrder = `"until" must be after "since"`
	MsgReplayWindow     = `"until" must be at most 7 days after "since"`
	MsgReplayRetention  = `"since" must be within the event retention (%s)`
)

// ReplayInput is the body of POST /webhooks/{id}/replay as given: Since and Until are
// ISO 8601 timestamps with a time zone (RFC 3339), "" when absent (Until then means now);
// ChannelIDs and Types narrow the webhook's scope and events, nil or empty for all of them.
type ReplayInput struct {
	Since, Until      string
	ChannelIDs, Types []string
}

// Replay queues, for one of the org's webhooks, one new delivery of every stored event of
// the window [since, until) that the webhook's scope and events cover (narrowed by
// ChannelIDs and Types), events from before the webhook existed included, and returns how
// many (see store.Store.Replay). The window is at most 7 days and starts within the event
// retention; more than store.MaxReplayEvents events is refused with 422.
func (s *Service) Replay(ctx context.Context, p Principal, webhookID string, in ReplayInput) (int, error) {
	return s.replay(ctx, p, webhookID, fields{"since": in.Since, "until": in.Until, "channel_ids": in.ChannelIDs, "types": in.Types})
}

func (s *Service) replay(ctx context.Context, p Principal, webhookID string, src source) (int, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return 0, err
	}
	r, e := s.parseReplay(src)
	if e != nil {
		return 0, e
	}
	n, err := s.opt.Store.Replay(ctx, p.Key.OrgID, wid, r)
	switch {
	case errors.Is(err, store.ErrReplayTooLarge):
		return 0, unprocessable("%s", MsgReplayTooLarge)
	case errors.Is(err, store.ErrReplayBacklog):
		if s.opt.OnReplayBacklog != nil {
			s.opt.OnReplayBacklog()
		}
		return 0, unprocessable("%s", MsgReplayBacklog)
	}
	return n, s.storeError(err)
}

// parseReplay validates a replay's fields in the order since, until, channel_ids, types; the
// first problem is reported.
func (s *Service) parseReplay(src source) (store.Replay, *Error) {
	var r store.Replay
	since, ok, e := timestamp(src, "since")
	if e != nil {
		return r, e
	}
	if !ok {
		return r, unprocessable(`"since" is required`)
	}
	now := time.Now()
	until, ok, e := timestamp(src, "until")
	if e != nil {
		return r, e
	}
	if !ok {
		until = now
	}
	switch {
	case !until.After(since):
		return r, unprocessable("%s", MsgReplayUntilOrder)
	case until.Sub(since) > store.MaxReplayWindow:
		return r, unprocessable("%s", MsgReplayWindow)
	}
	retention, _ := store.RetentionPolicy{Retention: s.opt.Retention}.Effective()
	if since.Before(now.Add(-retention)) {
		return r, unprocessable(MsgReplayRetention, hours(retention))
	}
	r.Since, r.Until = since, until
	if r.ChannelIDs, e = parseChannelIDs(src); e != nil {
		return r, e
	}
	r.Types, e = replayTypes(src)
	return r, e
}

// timestamp returns field name as a time; ok is false when it is absent, null or "".
func timestamp(src source, name string) (t time.Time, ok bool, e *Error) {
	raw, _, e := src.str(name)
	if e != nil || raw == "" {
		return time.Time{}, false, e
	}
	t, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil {
		return time.Time{}, false, unprocessable(`"%s" must be an ISO 8601 timestamp with a time zone`, name)
	}
	return t, true, nil
}

// replayTypes returns the distinct event kinds of "types" (nil: all). A kind is checked as
// the "events" of a webhook are (parseEvents), with that check's message naming "types".
func replayTypes(src source) ([]string, *Error) {
	types, _, e := src.strings("types")
	if e != nil || len(types) == 0 {
		return nil, e
	}
	kinds, e := parseEvents(fields{"events": types})
	if e != nil {
		return nil, &Error{e.Status, strings.Replace(e.Message, `"events"`, `"types"`, 1)}
	}
	return kinds, nil
}

// hours writes a duration in whole hours when it is one ("720h"), else as Go does.
func hours(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return d.String()
}

// replay queues the stored events of a window again for one webhook: 202 {"queued": n}.
func (h *Handler) replay(q *call) {
	if _, err := id(q.r.PathValue("id"), MsgWebhookNotFound); err != nil {
		q.fail(err) // the path is checked before the body
		return
	}
	if obj := q.body(); obj != nil {
		n, err := h.svc.replay(q.ctx(), q.p, q.r.PathValue("id"), obj)
		answer(q, http.StatusAccepted, map[string]int{"queued": n}, err)
	}
}
