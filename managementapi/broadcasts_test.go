package managementapi_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// broadcastJSON is a broadcast as answered, its timestamps as written.
type broadcastJSON struct {
	ID            uuid.UUID                     `json:"id"`
	ChannelID     uuid.UUID                     `json:"channel_id"`
	Name          string                        `json:"name"`
	Status        string                        `json:"status"`
	PausedReason  *string                       `json:"paused_reason"`
	CreatedAt     string                        `json:"created_at"`
	StartAt       string                        `json:"start_at"`
	RatePerMinute int                           `json:"rate_per_minute"`
	Template      map[string]any                `json:"template"`
	Counts        managementapi.BroadcastCounts `json:"counts"`
}

// activeChannel creates a connected (active) channel of the org of key.
func (e *env) activeChannel(org uuid.UUID) uuid.UUID {
	e.t.Helper()
	return e.Channel(e.t, org, &testenv.ChannelOpts{Connection: e.Connection()}).ID
}

const broadcastTemplate = `{"name":"offer","language":{"code":"en_US"}}`

// broadcastBody is a valid body with the recipients given (a JSON array) and extra fields.
func broadcastBody(recipients, extra string) string {
	return `{"name":"Nov","template":` + broadcastTemplate + `,"recipients":` + recipients + extra + `}`
}

// TestBroadcastValidation: every bad input of POST /channels/{id}/broadcasts is 422 naming its
// field, in the documented order, and creates nothing; a channel of another org or none at all
// still gets the 422 (the body is checked before anything is read).
func TestBroadcastValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cid := e.activeChannel(e.orgA)
	deep := strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40)
	future := time.Now().Add(31 * 24 * time.Hour).UTC().Format(time.RFC3339)
	many := `[` + strings.TrimSuffix(strings.Repeat(`{"to":"15550100"},`, managementapi.MaxBroadcastRecipients+1), ",") + `]`
	one := `[{"to":"15550100"}]`
	for _, c := range []struct{ name, body, msg string }{
		{"name missing", `{"template":` + broadcastTemplate + `,"recipients":` + one + `}`, `"name" is required`},
		{"name blank", `{"name":"  ","template":` + broadcastTemplate + `,"recipients":` + one + `}`, `"name" is required`},
		{"name long", `{"name":"` + strings.Repeat("n", 201) + `","template":` + broadcastTemplate + `,"recipients":` + one + `}`, `"name" must be at most 200 characters`},
		{"name not a string", `{"name":5,"template":` + broadcastTemplate + `,"recipients":` + one + `}`, `"name" must be a string`},
		{"name NUL", `{"name":"a\u0000","template":` + broadcastTemplate + `,"recipients":` + one + `}`, `"name" must be valid UTF-8 text without NUL characters`},
		{"name before recipients", `{"name":"","template":` + broadcastTemplate + `,"recipients":7}`, `"name" is required`},
		{"template missing", `{"name":"x","recipients":` + one + `}`, `"template" is required`},
		{"template not an object", `{"name":"x","template":"offer","recipients":` + one + `}`, `"template" must be an object`},
		{"template.name missing", `{"name":"x","template":{"language":{"code":"en"}},"recipients":` + one + `}`, `"template.name" is required`},
		{"template.name blank", `{"name":"x","template":{"name":" ","language":{"code":"en"}},"recipients":` + one + `}`, `"template.name" is required`},
		{"template.name not a string", `{"name":"x","template":{"name":1,"language":{"code":"en"}},"recipients":` + one + `}`, `"template.name" must be a string`},
		{"template.language missing", `{"name":"x","template":{"name":"t"},"recipients":` + one + `}`, `"template.language.code" is required`},
		{"template.language not an object", `{"name":"x","template":{"name":"t","language":"en"},"recipients":` + one + `}`, `"template.language" must be an object`},
		{"template.language.code missing", `{"name":"x","template":{"name":"t","language":{}},"recipients":` + one + `}`, `"template.language.code" is required`},
		{"template.components not an array", `{"name":"x","template":{"name":"t","language":{"code":"en"},"components":{}},"recipients":` + one + `}`, `"template.components" must be an array`},
		{"template NUL", `{"name":"x","template":{"name":"t","language":{"code":"en"},"components":["a\u0000"]},"recipients":` + one + `}`, `"template" must be valid UTF-8 text without NUL characters`},
		{"template deep", `{"name":"x","template":{"name":"t","language":{"code":"en"},"components":` + deep + `},"recipients":` + one + `}`, `"template" must be nested at most 32 levels deep`},
		{"template number", `{"name":"x","template":{"name":"t","language":{"code":"en"},"components":[1e999]},"recipients":` + one + `}`, `"template" holds a number out of range`},
		{"recipients missing", `{"name":"x","template":` + broadcastTemplate + `}`, managementapi.MsgBroadcastRecipients},
		{"recipients null", broadcastBody(`null`, ``), managementapi.MsgBroadcastRecipients},
		{"recipients empty", broadcastBody(`[]`, ``), managementapi.MsgBroadcastRecipients},
		{"recipients over 100000", broadcastBody(many, ``), managementapi.MsgBroadcastRecipients},
		{"recipients not an array", broadcastBody(`"15550100"`, ``), `"recipients" must be an array of objects`},
		{"recipient not an object", broadcastBody(`[{"to":"15550100"},"15550101"]`, ``), `"recipients[1]" must be an object`},
		{"recipient without to", broadcastBody(`[{}]`, ``), `"recipients[0].to" is required`},
		{"recipient with empty to", broadcastBody(`[{"to":"15550100"},{"to":" "}]`, ``), `"recipients[1].to" is required`},
		{"recipient to not a string", broadcastBody(`[{"to":15550100}]`, ``), `"recipients[0].to" must be a string`},
		{"recipient to letters", broadcastBody(`[{"to":"call me"}]`, ``), fmt.Sprintf(managementapi.MsgRecipientPhone, "recipients[0].to")},
		{"recipient to 5 digits", broadcastBody(`[{"to":"12345"}]`, ``), fmt.Sprintf(managementapi.MsgRecipientPhone, "recipients[0].to")},
		{"recipient to 16 digits", broadcastBody(`[{"to":"1234567890123456"}]`, ``), fmt.Sprintf(managementapi.MsgRecipientPhone, "recipients[0].to")},
		{"recipient to with a dot", broadcastBody(`[{"to":"1.555.010.0100"}]`, ``), fmt.Sprintf(managementapi.MsgRecipientPhone, "recipients[0].to")},
		{"recipient to NUL", broadcastBody(`[{"to":"1555\u00000100"}]`, ``), `"recipients[0].to" must be valid UTF-8 text without NUL characters`},
		{"recipient components not an array", broadcastBody(`[{"to":"15550100","components":{}}]`, ``), `"recipients[0].components" must be an array`},
		{"recipient components NUL", broadcastBody(`[{"to":"15550100","components":["\u0000"]}]`, ``), `"recipients[0].components" must be valid UTF-8 text without NUL characters`},
		{"recipients in order", broadcastBody(`[{"to":""},{"to":5}]`, ``), `"recipients[0].to" is required`},
		{"rate zero", broadcastBody(one, `,"rate_per_minute":0`), `"rate_per_minute" must be between 1 and 100`},
		{"rate negative", broadcastBody(one, `,"rate_per_minute":-5`), `"rate_per_minute" must be between 1 and 100`},
		{"rate over the limit", broadcastBody(one, `,"rate_per_minute":101`), `"rate_per_minute" must be between 1 and 100`},
		{"rate fraction", broadcastBody(one, `,"rate_per_minute":1.5`), `"rate_per_minute" must be between 1 and 100`},
		{"rate string", broadcastBody(one, `,"rate_per_minute":"10"`), `"rate_per_minute" must be between 1 and 100`},
		{"rate huge", broadcastBody(one, `,"rate_per_minute":1e30`), `"rate_per_minute" must be between 1 and 100`},
		{"start_at not a time", broadcastBody(one, `,"start_at":"tomorrow"`), `"start_at" must be an ISO 8601 timestamp with a time zone`},
		{"start_at without zone", broadcastBody(one, `,"start_at":"2030-01-01T10:00:00"`), `"start_at" must be an ISO 8601 timestamp with a time zone`},
		{"start_at not a string", broadcastBody(one, `,"start_at":1767225600`), `"start_at" must be a string`},
		{"start_at over 30 days", broadcastBody(one, `,"start_at":"`+future+`"`), managementapi.MsgBroadcastStartAhead},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			for _, path := range []string{
				"/channels/" + cid.String() + "/broadcasts",
				"/channels/" + e.activeChannel(e.orgB).String() + "/broadcasts", // another org's
				"/channels/" + uuid.NewString() + "/broadcasts",                 // none
			} {
				expectError(t, e.do("POST", path, e.keyA, c.body), 422, c.msg)
			}
		})
	}
	e.t = t
	if n := e.Count(t, "broadcasts"); n != 0 {
		t.Fatalf("%d broadcasts created by refused requests", n)
	}
}

// TestBroadcastBodyLimit: this route reads up to 16 MiB (a body over 1 MiB is created), 413 past
// it; every other body keeps the 1 MiB limit.
func TestBroadcastBodyLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cid := e.activeChannel(e.orgA)
	path := "/channels/" + cid.String() + "/broadcasts"
	// 2 MiB: 1,000 recipients, padded by an unknown field
	var rs []string
	for i := range 1000 {
		rs = append(rs, fmt.Sprintf(`{"to":"1555%07d"}`, i))
	}
	body := broadcastBody(`[`+strings.Join(rs, ",")+`]`, `,"pad":"`+strings.Repeat("p", 2<<20)+`"`)
	b := created[broadcastJSON](e, path, e.keyA, body)
	if b.Counts.Total != 1000 {
		t.Fatalf("total %d", b.Counts.Total)
	}
	over := broadcastBody(`[{"to":"15550100"}]`, `,"pad":"`+strings.Repeat("p", managementapi.MaxBroadcastBodyBytes)+`"`)
	expectError(t, e.do("POST", path, e.keyA, over), 413, "Request body too large")
	// elsewhere 1 MiB still
	e.expectBodyRefused("/channels")
	e.expectBodyRefused("/webhooks")
	// the broadcast route's other refusals of a body
	r := e.newRequest("POST", path, e.keyA, "")
	expectError(t, e.doRequest(r, ""), 400, "Invalid JSON body")
	expectError(t, e.do("POST", path, e.keyA, `[1]`), 400, "Invalid JSON body")
	r = e.newRequest("POST", path, e.keyA, "x=1")
	r.Header.Set("Content-Type", "text/csv")
	expectError(t, e.doRequest(r, "x=1"), 415, "Content-Type must be application/json")
}

// TestBroadcastCreate: what a valid body creates: defaults (rate half the relay limit, start
// now), duplicates sent and counted once (the first kept, its components), a start_at in the
// past is now, one ahead is scheduled, the relay limit of the options bounds the rate.
func TestBroadcastCreate(t *testing.T) {
	limit := 100
	e := newEnv(t, func(o *managementapi.Options) { o.RelayLimitPerMinute = func() int { return limit } })
	cid := e.activeChannel(e.orgA)
	path := "/channels/" + cid.String() + "/broadcasts"
	before := time.Now().Add(-time.Second)

	b := created[broadcastJSON](e, path, e.keyA, `{"name":"  Nov offer ","template":{"name":"offer","language":{"code":"en_US"},"components":[{"type":"body"}]},
		"recipients":[{"to":"+1 (555) 010-0100","components":[{"type":"body","parameters":[{"type":"text","text":"first"}]}]},
		{"to":"15550100100","components":[{"type":"body","parameters":[{"type":"text","text":"dup"}]}]},{"to":"1-555-010-0101"},{"to":"+15550100100"}]}`)
	start, err := time.Parse(managementapi.TimeLayout, b.StartAt)
	if err != nil || !tsRe.MatchString(b.CreatedAt) || !tsRe.MatchString(b.StartAt) {
		t.Fatalf("timestamps %q %q", b.CreatedAt, b.StartAt)
	}
	if b.Name != "Nov offer" || b.ChannelID != cid || b.Status != store.BroadcastSending || b.PausedReason != nil ||
		b.RatePerMinute != 50 || start.Before(before) || start.After(time.Now()) || b.Template["name"] != "offer" ||
		b.Counts != (managementapi.BroadcastCounts{Total: 2, Queued: 2}) {
		t.Fatalf("created %+v", b)
	}
	// the recipients: digits, the first of each number kept with its components
	r := e.do("GET", "/broadcasts/"+b.ID.String()+"/recipients", e.keyA, "")
	var rs []managementapi.BroadcastRecipient
	r.json(t, &rs)
	if r.status != 200 || len(rs) != 2 || rs[0].To != "15550100100" || rs[1].To != "15550100101" || rs[0].Status != "queued" ||
		rs[0].WAMID != nil || rs[0].Error != nil || rs[0].Attempts != 0 {
		t.Fatalf("recipients %d %s", r.status, r.body)
	}
	comp := testenv.QueryValue[string](t, e.Fixture, `SELECT components::text FROM broadcast_recipients WHERE broadcast_id = $1 AND wa_to = '15550100100'`, b.ID)
	if !strings.Contains(comp, "first") {
		t.Fatalf("kept components %s", comp)
	}

	// start_at in the past: now; ahead: scheduled at it; rate at the limit
	past := created[broadcastJSON](e, path, e.keyA, broadcastBody(`[{"to":"15550100"}]`, `,"start_at":"2020-01-01T00:00:00Z","rate_per_minute":100`))
	if ps, _ := time.Parse(managementapi.TimeLayout, past.StartAt); ps.Before(before) || past.Status != "sending" || past.RatePerMinute != 100 {
		t.Fatalf("past start %+v", past)
	}
	ahead := time.Now().Add(29 * 24 * time.Hour).Truncate(time.Millisecond).UTC()
	sch := created[broadcastJSON](e, path, e.keyA, broadcastBody(`[{"to":"15550100"}]`, `,"start_at":"`+ahead.Format(time.RFC3339Nano)+`","rate_per_minute":1`))
	if sch.StartAt != ahead.Format(managementapi.TimeLayout) || sch.Status != "scheduled" || sch.RatePerMinute != 1 {
		t.Fatalf("scheduled %+v (want start %s)", sch, ahead)
	}

	// a relay limit of 1000 a minute: 500 by default, up to 1000
	limit = 1000
	if d := created[broadcastJSON](e, path, e.keyA, broadcastBody(`[{"to":"15550100"}]`, ``)); d.RatePerMinute != 500 {
		t.Fatalf("default rate at 1000/min: %d", d.RatePerMinute)
	}
	created[broadcastJSON](e, path, e.keyA, broadcastBody(`[{"to":"15550100"}]`, `,"rate_per_minute":1000`))
	expectError(t, e.do("POST", path, e.keyA, broadcastBody(`[{"to":"15550100"}]`, `,"rate_per_minute":1001`)), 422,
		`"rate_per_minute" must be between 1 and 1000`)
	// a limit of 1 a minute: the default is 1
	limit = 1
	if d := created[broadcastJSON](e, path, e.keyA, broadcastBody(`[{"to":"15550100"}]`, ``)); d.RatePerMinute != 1 {
		t.Fatalf("default rate at 1/min: %d", d.RatePerMinute)
	}
	// no relay handler (0): the relay's default 100
	limit = 0
	if d := created[broadcastJSON](e, path, e.keyA, broadcastBody(`[{"to":"15550100"}]`, ``)); d.RatePerMinute != 50 {
		t.Fatalf("default rate without a relay limit: %d", d.RatePerMinute)
	}

	// the list: newest first
	var list []broadcastJSON
	lr := e.do("GET", path, e.keyA, "")
	lr.json(t, &list)
	if lr.status != 200 || len(list) != 7 || list[6].ID != b.ID {
		t.Fatalf("list %d: %d broadcasts", lr.status, len(list))
	}
	// GET
	var got broadcastJSON
	g := e.do("GET", "/broadcasts/"+b.ID.String(), e.keyA, "")
	g.json(t, &got)
	if g.status != 200 || got.ID != b.ID || got.Counts != b.Counts || got.CreatedAt != b.CreatedAt {
		t.Fatalf("get %d %s", g.status, g.body)
	}
}

// TestBroadcastChannelRefusals: a channel that is not active (pending, deactivated,
// disconnected upstream) or that the org deleted is 409 Channel is not active; another org's
// (deleted or not), an unknown or a malformed one 404 Channel not found. The list of a deleted
// channel is 404 (its broadcasts stay readable by id).
func TestBroadcastChannelRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	body := broadcastBody(`[{"to":"15550100"}]`, ``)
	post := func(cid string) response { return e.do("POST", "/channels/"+cid+"/broadcasts", e.keyA, body) }

	pending := e.createChannel(e.keyA, "pending")
	expectError(t, post(pending.ID.String()), 409, managementapi.MsgChannelNotActive)
	deactivated := e.activeChannel(e.orgA)
	if _, err := e.Store.DeactivateChannel(ctx, deactivated); err != nil {
		t.Fatal(err)
	}
	expectError(t, post(deactivated.String()), 409, managementapi.MsgChannelNotActive)
	disconnected := e.activeChannel(e.orgA)
	e.Exec(t, `UPDATE channels SET upstream_disconnected_at = now() WHERE id = $1`, disconnected)
	expectError(t, post(disconnected.String()), 409, managementapi.MsgChannelNotActive)

	deleted := e.activeChannel(e.orgA)
	if _, err := e.Store.DeleteChannel(ctx, e.orgA, deleted, true); err != nil {
		t.Fatal(err)
	}
	expectError(t, post(deleted.String()), 409, managementapi.MsgChannelNotActive)
	// a running broadcast of a channel deleted: cancelled, readable
	running := e.activeChannel(e.orgA)
	rb := created[broadcastJSON](e, "/channels/"+running.String()+"/broadcasts", e.keyA, body)
	if _, err := e.Store.DeleteChannel(ctx, e.orgA, running, true); err != nil {
		t.Fatal(err)
	}
	var got broadcastJSON
	if r := e.do("GET", "/broadcasts/"+rb.ID.String(), e.keyA, ""); r.status != 200 {
		t.Fatalf("broadcast of a deleted channel: %d %s", r.status, r.body)
	} else if r.json(t, &got); got.Status != "cancelled" || got.Counts != (managementapi.BroadcastCounts{Total: 1}) {
		t.Fatalf("broadcast of a deleted channel: %+v", got)
	}
	expectError(t, e.do("GET", "/channels/"+deleted.String()+"/broadcasts", e.keyA, ""), 404, managementapi.MsgChannelNotFound)
	deletedB := e.activeChannel(e.orgB)
	if _, err := e.Store.DeleteChannel(ctx, e.orgB, deletedB, true); err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{e.activeChannel(e.orgB).String(), deletedB.String(), uuid.NewString(), "nope"} {
		expectError(t, post(cid), 404, managementapi.MsgChannelNotFound)
		expectError(t, e.do("GET", "/channels/"+cid+"/broadcasts", e.keyA, ""), 404, managementapi.MsgChannelNotFound)
	}
	if n := e.Count(t, "broadcasts"); n != 1 {
		t.Fatalf("%d broadcasts created", n)
	}
}

// TestBroadcastActions: pause, resume, cancel and their 409s; another org's broadcast, an
// unknown or malformed id is 404 Broadcast not found on every route, and untouched.
func TestBroadcastActions(t *testing.T) {
	e := newEnv(t)
	cid := e.activeChannel(e.orgA)
	b := created[broadcastJSON](e, "/channels/"+cid.String()+"/broadcasts", e.keyA, broadcastBody(`[{"to":"15550100"},{"to":"15550101"}]`, ``))
	base := "/broadcasts/" + b.ID.String()
	act := func(action string, status int, want string) broadcastJSON {
		t.Helper()
		r := e.do("POST", base+"/"+action, e.keyA, "")
		if status != 200 {
			expectError(t, r, status, want)
			return broadcastJSON{}
		}
		var out broadcastJSON
		r.json(t, &out)
		if r.status != 200 || out.Status != want {
			t.Fatalf("%s: %d %s", action, r.status, r.body)
		}
		return out
	}
	expectError(t, e.do("POST", base+"/resume", e.keyA, ""), 409, "Broadcast is sending")
	if p := act("pause", 200, "paused"); p.PausedReason == nil || *p.PausedReason != "operator" {
		t.Fatalf("paused_reason %v", p.PausedReason)
	}
	act("pause", 409, "Broadcast is paused")
	if r := act("resume", 200, "sending"); r.PausedReason != nil {
		t.Fatalf("resumed with paused_reason %v", *r.PausedReason)
	}
	c := act("cancel", 200, "cancelled")
	if c.Counts != (managementapi.BroadcastCounts{Total: 2}) {
		t.Fatalf("cancelled counts %+v", c.Counts)
	}
	act("cancel", 409, "Broadcast is cancelled")
	act("pause", 409, "Broadcast is cancelled")
	act("resume", 409, "Broadcast is cancelled")
	var rs []managementapi.BroadcastRecipient
	e.do("GET", base+"/recipients?status=cancelled", e.keyA, "").json(t, &rs)
	if len(rs) != 2 {
		t.Fatalf("cancelled recipients %v", rs)
	}

	// a scheduled one pauses and resumes scheduled; a completed one refuses all three
	s := created[broadcastJSON](e, "/channels/"+cid.String()+"/broadcasts", e.keyA,
		broadcastBody(`[{"to":"15550100"}]`, `,"start_at":"`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"`))
	base = "/broadcasts/" + s.ID.String()
	act("pause", 200, "paused")
	act("resume", 200, "scheduled")
	e.Exec(t, `UPDATE broadcasts SET status = 'completed', finished_at = now() WHERE id = $1`, s.ID)
	for _, a := range []string{"pause", "resume", "cancel"} {
		act(a, 409, "Broadcast is completed")
	}

	// another org's, unknown, malformed: 404 on every route; B's broadcast untouched
	bb := created[broadcastJSON](e, "/channels/"+e.activeChannel(e.orgB).String()+"/broadcasts", e.keyB, broadcastBody(`[{"to":"15550100"}]`, ``))
	for _, id := range []string{bb.ID.String(), uuid.NewString(), "x", b.ID.String() + "0"} {
		for _, rt := range []struct{ method, path string }{
			{"GET", "/broadcasts/" + id}, {"GET", "/broadcasts/" + id + "/recipients"},
			{"GET", "/broadcasts/" + id + "/recipients?status=failed&limit=5&after=1"},
			{"POST", "/broadcasts/" + id + "/pause"}, {"POST", "/broadcasts/" + id + "/resume"}, {"POST", "/broadcasts/" + id + "/cancel"},
		} {
			expectError(t, e.do(rt.method, rt.path, e.keyA, ""), 404, managementapi.MsgBroadcastNotFound)
		}
	}
	var got broadcastJSON
	e.do("GET", "/broadcasts/"+bb.ID.String(), e.keyB, "").json(t, &got)
	if got.Status != "sending" {
		t.Fatalf("B's broadcast %+v", got)
	}
}

// TestBroadcastRecipientsPages: the recipients in list order, pages linked by the Link header
// (limit and status carried), the status filter, and the query's 422s.
func TestBroadcastRecipientsPages(t *testing.T) {
	e := newEnv(t)
	cid := e.activeChannel(e.orgA)
	var rs []string
	for i := range 7 {
		rs = append(rs, fmt.Sprintf(`{"to":"155500000%02d"}`, i))
	}
	b := created[broadcastJSON](e, "/channels/"+cid.String()+"/broadcasts", e.keyA, broadcastBody(`[`+strings.Join(rs, ",")+`]`, ``))
	base := "/broadcasts/" + b.ID.String() + "/recipients"
	// two of them failed
	e.Exec(t, `UPDATE broadcast_recipients SET status = 'failed', attempts = 1, error_code = 131026, error_title = 'Message undeliverable'
		WHERE broadcast_id = $1 AND wa_to IN ('15550000001', '15550000005')`, b.ID)

	walk := func(query string) (tos []string, links []string) {
		t.Helper()
		next := base + query
		for next != "" {
			r := e.do("GET", next, e.keyA, "")
			if r.status != 200 {
				t.Fatalf("GET %s: %d %s", next, r.status, r.body)
			}
			var page []managementapi.BroadcastRecipient
			r.json(t, &page)
			for _, p := range page {
				tos = append(tos, p.To)
			}
			next = ""
			if l := r.header.Get("Link"); l != "" {
				links = append(links, l)
				ref := strings.TrimSuffix(strings.TrimPrefix(l, "<"), `>; rel="next"`)
				next = base + ref
			}
		}
		return tos, links
	}
	tos, links := walk("?limit=3")
	if strings.Join(tos, ",") != "15550000000,15550000001,15550000002,15550000003,15550000004,15550000005,15550000006" || len(links) != 2 {
		t.Fatalf("pages: %v, links %v", tos, links)
	}
	if u, _ := url.ParseQuery(strings.TrimSuffix(strings.TrimPrefix(links[0], "<?"), `>; rel="next"`)); u.Get("limit") != "3" || u.Get("after") == "" {
		t.Fatalf("link %s", links[0])
	}
	tos, links = walk("?status=failed&limit=1")
	if strings.Join(tos, ",") != "15550000001,15550000005" || len(links) != 1 || !strings.Contains(links[0], "status=failed") {
		t.Fatalf("failed pages: %v, links %v", tos, links)
	}
	var failed []managementapi.BroadcastRecipient
	e.do("GET", base+"?status=failed", e.keyA, "").json(t, &failed)
	if len(failed) != 2 || failed[0].Error == nil || failed[0].Error.Code != 131026 || failed[0].Error.Title != "Message undeliverable" || failed[0].Attempts != 1 {
		t.Fatalf("failed %+v", failed)
	}
	if tos, links := walk(""); len(tos) != 7 || len(links) != 0 {
		t.Fatalf("default page: %v %v", tos, links)
	}
	for q, msg := range map[string]string{
		"?status=bogus": `"status" must be one of: queued, sending, accepted, sent, delivered, read, failed, unknown, cancelled`,
		"?limit=0":      `"limit" must be an integer from 1 to 100`,
		"?limit=101":    `"limit" must be an integer from 1 to 100`,
		"?limit=x":      `"limit" must be an integer from 1 to 100`,
		"?after=x":      `"after" is invalid`,
		"?after=-1":     `"after" is invalid`,
		"?after=01":     `"after" is invalid`,
	} {
		expectError(t, e.do("GET", base+q, e.keyA, ""), 422, msg)
	}
}

// TestBroadcastCountsAndTimeline: an accepted recipient's message moves the counts with its
// statuses; the message carries broadcast_id in the channel's list and its timeline, other
// messages null.
func TestBroadcastCountsAndTimeline(t *testing.T) {
	e := newEnv(t)
	cid := e.activeChannel(e.orgA)
	b := created[broadcastJSON](e, "/channels/"+cid.String()+"/broadcasts", e.keyA,
		broadcastBody(`[{"to":"15550000001"},{"to":"15550000002"},{"to":"15550000003"},{"to":"15550000004"}]`, ``))
	// recipient 1 accepted, its message delivered; 2 accepted, message failed; 3 unknown; 4 queued
	e.Exec(t, `UPDATE broadcast_recipients SET status = 'accepted', attempts = 1, wamid = 'wamid.b' || wa_to
		WHERE broadcast_id = $1 AND wa_to IN ('15550000001', '15550000002')`, b.ID)
	e.Exec(t, `UPDATE broadcast_recipients SET status = 'unknown', attempts = 1 WHERE broadcast_id = $1 AND wa_to = '15550000003'`, b.ID)
	e.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank, broadcast_id)
		VALUES ('wamid.b15550000001', $1, $2, '15550000001', now() - interval '1 second', 'accepted', 0, $3),
		       ('wamid.b15550000002', $1, $2, '15550000002', now() - interval '1 second', 'accepted', 0, $3),
		       ('wamid.plain', $1, $2, '15550000009', now(), 'sent', 1, NULL)`, e.orgA, cid, b.ID)
	counts := func() managementapi.BroadcastCounts {
		t.Helper()
		var got broadcastJSON
		e.do("GET", "/broadcasts/"+b.ID.String(), e.keyA, "").json(t, &got)
		return got.Counts
	}
	if c := counts(); c != (managementapi.BroadcastCounts{Total: 4, Queued: 1, Accepted: 2, Unknown: 1}) {
		t.Fatalf("after accepts %+v", c)
	}
	e.Exec(t, `UPDATE messages SET status = 'delivered', status_rank = 2 WHERE wamid = 'wamid.b15550000001'`)
	e.Exec(t, `UPDATE messages SET status = 'failed', status_rank = 4, error_code = 131049, error_title = 'Not delivered' WHERE wamid = 'wamid.b15550000002'`)
	if c := counts(); c != (managementapi.BroadcastCounts{Total: 4, Queued: 1, Delivered: 1, Failed: 1, Unknown: 1}) {
		t.Fatalf("after statuses %+v", c)
	}
	var rs []managementapi.BroadcastRecipient
	e.do("GET", "/broadcasts/"+b.ID.String()+"/recipients", e.keyA, "").json(t, &rs)
	if len(rs) != 4 || rs[0].Status != "delivered" || rs[0].WAMID == nil || *rs[0].WAMID != "wamid.b15550000001" ||
		rs[1].Status != "failed" || rs[1].Error == nil || rs[1].Error.Code != 131049 || rs[2].Status != "unknown" || rs[3].Status != "queued" {
		t.Fatalf("recipients %+v", rs)
	}

	// the timeline: broadcast_id on the list's items and the message's timeline
	lr := e.do("GET", "/channels/"+cid.String()+"/messages", e.keyA, "")
	var items []map[string]any
	lr.json(t, &items)
	byID := map[string]any{}
	for _, it := range items {
		byID[it["wamid"].(string)] = it["broadcast_id"]
	}
	if lr.status != 200 || len(items) != 3 || byID["wamid.b15550000001"] != b.ID.String() || byID["wamid.plain"] != nil {
		t.Fatalf("list %d %s", lr.status, lr.body)
	}
	for wamid, want := range map[string]any{"wamid.b15550000002": b.ID.String(), "wamid.plain": nil} {
		r := e.do("GET", "/messages/"+wamid, e.keyA, "")
		obj := r.object(t)
		if r.status != 200 || obj["broadcast_id"] != want {
			t.Fatalf("GET /messages/%s: %d %s", wamid, r.status, r.body)
		}
	}
	// the search (the dashboard's) carries it too
	svc := e.handler.(*managementapi.Handler).Service()
	ms, _, err := svc.ListMessages(context.Background(), managementapi.Principal{Key: store.APIKey{OrgID: e.orgA}}, cid.String(),
		managementapi.MessageQuery{Search: "15550000001"})
	if err != nil || len(ms) != 1 || ms[0].BroadcastID == nil || *ms[0].BroadcastID != b.ID {
		t.Fatalf("search: %v %+v", err, ms)
	}
}

// TestBroadcastLargest: the largest broadcast, 100,000 recipients each with its components (a
// body of about 9 MiB), is created whole.
func TestBroadcastLargest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cid := e.activeChannel(e.orgA)
	var sb strings.Builder
	sb.WriteString(`{"name":"big","template":` + broadcastTemplate + `,"recipients":[`)
	for i := range managementapi.MaxBroadcastRecipients {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"to":"+1 555 %07d","components":[{"type":"body","parameters":[{"type":"text","text":"customer %d"}]}]}`, i, i)
	}
	sb.WriteString(`]}`)
	body := sb.String()
	if len(body) <= 4<<20 || len(body) > managementapi.MaxBroadcastBodyBytes {
		t.Fatalf("body of %d bytes", len(body))
	}
	start := time.Now()
	b := created[broadcastJSON](e, "/channels/"+cid.String()+"/broadcasts", e.keyA, body)
	t.Logf("%d recipients, %.1f MiB: created in %v", b.Counts.Total, float64(len(body))/(1<<20), time.Since(start))
	if b.Counts.Total != managementapi.MaxBroadcastRecipients || b.Counts.Queued != managementapi.MaxBroadcastRecipients {
		t.Fatalf("counts %+v", b.Counts)
	}
	if n := e.CountWhere(t, "broadcast_recipients", "broadcast_id", b.ID); n != managementapi.MaxBroadcastRecipients {
		t.Fatalf("%d recipients stored", n)
	}
}
