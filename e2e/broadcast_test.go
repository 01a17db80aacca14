package e2e

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// greeting is the fake's template with one body parameter, which each recipient fills in.
var greeting = fakegraph.Template{ID: "t-greet", Name: "greeting", Status: "APPROVED", Category: "MARKETING", Language: "en_US",
	Components: []any{map[string]any{"type": "BODY", "text": "Hi {{1}}, our spring sale starts today"}}}

// TestBroadcastThroughCaddy follows a broadcast through a Caddy process: created through the
// API with five recipients and a duplicate of the first (written differently), it reaches the
// upstream once per unique recipient, each a template with the recipient's own parameter; a
// scripted 130429 for one recipient is retried (4 s later) and then accepted, a scripted 131047
// fails another with its {code, title}. The status webhooks posted back through the inbound
// endpoint move the counts to delivered and read; each accepted send's timeline and the
// channel's message list carry broadcast_id and its relay call, and the relay log has every
// upstream send with its error code; the recipients list filters by
// status and pages with Link. Another org's key gets 404 on every route; pause, resume, cancel
// and their 409s; a broadcast on an inactive channel is refused 409; deleting a channel while
// its broadcast runs cancels the broadcast, which stays readable; a body over 16 MiB is 413.
func TestBroadcastThroughCaddy(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	e.fake.AddTemplates(wabaID, greeting)
	origin := e.broadcastCaddy(e.fake.URL(), "", "6000 1m", "")
	ch := e.channel(true)
	_, key := e.fix.APIKey(t, e.org)
	otherOrg := e.fix.Org(t).ID
	_, otherKey := e.fix.APIKey(t, otherOrg)

	tos := phones(1, 5)
	retried, failed := tos[3], tos[4]
	e.fake.Script(retried, 130429)
	e.fake.Script(failed, 131047)
	given := append(slices.Clone(tos), "+1 (555) 000-0001") // tos[0] again, formatted
	b := createBroadcast(t, origin, key, ch.ID.String(), broadcastBody("spring", "greeting", given, true, 600, ""))
	if b.Counts.Total != 5 || b.RatePerMinute != 600 || b.ChannelID != ch.ID.String() || b.Name != "spring" {
		t.Fatalf("created: %+v, want 5 recipients (the duplicate counted once) at 600/min", b)
	}
	if b.Status != "scheduled" && b.Status != "sending" {
		t.Fatalf("created with status %q", b.Status)
	}

	// Done: four accepted (one after its retry), one failed; the upstream got each unique
	// recipient once, the retried one twice.
	testenv.Eventually(t, time.Minute, func() bool { return getBroadcast(t, origin, key, b.ID).Status == "completed" }, "the broadcast completed")
	b = getBroadcast(t, origin, key, b.ID)
	if c := b.Counts; c.Total != 5 || c.Accepted != 4 || c.Failed != 1 || c.Queued != 0 || c.Unknown != 0 || c.Sent+c.Delivered+c.Read != 0 {
		t.Fatalf("counts after the sends: %+v, want 4 accepted and 1 failed of 5", c)
	}
	for _, to := range tos {
		sends := e.fake.MessagesTo(to)
		want := 1
		if to == retried {
			want = 2
		}
		if len(sends) != want {
			t.Fatalf("%s: %d sends upstream, want %d", to, len(sends), want)
		}
		for _, s := range sends {
			var m struct {
				To       string `json:"to"`
				Type     string `json:"type"`
				Template struct {
					Name       string `json:"name"`
					Language   struct{ Code string }
					Components []struct {
						Type       string
						Parameters []struct{ Type, Text string }
					}
				}
			}
			if err := json.Unmarshal(s.Body, &m); err != nil {
				t.Fatalf("send body %s: %v", s.Body, err)
			}
			if m.Type != "template" || m.Template.Name != "greeting" || m.Template.Language.Code != "en_US" || len(m.Template.Components) != 1 ||
				len(m.Template.Components[0].Parameters) != 1 || m.Template.Components[0].Parameters[0].Text != "name-"+to {
				t.Fatalf("send to %s: %s, want the greeting template with its own parameter", to, s.Body)
			}
			if h := s.Header.Get("Authorization"); h != "Bearer "+realToken {
				t.Fatalf("send to %s with Authorization %q, want the channel's upstream token", to, h)
			}
		}
	}

	// The recipients, in order: statuses, wamids, attempts, the failed one's error.
	rs, _ := allRecipients(t, origin, key, b.ID, "", 100)
	if len(rs) != 5 {
		t.Fatalf("%d recipients listed, want 5: %+v", len(rs), rs)
	}
	wamids := map[string]string{}
	for i, r := range rs {
		if r.To != tos[i] {
			t.Fatalf("recipient %d is %s, want %s", i, r.To, tos[i])
		}
		switch r.To {
		case failed:
			if r.Status != "failed" || r.WAMID != nil || r.Error == nil || r.Error.Code != 131047 || !strings.Contains(r.Error.Title, "Re-engagement message") || r.Attempts != 1 {
				t.Fatalf("the 131047 recipient: %+v (error %+v)", r, r.Error)
			}
		default:
			wantAttempts := 1
			if r.To == retried {
				wantAttempts = 2
			}
			if r.Status != "accepted" || r.WAMID == nil || r.Error != nil || r.Attempts != wantAttempts {
				t.Fatalf("recipient %s: %+v, want accepted after %d attempt(s)", r.To, r, wantAttempts)
			}
			if last := e.fake.MessagesTo(r.To); len(last) == 0 {
				t.Fatalf("no send to %s", r.To)
			}
			wamids[r.To] = *r.WAMID
		}
	}

	// Status webhooks through the inbound endpoint move the counts: two delivered, one read.
	post := func(wamid, status string) {
		t.Helper()
		if st, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, statusPost(wamid, status, time.Now().Unix())); st != 200 {
			t.Fatalf("inbound %s: %d %s", status, st, body)
		}
	}
	post(wamids[tos[0]], "delivered")
	post(wamids[tos[1]], "delivered")
	post(wamids[tos[2]], "sent")
	post(wamids[tos[2]], "read")
	testenv.Eventually(t, 30*time.Second, func() bool {
		c := getBroadcast(t, origin, key, b.ID).Counts
		return c.Delivered == 2 && c.Read == 1 && c.Accepted == 1 && c.Failed == 1 && c.Total == 5
	}, "the counts to move to 2 delivered, 1 read, 1 accepted, 1 failed")
	del, _ := allRecipients(t, origin, key, b.ID, "delivered", 1)
	if len(del) != 2 || del[0].To != tos[0] || del[1].To != tos[1] {
		t.Fatalf("recipients ?status=delivered: %+v", del)
	}
	all, pages := allRecipients(t, origin, key, b.ID, "", 2)
	if len(all) != 5 || pages != 3 {
		t.Fatalf("paging by 2: %d recipients in %d pages, want 5 in 3", len(all), pages)
	}
	for i, r := range all {
		if r.To != tos[i] {
			t.Fatalf("paging by 2: recipient %d is %s, want %s", i, r.To, tos[i])
		}
	}
	if f, _ := allRecipients(t, origin, key, b.ID, "failed", 10); len(f) != 1 || f[0].To != failed {
		t.Fatalf("recipients ?status=failed: %+v", f)
	}

	// Each accepted send is on the timeline, with its broadcast and its relay call.
	for to, wamid := range wamids {
		var tl struct {
			timelineJSON
			BroadcastID *string `json:"broadcast_id"`
		}
		testenv.Eventually(t, 30*time.Second, func() bool {
			r := apiCall(t, "GET", origin+"/v1/messages/"+url.PathEscape(wamid), key, "")
			return r.status == 200 && json.Unmarshal(r.body, &tl) == nil && tl.RelayCall != nil
		}, "the timeline of %s's send with its relay call", to)
		if tl.BroadcastID == nil || *tl.BroadcastID != b.ID || tl.To == nil || *tl.To != to || tl.Direction != "outgoing" {
			t.Fatalf("timeline of %s: %+v broadcast_id %v", to, tl.timelineJSON, tl.BroadcastID)
		}
	}
	// The relay log has each of the six upstream sends, with the upstream's error codes.
	logged := func() []string {
		var codes []string
		rows, err := e.pool.Query(t.Context(), `SELECT status || ' ' || coalesce(error_code::text, '-') FROM relay_log WHERE channel_id = $1 ORDER BY 1`, ch.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			codes = append(codes, c)
		}
		return codes
	}
	wantLog := []string{"200 -", "200 -", "200 -", "200 -", "400 131047", "429 130429"}
	testenv.Eventually(t, 30*time.Second, func() bool { return slices.Equal(logged(), wantLog) }, "the relay log to show the six sends %v", wantLog)
	r := apiCall(t, "GET", origin+"/v1/channels/"+ch.ID.String()+"/messages", key, "")
	var list []map[string]any
	if r.status != 200 || json.Unmarshal(r.body, &list) != nil {
		t.Fatalf("message list: %d %s", r.status, r.body)
	}
	inList := 0
	for _, m := range list {
		if m["broadcast_id"] == b.ID {
			inList++
		}
	}
	if inList != 4 {
		t.Fatalf("the channel's message list has %d messages of the broadcast, want 4: %s", inList, r.body)
	}

	// Another org's key: 404 on every broadcast route and on the channel's.
	for _, c := range []struct{ method, path string }{
		{"GET", "/broadcasts/" + b.ID}, {"GET", "/broadcasts/" + b.ID + "/recipients"},
		{"POST", "/broadcasts/" + b.ID + "/pause"}, {"POST", "/broadcasts/" + b.ID + "/resume"}, {"POST", "/broadcasts/" + b.ID + "/cancel"},
	} {
		expectRelayError(t, apiCall(t, c.method, origin+"/v1"+c.path, otherKey, ""), 404, "Broadcast not found")
	}
	expectRelayError(t, apiCall(t, "GET", origin+"/v1/channels/"+ch.ID.String()+"/broadcasts", otherKey, ""), 404, "Channel not found")
	expectRelayError(t, apiCall(t, "POST", origin+"/v1/channels/"+ch.ID.String()+"/broadcasts", otherKey,
		broadcastBody("theirs", "greeting", tos[:1], true, 0, "")), 404, "Channel not found")

	// Pause, resume, cancel, and the 409s of the statuses that do not allow them.
	expectRelayError(t, broadcastAction(t, origin, key, b.ID, "pause"), 409, "Broadcast is completed")
	later := createBroadcast(t, origin, key, ch.ID.String(), broadcastBody("later", "greeting", tos[:2], true, 0,
		`,"start_at":"`+time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339)+`"`))
	if later.Status != "scheduled" || later.RatePerMinute != 3000 {
		t.Fatalf("scheduled broadcast: %+v, want scheduled at the default rate (half of 6000)", later)
	}
	step := func(action string, status int, want string) {
		t.Helper()
		r := broadcastAction(t, origin, key, later.ID, action)
		if status != 200 {
			expectRelayError(t, r, status, want)
			return
		}
		var got broadcastJSON
		if r.status != 200 || json.Unmarshal(r.body, &got) != nil || got.Status != want {
			t.Fatalf("%s: %d %s, want 200 %s", action, r.status, r.body, want)
		}
		if (want == "paused") != (got.PausedReason != nil && *got.PausedReason == "operator") {
			t.Fatalf("%s: paused_reason %v", action, got.PausedReason)
		}
	}
	step("resume", 409, "Broadcast is scheduled")
	step("pause", 200, "paused")
	step("pause", 409, "Broadcast is paused")
	step("resume", 200, "scheduled")
	step("pause", 200, "paused")
	step("cancel", 200, "cancelled")
	step("cancel", 409, "Broadcast is cancelled")
	step("resume", 409, "Broadcast is cancelled")
	if c := getBroadcast(t, origin, key, later.ID).Counts; c.Total != 2 || c.Queued != 0 {
		t.Fatalf("cancelled broadcast's counts: %+v, want its 2 recipients in total only", c)
	}
	if n := len(e.fake.RequestsTo("POST", "/messages")); n != 6 {
		t.Fatalf("%d sends upstream, want the first broadcast's 6", n)
	}

	// An inactive channel: 409.
	idle := e.channel(false)
	expectRelayError(t, apiCall(t, "POST", origin+"/v1/channels/"+idle.ID.String()+"/broadcasts", key,
		broadcastBody("idle", "greeting", tos[:1], true, 0, "")), 409, "Channel is not active")

	// Deleting a channel while its broadcast runs (one send a second) cancels the broadcast.
	doomed := e.channelOn(true, pnid2)
	running := createBroadcast(t, origin, key, doomed.ID.String(), broadcastBody("doomed", "greeting", phones(100, 30), true, 60, ""))
	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.fake.RequestsTo("POST", "/"+pnid2+"/messages")) >= 1 }, "the doomed broadcast's first send")
	if r := apiCall(t, "DELETE", origin+"/v1/channels/"+doomed.ID.String()+"?force=true", key, ""); r.status != 204 {
		t.Fatalf("delete channel: %d %s", r.status, r.body)
	}
	gone := getBroadcast(t, origin, key, running.ID)
	if gone.Status != "cancelled" || gone.Counts.Total != 30 {
		t.Fatalf("the deleted channel's broadcast: %+v, want cancelled with its 30 recipients", gone)
	}
	// A send in flight at the delete finishes and lands (counted queued until then: a loaded
	// CI run read the counts before it had); every other recipient is cancelled.
	testenv.Eventually(t, 30*time.Second, func() bool {
		gone = getBroadcast(t, origin, key, running.ID)
		return gone.Counts.Queued == 0
	}, "the deleted channel's broadcast with nothing queued or in flight")
	if c := gone.Counts; c.Accepted+c.Failed+c.Unknown >= 30 {
		t.Fatalf("the deleted channel's broadcast counts %+v, want its unsent recipients cancelled (in total only)", c)
	}
	expectRelayError(t, apiCall(t, "GET", origin+"/v1/channels/"+doomed.ID.String()+"/broadcasts", key, ""), 404, "Channel not found")

	// A body over 16 MiB: 413.
	huge := `{"name":"huge","template":{"name":"greeting","language":{"code":"en_US"}},"recipients":[{"to":"15550000001","pad":"` +
		strings.Repeat("x", 16<<20) + `"}]}`
	expectRelayError(t, apiCall(t, "POST", origin+"/v1/channels/"+ch.ID.String()+"/broadcasts", key, huge), 413, "Request body too large")
}
