package dashboard

import (
	"net/http"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/window"
)

// windowView is the customer-service window of a message's customer, as the message page
// shows it (DESIGN §5c).
type windowView struct {
	// State is "open", "closed" or "unknown" (the badge).
	State string
	// Detail says until when, or why.
	Detail string
}

// customerWindow returns the window of the message's customer on its channel (the recipient
// of an outgoing message, the sender of an incoming one): nil when the message names no
// customer with a wa_id, or the window cannot be read (the page shows the rest).
func (h *Handler) customerWindow(r *http.Request, p managementapi.Principal, d *messageData) *windowView {
	customer := d.To
	if d.Direction == store.DirectionIncoming {
		customer = d.From
	}
	if customer == "" {
		return nil
	}
	c, err := h.opt.API.ContactWindow(r.Context(), p, d.ChannelID, customer)
	if err != nil {
		return nil
	}
	v := &windowView{State: string(c.Window)}
	switch {
	case c.Window == window.Open:
		v.Detail = "free-form messages allowed until " + fmtTime(c.WindowExpiresAt)
	case c.WindowExpiresAt != nil:
		v.Detail = "only templates: the customer last wrote more than 24 hours ago (closed at " + fmtTime(c.WindowExpiresAt) + ")"
	case c.Window == window.Closed:
		v.Detail = "only templates: nothing received from the customer in the last 24 hours"
	default:
		v.Detail = "nothing received from the customer since the channel began receiving, less than 24 hours ago"
	}
	return v
}
