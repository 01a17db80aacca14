package dashboard

import (
	"context"
	"net/http"
	"time"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// graceChoice is one of the webhook page's choices of how long a replaced secret keeps signing.
type graceChoice struct {
	Value, Label string
	Default      bool
}

// graceChoices are the webhook page's grace choices; the default is store.DefaultSecretGrace.
var graceChoices = []graceChoice{
	{"0s", "stop at once", false},
	{"1h", "1 hour", false},
	{store.DefaultSecretGrace.String(), "24 hours", true},
	{store.MaxSecretGrace.String(), "7 days", false},
}

// rotateSecret gives the webhook a new signing secret (the management API's rotation, with the
// grace chosen in the form) and shows the webhook's page with the new secret, this once.
func (h *Handler) rotateSecret(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	grace, err := time.ParseDuration(r.PostFormValue("grace"))
	if r.PostFormValue("grace") == "" {
		grace, err = store.DefaultSecretGrace, nil
	}
	if err != nil {
		grace = -1 // refused by the API with its message
	}
	var rotated managementapi.Webhook
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) (err error) {
		rotated, err = h.opt.API.RotateWebhookSecret(ctx, p, id, grace)
		return err
	}); e != nil {
		h.webhookPage(w, r, page{Session: s, Error: e.Message}, e.Status, id)
		return
	}
	h.webhookPageWith(w, r, page{Session: s, Notice: "New signing secret created. Copy it now: it is not shown again."},
		http.StatusOK, id, &rotated)
}
