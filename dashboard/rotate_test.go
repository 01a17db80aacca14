package dashboard_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestRotateSecretButton: the webhook page's "Rotate secret" form gives the webhook a new secret,
// shown once on the answer (not on the next load), with the old one signing for the chosen grace
// (24 hours by default, none with "stop at once"); another org's webhook is not found.
func TestRotateSecretButton(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	ctx := context.Background()
	wh, old := e.Webhook(t, e.org.ID, "https://crm.example.com/hook")
	page := "/dashboard/webhooks/" + wh.ID.String()
	wantStatus(t, c.get(page), http.StatusOK, "Rotate secret", `<option value="24h0m0s" selected>24 hours</option>`)

	a := c.post(page+"/rotate_secret", url.Values{"grace": {"24h0m0s"}})
	wantStatus(t, a, http.StatusOK, "New signing secret of", "every delivery is signed with the new and the old secret")
	shown := regexp.MustCompile(`value="(whsec_[^"]+)"`).FindStringSubmatch(a.body)
	if shown == nil {
		t.Fatal("no secret shown")
	}
	if s, _ := e.Store.WebhookSecret(ctx, wh.ID); s != html.UnescapeString(shown[1]) || s == old {
		t.Fatal("the secret shown is not the webhook's new one")
	}
	if prev, _, _ := e.Store.PreviousWebhookSecret(ctx, wh.ID); prev != old {
		t.Fatal("the old secret does not sign on")
	}
	again := c.get(page)
	wantStatus(t, again, http.StatusOK, "The previous secret signs until")
	if strings.Contains(again.body, shown[1]) {
		t.Fatal("the new secret is shown again")
	}

	wantStatus(t, c.post(page+"/rotate_secret", url.Values{"grace": {"0s"}}), http.StatusOK, "The old secret no longer signs.")
	if prev, _, _ := e.Store.PreviousWebhookSecret(ctx, wh.ID); prev != "" {
		t.Fatal("grace 0 kept the old secret")
	}
	wantStatus(t, c.post(page+"/rotate_secret", url.Values{"grace": {"999h"}}), http.StatusUnprocessableEntity, "must be an integer between 0 and 604800")

	owh, _ := e.Webhook(t, e.Org(t, &testenv.OrgOpts{Name: "Other"}).ID, "https://x.example", &testenv.WebhookOpts{Name: "theirs"})
	wantStatus(t, c.post("/dashboard/webhooks/"+owh.ID.String()+"/rotate_secret", nil), http.StatusNotFound)
}
