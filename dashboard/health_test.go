package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

// shown is how the dashboard shows a time.
const shown = "2006-01-02 15:04:05 UTC"

// TestWebhookPageShowsHealth: the webhook page shows the receiver's health — ok, then failing
// with since when and the probe schedule, then paused for failing — and resuming from the
// dashboard makes it ok again.
func TestWebhookPageShowsHealth(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	ctx := context.Background()
	wh, _ := e.Webhook(t, e.org.ID, "https://crm.example.com/hook")
	page := "/dashboard/webhooks/" + wh.ID.String()
	wantStatus(t, c.get(page), http.StatusOK, `Receiver health: <span class="badge ok">ok</span>`, "its last attempt succeeded")

	q := store.NewQueue(e.Pool)
	pol := store.HealthPolicy{Threshold: 2, ProbeInterval: 30 * time.Second, ProbeIntervalMax: 5 * time.Minute, DisableAfter: time.Hour}
	if _, err := q.RecordHealth(ctx, pol, []store.HealthOutcome{{WebhookID: wh.ID, Failures: 2}}); err != nil {
		t.Fatal(err)
	}
	w, _ := e.Store.GetWebhook(ctx, e.org.ID, wh.ID)
	wantStatus(t, c.get(page), http.StatusOK, `<span class="badge failing">failing</span>`,
		"Failing since "+w.Health.FailingSince.UTC().Format(shown), "2 failed attempts in a row", "Next probe: "+w.Health.NextProbeAt.UTC().Format(shown),
		"probe interval now 30s")

	e.Exec(t, `UPDATE webhooks SET failing_since = now() - interval '2 hours' WHERE id = $1`, wh.ID)
	if _, err := q.RecordHealth(ctx, pol, []store.HealthOutcome{{WebhookID: wh.ID, Failures: 1, ProbeFailed: true}}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c.get(page), http.StatusOK, `<span class="badge paused">paused</span>`, "paused after failing for too long")

	wantStatus(t, c.post("/dashboard/webhooks/"+wh.ID.String()+"/status", url.Values{"status": {"active"}, "back": {"webhook"}}),
		http.StatusOK, `<span class="badge ok">ok</span>`)
}
