package dashboard_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestBrowserBroadcast: at 375 and 1280 px: the channel page links its broadcasts; the
// new-broadcast form, with a CSV file chosen, creates one and shows its page; the page follows
// the broadcast by itself (a recipient failed meanwhile appears, with its error explained,
// without a reload); Pause stops that and offers Resume; the list shows the broadcast. Each
// page fits the screen (checkLayout: the tables scroll in their own box at 375 px) and is saved
// as a screenshot; no console errors or CSP violations.
func TestBrowserBroadcast(t *testing.T) {
	t.Parallel()
	csv := filepath.Join(t.TempDir(), "recipients.csv")
	var rows strings.Builder
	rows.WriteString("to,var1,var2\n")
	for _, r := range []string{"+1 650 555 0101,Ana,A-1042", "16505550102,Ben,A-1043", "16505550103,Cy,A-1044", "16505550104,Dee,A-1045"} {
		rows.WriteString(r + "\n")
	}
	if err := os.WriteFile(csv, []byte(rows.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// Each screen has a dashboard and channel of its own, so the two run in parallel (and each
	// starts from no broadcasts).
	for _, v := range viewports {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			e, b := newBrowserEnv(t)
			ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Sales and after-sales service, Europe"})
			makeActive(t, e, ch.ID)
			list := "/dashboard/channels/" + ch.ID.String() + "/broadcasts"
			p := v.page(t, b)
			signIn(t, p, e, e.key)
			p.Navigate(t, e.srv.URL+"/dashboard/channels/"+ch.ID.String())
			status, path := click(t, p, `a[href="`+list+`"]`)
			wantPage(t, status, path, http.StatusOK, list)
			wantText(t, p, "h1", "Broadcasts of Sales and after-sales service, Europe")
			checkLayout(t, p, "broadcasts-empty", v)

			p.Do(t, chromedp.SendKeys(css("#bc-name"), "December order updates, "+v.name),
				chromedp.SendKeys(css("#bc-template"), "order_update"),
				chromedp.SetUploadFiles(css("#bc-csv"), []string{csv}))
			status, path = click(t, p, `form[enctype="multipart/form-data"] button[type=submit]`)
			path, _, _ = strings.Cut(path, "?")
			if status != http.StatusOK || !broadcastPathRe.MatchString(path) {
				t.Fatalf("after create: %s (HTTP %d): %s", path, status, textOf(t, p, "main"))
			}
			bid := broadcastPathRe.FindStringSubmatch(path)[1]
			wantText(t, p, ".notice", "Broadcast created.")
			wantText(t, p, "#bc-done", "0 of 4 recipients sent or settled (0%)")
			if !present(t, p, "#broadcast-live[data-live]") {
				t.Fatal("a new broadcast's page does not follow it")
			}
			checkLayout(t, p, "broadcast-new", v)

			// Meanwhile two recipients fail (one with a long error title) and two are accepted: the
			// page shows them by itself.
			e.Exec(t, `UPDATE broadcast_recipients SET status = 'failed', attempts = 6, error_code = 131056,
				error_title = '(Business Account, Consumer Account) pair rate limit hit' WHERE broadcast_id = $1 AND seq = 2`, bid)
			e.Exec(t, `UPDATE broadcast_recipients SET status = 'failed', attempts = 1, error_code = 131047,
				error_title = 'Re-engagement message' WHERE broadcast_id = $1 AND seq = 3`, bid)
			// and two were accepted, one of them since delivered, the other read
			for seq, st := range map[int]string{1: "delivered", 4: "read"} {
				wamid := "wamid." + v.name + "-" + st
				e.Exec(t, `UPDATE broadcast_recipients SET status = 'accepted', attempts = 1, wamid = $3 WHERE broadcast_id = $1 AND seq = $2`, bid, seq, wamid)
				e.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank, relay_pending, broadcast_id)
					SELECT $1, org_id, channel_id, wa_to, now(), $2, 2, false, broadcast_id FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
					WHERE r.wamid = $1`, wamid, st)
			}
			browsertest.Eval[bool](t, p, `window.__same = true`)
			waitTrue(t, p, `() => (document.querySelector('#bc-done') || {}).innerText?.startsWith('4 of 4')`)
			if !browsertest.Eval[bool](t, p, `window.__same === true`) {
				t.Error("the page was reloaded, not updated in place")
			}
			wantText(t, p, "table.failed-recipients", "16505550102", "131056", "Pair rate limit", "16505550103", "Outside the 24-hour window")
			wantText(t, p, ".bc-legend", "read: 1", "delivered: 1", "failed: 2", "queued: 0")
			checkLayout(t, p, "broadcast-failed", v)

			status, path = click(t, p, `form[action$="/pause"] button`)
			wantPage(t, status, path, http.StatusOK, "/dashboard/broadcasts/"+bid)
			wantText(t, p, ".notice", "Broadcast paused")
			if present(t, p, "#broadcast-live[data-live]") || !present(t, p, `form[action$="/resume"] button`) {
				t.Error("a paused broadcast's page: still live, or no Resume")
			}
			checkLayout(t, p, "broadcast-paused", v)

			status, path = click(t, p, `a[href="`+list+`"]`)
			wantPage(t, status, path, http.StatusOK, list)
			wantText(t, p, "table.broadcasts", "December order updates, "+v.name, "paused", "4 / 4")
			checkLayout(t, p, "broadcasts", v)
			p.AssertNoConsoleErrors(t)
		})
	}
}
