package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/wabarelay/wabarelay/store"
)

// TestWebhookOrderingForm: the new-webhook form sets the ordering, each webhook's card shows it
// and changes it; a bad value is refused with the API's message.
func TestWebhookOrderingForm(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	ctx := context.Background()
	wantStatus(t, c.get("/dashboard/webhooks"), http.StatusOK, `name="ordering"`, `value="conversation"`)
	a := c.post("/dashboard/webhooks", url.Values{"name": {"CRM"}, "url": {"https://crm.example.com/hook"}, "events": {"messages"},
		"ordering": {"conversation"}})
	wantStatus(t, a, http.StatusCreated, "<dt>Ordering</dt><dd>conversation</dd>")
	hooks, _ := e.Store.ListWebhooks(ctx, e.org.ID)
	if len(hooks) != 1 || hooks[0].Ordering != store.OrderingConversation {
		t.Fatalf("created %+v", hooks)
	}
	id := hooks[0].ID.String()
	wantStatus(t, c.post("/dashboard/webhooks/"+id+"/ordering", url.Values{"ordering": {"none"}}), http.StatusOK, "Webhook updated.")
	if got, _ := e.Store.GetWebhook(ctx, e.org.ID, hooks[0].ID); got.Ordering != store.OrderingNone {
		t.Fatalf("ordering = %s", got.Ordering)
	}
	wantStatus(t, c.post("/dashboard/webhooks/"+id+"/ordering", url.Values{"ordering": {"fifo"}}), http.StatusUnprocessableEntity,
		"&#34;ordering&#34; must be one of: none, conversation")
}
