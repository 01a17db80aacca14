package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"testing"
)

// TestWebhookFormEventKinds: the webhook form offers every event kind (DESIGN §5b "Event
// kinds"), and a webhook created with the new ones takes them.
func TestWebhookFormEventKinds(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	wantStatus(t, c.get("/dashboard/webhooks"), http.StatusOK,
		`name="events" value="messages" checked`, `name="events" value="message_status" checked`,
		`name="events" value="channel_status">`, `name="events" value="message_template_status_update">`)
	a := c.post("/dashboard/webhooks", url.Values{"name": {"Ops"}, "url": {"https://ops.example.com/hook"},
		"events": {"channel_status", "message_template_status_update"}})
	wantStatus(t, a, http.StatusCreated, "channel_status, message_template_status_update")
	hooks, err := e.Store.ListWebhooks(context.Background(), e.org.ID)
	if err != nil || len(hooks) != 1 || !slices.Equal(hooks[0].Events, []string{"channel_status", "message_template_status_update"}) {
		t.Fatalf("webhooks %+v %v", hooks, err)
	}
	// an unknown kind is refused with the API's message
	wantStatus(t, c.post("/dashboard/webhooks", url.Values{"name": {"x"}, "url": {"https://x.example.com"}, "events": {"templates"}}),
		http.StatusUnprocessableEntity, "must be one of: messages, message_status, channel_status, message_template_status_update")
}
