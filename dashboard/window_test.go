package dashboard_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestMessagePageWindow: a message's page shows its customer's 24-hour window — unknown on a
// channel connected just now, closed once it has been receiving for a day with nothing from the
// customer, open with its end once the customer wrote; an incoming message's page shows its
// sender's.
func TestMessagePageWindow(t *testing.T) {
	e := newEnv(t)
	m := newMessagesEnv(t, e)
	c := e.client()
	c.signIn(e.key)
	page := messagePage(m.failed.wamid) // to +15550100002

	wantStatus(t, c.get(page), http.StatusOK, `<span class="badge window-unknown">unknown</span>`)
	e.Exec(t, `UPDATE channels SET connected_at = now() - interval '2 days', contacts_since = now() - interval '2 days' WHERE id = $1`, m.ch.ID)
	wantStatus(t, c.get(page), http.StatusOK, `<span class="badge window-closed">closed</span>`,
		"nothing received from the customer in the last 24 hours")

	sent := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	in := "wamid.INCOMINGWINDOW000000001"
	upstreamWebhook(t, e, "1001", "messages", map[string]any{"id": in, "from": "15550100002", "type": "text",
		"timestamp": fmt.Sprint(sent.Unix()), "text": map[string]any{"body": "hi"}})
	until := sent.Add(24 * time.Hour).Format("2006-01-02 15:04:05 UTC")
	wantStatus(t, c.get(page), http.StatusOK, `<span class="badge window-open">open</span>`, "free-form messages allowed until "+until)
	wantStatus(t, c.get(messagePage(in)), http.StatusOK, `<span class="badge window-open">open</span>`)
}
