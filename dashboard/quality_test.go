package dashboard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// readHealth claims the due health reads and records the quality and limit each channel gets.
func readHealth(t *testing.T, e *env, quality map[string]string) {
	t.Helper()
	ctx := context.Background()
	reads, err := e.Store.ClaimHealthReads(ctx, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reads {
		q, lim := quality[r.PhoneNumberID], "TIER_2K"
		if _, err := e.Store.RecordHealthRead(ctx, r, store.ChannelHealth{QualityRating: &q, MessagingLimit: &lim}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}

// TestChannelsQuality: the channels page shows each number's quality badge and messaging
// limit, its "At risk" filter lists only the YELLOW and RED ones, and a channel's page shows
// its health and the history of its changes.
func TestChannelsQuality(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	conn := func(name, pn string) store.Channel {
		return e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: name, Connection: &store.Connection{PhoneNumberID: pn, WabaID: "waba-q", UpstreamToken: "t"}})
	}
	green, yellow, red := conn("Green line", "1001"), conn("Yellow line", "1002"), conn("Red line", "1003")
	e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Never connected"})
	readHealth(t, e, map[string]string{"1001": "GREEN", "1002": "GREEN", "1003": "RED"})
	// the yellow one is reconnected and read again: GREEN → YELLOW, a change
	if err := e.Store.ConnectChannel(ctx, yellow.ID, store.Connection{PhoneNumberID: "1002", WabaID: "waba-q", UpstreamToken: "t2"}); err != nil {
		t.Fatal(err)
	}
	readHealth(t, e, map[string]string{"1002": "YELLOW"})

	c := e.client()
	c.signIn(e.key)
	all := c.get("/dashboard/channels")
	wantStatus(t, all, http.StatusOK, `badge quality-green`, `quality GREEN`, `badge quality-yellow`, `quality YELLOW`,
		`badge quality-red`, `quality RED`, `<dd class="messaging-limit">TIER_2K</dd>`, `href="/dashboard/channels?filter=at-risk">At risk (2)</a>`,
		"Green line", "Never connected")
	risky := c.get("/dashboard/channels?filter=at-risk")
	wantStatus(t, risky, http.StatusOK, "Yellow line", "Red line", `At risk (2)`)
	for _, name := range []string{"Green line", "Never connected"} {
		if strings.Contains(risky.body, name) {
			t.Fatalf("the at-risk filter lists %q:\n%s", name, risky.body)
		}
	}
	page := c.get("/dashboard/channels/" + yellow.ID.String())
	wantStatus(t, page, http.StatusOK, "Number health", `<span class="badge quality-yellow">YELLOW</span>`,
		`<code>quality_rating</code> GREEN → <strong>YELLOW</strong>`, "connect or periodic read")
	wantStatus(t, c.get("/dashboard/channels/"+green.ID.String()), http.StatusOK, "No change since the number was connected.")
	wantStatus(t, c.get("/dashboard/channels/"+red.ID.String()), http.StatusOK, `<span class="badge quality-red">RED</span>`)
}
