package dashboard_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
)

// TestFormsShowLimits: the dashboard creates through the management API, so its forms meet the
// same per-org caps and key lifetime rule, and show the API's message.
func TestFormsShowLimits(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < managementapi.DefaultMaxWebhooksPerOrg; i++ {
		e.Webhook(t, e.org.ID, "https://crm.example.com/h", &testenv.WebhookOpts{Name: fmt.Sprint("w", i)})
	}
	c := e.client()
	c.signIn(e.key)
	wantStatus(t, c.post("/dashboard/webhooks", url.Values{"name": {"one more"}, "url": {"https://crm.example.com/hook"}, "events": {"messages"}}),
		http.StatusUnprocessableEntity, html.EscapeString(fmt.Sprintf(managementapi.MsgWebhookLimit, managementapi.DefaultMaxWebhooksPerOrg)))

	// a session signed in with a key that expires cannot create a key without expiry
	soon := time.Now().Add(time.Hour)
	_, short := e.APIKey(t, e.org.ID, &testenv.APIKeyOpts{Name: "short", ExpiresAt: &soon})
	c2 := e.client()
	c2.signIn(short)
	wantStatus(t, c2.post("/dashboard/api-keys", url.Values{"name": {"forever"}}),
		http.StatusUnprocessableEntity, html.EscapeString(`"expires_in" is required: the creating key expires at`))
}
