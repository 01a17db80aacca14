package managementapi

import (
	"context"
	"net/http"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/window"
)

// The customer-service window (DESIGN §5c): GET /channels/{id}/contacts/{wa_id}.

// MsgInvalidWAID answers (422) a wa_id that is not digits once '+', spaces and dashes are
// ignored.
const MsgInvalidWAID = "Invalid wa_id"

// Contact is the JSON form of one customer's window on a channel.
type Contact struct {
	ChannelID uuid.UUID `json:"channel_id"`
	// WAID is the customer's wa_id, digits only.
	WAID string `json:"wa_id"`
	// LastInboundAt is the upstream timestamp of the customer's newest incoming message; null
	// when none was received.
	LastInboundAt *Time `json:"last_inbound_at"`
	// Window is "open", "closed" or "unknown" (window.Decide).
	Window window.State `json:"window"`
	// WindowExpiresAt is when the window closes (open) or closed (closed after a message):
	// last_inbound_at + 24 h; null when nothing was received.
	WindowExpiresAt *Time `json:"window_expires_at"`
}

// ContactWindow returns the window of customer waID ('+', spaces and dashes ignored) on one
// of the org's channels: 404 for a channel that is not the org's, 422 for a wa_id that is not
// digits.
func (s *Service) ContactWindow(ctx context.Context, p Principal, channelID, waID string) (Contact, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return Contact{}, err
	}
	wa, ok := window.NormalizeWAID(waID)
	if !ok {
		return Contact{}, &Error{http.StatusUnprocessableEntity, MsgInvalidWAID}
	}
	cw, err := s.opt.Store.ContactWindow(ctx, p.Key.OrgID, cid, wa)
	if err != nil {
		return Contact{}, s.storeError(err)
	}
	state, expires := window.Decide(cw.LastInboundAt, cw.ReceivingSince, cw.At)
	c := Contact{ChannelID: cid, WAID: wa, Window: state}
	if !cw.LastInboundAt.IsZero() {
		last, exp := Time(cw.LastInboundAt), Time(expires)
		c.LastInboundAt, c.WindowExpiresAt = &last, &exp
	}
	return c, nil
}

// getContact answers one customer's window.
func (h *Handler) getContact(q *call) {
	out, err := h.svc.ContactWindow(q.ctx(), q.p, q.r.PathValue("id"), q.r.PathValue("wa_id"))
	answer(q, http.StatusOK, out, err)
}
