package dashboard_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// TestFormsShowLimits: the dashboard creates through the management API, so its forms meet the
// same per-org caps and key lifetime rule, and show the API's message.
func TestFormsShowLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := 0; i < managementapi.DefaultMaxWebhooksPerOrg; i++ {
		if _, _, err := e.st.CreateWebhook(ctx, e.org.ID, store.NewWebhook{Name: fmt.Sprint("w", i),
			URL: "https://crm.example.com/h", Events: []string{"messages"}}); err != nil {
			t.Fatal(err)
		}
	}
	c := e.client()
	c.signIn(e.key)
	wantStatus(t, c.post("/dashboard/webhooks", url.Values{"name": {"one more"}, "url": {"https://crm.example.com/hook"}, "events": {"messages"}}),
		http.StatusUnprocessableEntity, html.EscapeString(fmt.Sprintf(managementapi.MsgWebhookLimit, managementapi.DefaultMaxWebhooksPerOrg)))

	// a session signed in with a key that expires cannot create a key without expiry
	soon := time.Now().Add(time.Hour)
	_, short, err := e.st.CreateAPIKey(ctx, e.org.ID, "short", &soon)
	if err != nil {
		t.Fatal(err)
	}
	c2 := e.client()
	c2.signIn(short)
	wantStatus(t, c2.post("/dashboard/api-keys", url.Values{"name": {"forever"}}),
		http.StatusUnprocessableEntity, html.EscapeString(`"expires_in" is required: the creating key expires at`))
}
