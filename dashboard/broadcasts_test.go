package dashboard_test

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// postCSV submits the new-broadcast form (multipart, from the dashboard's origin) with csv as
// its file.
func (c *client) postCSV(path string, fields map[string]string, csv string) answer {
	c.e.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for k, v := range fields {
		_ = mw.WriteField(k, v)
	}
	if csv != "" {
		fw, _ := mw.CreateFormFile("recipients", "recipients.csv")
		_, _ = fw.Write([]byte(csv))
	}
	_ = mw.Close()
	req, _ := http.NewRequest(http.MethodPost, c.e.srv.URL+path, &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Origin", c.e.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return c.do(req)
}

var broadcastPathRe = regexp.MustCompile(`^/dashboard/broadcasts/([0-9a-f-]{36})$`)

// TestBroadcastPages: the channel page links its broadcasts; the new-broadcast form makes one
// from a CSV (var1, var2 → body parameters; a duplicate sent once) and shows its page, live
// while it may send, with Pause and Cancel; a bad CSV line or a recipient the API refuses is
// named by its CSV line; the failed recipients are listed with their error explained; Pause,
// Resume and Cancel change it, and a change its status does not allow is refused with the API's
// message; another org's broadcast is not found; an inactive channel offers no form.
func TestBroadcastPages(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	c.signIn(e.key)
	ch := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Support line"})
	idle := e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Not connected"})
	makeActive(t, e, ch.ID)
	base := "/dashboard/channels/" + ch.ID.String()

	wantStatus(t, c.get(base), http.StatusOK, `href="`+base+`/broadcasts"`)
	wantStatus(t, c.get(base+"/broadcasts"), http.StatusOK, "No broadcasts on this channel yet.",
		`enctype="multipart/form-data"`, `name="recipients" type="file"`, `value="en_US"`)
	wantStatus(t, c.get("/dashboard/channels/"+idle.ID.String()+"/broadcasts"), http.StatusOK, "Only an active (connected) channel can send broadcasts.")

	form := map[string]string{"name": "December updates", "template": "order_update", "language": "en_US", "rate_per_minute": "30"}
	// a bad CSV: its line named, the form kept
	wantStatus(t, c.postCSV(base+"/broadcasts", form, "to,var1,var2\n16505550101,Ana,A-1\n16505550102,Ben\n"),
		http.StatusUnprocessableEntity, "CSV line 3 has a different number of fields", `value="December updates"`, `value="30"`)
	wantStatus(t, c.postCSV(base+"/broadcasts", form, "to,var1,var2\n16505550101,Ana,A-1\n\nnot-a-number,Ben,A-2\n"),
		http.StatusUnprocessableEntity, "CSV line 4: &#34;recipients[1].to&#34;")
	wantStatus(t, c.postCSV(base+"/broadcasts", form, ""), http.StatusUnprocessableEntity, "Choose a CSV file of recipients.")
	bad := map[string]string{"name": "x", "template": "order_update", "language": "en_US", "rate_per_minute": "many"}
	wantStatus(t, c.postCSV(base+"/broadcasts", bad, "to\n16505550101\n"), http.StatusUnprocessableEntity, "&#34;rate_per_minute&#34; must be a whole number")
	bad["rate_per_minute"] = "100000"
	wantStatus(t, c.postCSV(base+"/broadcasts", bad, "to\n16505550101\n"), http.StatusUnprocessableEntity, "&#34;rate_per_minute&#34; must be between 1 and")
	if n := e.Count(t, "broadcasts"); n != 0 {
		t.Fatalf("%d broadcasts after bad forms", n)
	}

	// a good one
	a := c.postCSV(base+"/broadcasts", form, "to,var1,var2\n+1 650 555 0101,Ana,A-1\n16505550102,Ben,A-2\n16505550101,Ana again,A-3\n16505550103,Cy,A-4\n")
	m := broadcastPathRe.FindStringSubmatch(a.url)
	if m == nil {
		t.Fatalf("after create: %s (%d)\n%s", a.url, a.status, a.body)
	}
	bid := m[1]
	wantStatus(t, a, http.StatusOK, "Broadcast created.", "<h1>Broadcast December updates</h1>",
		`data-live="3"`, "0 of 3 recipients sent or settled (0%)", "<code>order_update (en_US)</code>", "30 per minute",
		`action="/dashboard/broadcasts/`+bid+`/pause"`, `action="/dashboard/broadcasts/`+bid+`/cancel"`, `<svg class="progress-bar"`)
	if strings.Contains(a.body, "/resume") {
		t.Error("a running broadcast offers Resume")
	}
	if got := testenv.QueryValue[string](t, e.Fixture, `SELECT components::text FROM broadcast_recipients WHERE broadcast_id = $1 AND seq = 1`, bid); !strings.Contains(got, `"text": "Ana"`) || !strings.Contains(got, `"text": "A-1"`) || !strings.Contains(got, `"body"`) {
		t.Errorf("components of the first recipient: %s", got)
	}

	// a failed recipient: its error explained
	e.Exec(t, `UPDATE broadcast_recipients SET status = 'failed', attempts = 1, error_code = 131047, error_title = 'Re-engagement message'
		WHERE broadcast_id = $1 AND seq = 2`, bid)
	wantStatus(t, c.get("/dashboard/broadcasts/"+bid), http.StatusOK, "1 of 3 recipients sent or settled (33%)",
		"<code>16505550102</code>", "<code>131047</code> Re-engagement message", "Outside the 24-hour window", "not sent")

	// the list
	wantStatus(t, c.get(base+"/broadcasts"), http.StatusOK, `href="/dashboard/broadcasts/`+bid+`">December updates</a>`, "1 / 3", "30/min")

	// pause, resume, cancel
	a = c.post("/dashboard/broadcasts/"+bid+"/pause", nil)
	wantStatus(t, a, http.StatusOK, "Broadcast paused", `<span class="badge paused">paused</span>`, "paused by an operator",
		`action="/dashboard/broadcasts/`+bid+`/resume"`)
	if strings.Contains(a.body, "data-live") || strings.Contains(a.body, "/pause\"") {
		t.Error("a paused broadcast is live or offers Pause")
	}
	wantStatus(t, c.post("/dashboard/broadcasts/"+bid+"/pause", nil), http.StatusConflict, "Broadcast is paused")
	wantStatus(t, c.post("/dashboard/broadcasts/"+bid+"/resume", nil), http.StatusOK, "Broadcast resumed.", `data-live="3"`)
	a = c.post("/dashboard/broadcasts/"+bid+"/cancel", nil)
	wantStatus(t, a, http.StatusOK, "Broadcast cancelled", `<span class="badge cancelled">cancelled</span>`, "cancelled: <strong>2</strong>")
	if strings.Contains(a.body, `/cancel"`) || strings.Contains(a.body, `/resume"`) || strings.Contains(a.body, "data-live") {
		t.Error("a cancelled broadcast offers Cancel or Resume, or is live")
	}
	wantStatus(t, c.post("/dashboard/broadcasts/"+bid+"/resume", nil), http.StatusConflict, "Broadcast is cancelled")

	// a CSV larger than the other forms' 64 KiB
	var big strings.Builder
	big.WriteString("to\n")
	for i := range 8000 {
		fmt.Fprintf(&big, "+1 650 %07d\n", i)
	}
	a = c.postCSV(base+"/broadcasts", map[string]string{"name": "Big", "template": "hello_world", "language": "en_US"}, big.String())
	if big.Len() < 100<<10 || broadcastPathRe.FindStringSubmatch(a.url) == nil {
		t.Fatalf("a %d-byte CSV: %s (%d)\n%s", big.Len(), a.url, a.status, a.body)
	}
	wantStatus(t, a, http.StatusOK, "0 of 8000 recipients")
	// over 16 MiB
	huge := "to\n" + strings.Repeat("+1 650 555 0101\n", 17<<20/16)
	wantStatus(t, c.postCSV(base+"/broadcasts", form, huge), http.StatusRequestEntityTooLarge, "The CSV file is too large: at most 16 MiB.")

	// another org's, and no broadcast at all
	other := e.Org(t)
	e.Channel(t, other.ID, &testenv.ChannelOpts{Connection: e.Connection()})
	_, okey := e.APIKey(t, other.ID)
	c2 := e.client()
	c2.signIn(okey)
	wantStatus(t, c2.get("/dashboard/broadcasts/"+bid), http.StatusNotFound)
	wantStatus(t, c2.post("/dashboard/broadcasts/"+bid+"/pause", nil), http.StatusNotFound)
	wantStatus(t, c2.get(base+"/broadcasts"), http.StatusNotFound)
	wantStatus(t, c2.postCSV(base+"/broadcasts", form, "to\n16505550101\n"), http.StatusNotFound)
	wantStatus(t, c.get("/dashboard/broadcasts/"+uuid.NewString()), http.StatusNotFound)
	wantStatus(t, c.get("/dashboard/broadcasts/nope"), http.StatusNotFound)
}
