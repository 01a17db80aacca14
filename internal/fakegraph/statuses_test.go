package fakegraph

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// postedStatus is the one status of a status webhook, checked: signed with the app secret, read
// by the inbound package as one status of the number, and decoded member by member.
type postedStatus struct {
	ID          string          `json:"id"`
	Status      string          `json:"status"`
	Timestamp   string          `json:"timestamp"`
	RecipientID string          `json:"recipient_id"`
	Pricing     json.RawMessage `json:"pricing"`
	Errors      json.RawMessage `json:"errors"`
	// raw is the status object as posted (Graph-escaped).
	raw string
}

func (p postedStatus) unix(t *testing.T) int64 {
	t.Helper()
	n, err := strconv.ParseInt(p.Timestamp, 10, 64)
	if err != nil {
		t.Fatalf("timestamp %q", p.Timestamp)
	}
	return n
}

// statusPost waits for the hook's n-th post (from 1) and returns its status.
func statusPost(t *testing.T, hook *testenv.Receiver, n int) postedStatus {
	t.Helper()
	p := post(t, hook, n)
	if !inbound.VerifySignature(appSK, p.Body, p.Header.Get("X-Hub-Signature-256")) {
		t.Fatalf("post %d: signature does not verify", n)
	}
	batch, err := inbound.Parse(p.Body)
	if err != nil || len(batch.Items) != 1 || batch.Items[0].Type != inbound.TypeStatus || batch.Items[0].PhoneNumberID != pnid ||
		batch.Items[0].WabaID != waba {
		t.Fatalf("post %d: %+v %v\n%s", n, batch, err, p.Body)
	}
	var env struct {
		Entry []struct {
			Changes []struct {
				Field string
				Value struct {
					Statuses []json.RawMessage
				}
			}
		}
	}
	if err := json.Unmarshal(p.Body, &env); err != nil || len(env.Entry) != 1 || len(env.Entry[0].Changes) != 1 ||
		env.Entry[0].Changes[0].Field != "messages" || len(env.Entry[0].Changes[0].Value.Statuses) != 1 {
		t.Fatalf("post %d: %v\n%s", n, err, p.Body)
	}
	raw := env.Entry[0].Changes[0].Value.Statuses[0]
	var st postedStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	st.raw = string(raw)
	if batch.Items[0].DedupeKey != "s:"+st.ID+":"+st.Status {
		t.Fatalf("post %d: dedupe key %q for %s", n, batch.Items[0].DedupeKey, raw)
	}
	return st
}

// send posts a message to "to" and returns its wamid.
func send(t *testing.T, f *fixture, to string) string {
	t.Helper()
	r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, `{"messaging_product":"whatsapp","to":"`+to+`","type":"text","text":{"body":"hi"}}`)
	msgs, _ := r.body["messages"].([]any)
	if r.status != 200 || len(msgs) != 1 {
		t.Fatalf("send to %s: %d %s", to, r.status, r.raw)
	}
	return msgs[0].(map[string]any)["id"].(string)
}

// TestStatusWebhooks: with a callback, a message the fake accepts is followed by its "sent",
// "delivered" and "read" status webhooks, each its own signed post, with timestamps increasing
// and pricing on sent and delivered only (§3.4); a refused send reports nothing.
func TestStatusWebhooks(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL))
	before := time.Now().Unix()
	wamid := send(t, f, "+16505551234")
	var prev int64
	for i, want := range []string{"sent", "delivered", "read"} {
		st := statusPost(t, hook, i+1)
		if st.ID != wamid || st.Status != want || st.RecipientID != "16505551234" || st.Errors != nil {
			t.Fatalf("post %d: want %s of %s: %s", i+1, want, wamid, st.raw)
		}
		ts := st.unix(t)
		if ts < before || ts <= prev {
			t.Errorf("%s: timestamp %d (accepted at or after %d, previous status %d)", want, ts, before, prev)
		}
		prev = ts
		if hasPricing := st.Pricing != nil; hasPricing != (want != "read") {
			t.Errorf("%s: pricing %s", want, st.Pricing)
		}
		if want == "sent" && string(st.Pricing) != `{"billable":false,"pricing_model":"PMP","type":"free_customer_service","category":"service"}` {
			t.Errorf("pricing %s", st.Pricing)
		}
	}
	// a refused send reports nothing: the next post is the next accepted send's
	if r := call(t, "POST", f.base+"/"+pnid+"/messages", tok, `{"messaging_product":"whatsapp","to":"1","type":"text"}`); r.status != 400 {
		t.Fatalf("refused send: %d", r.status)
	}
	wamid = send(t, f, "16505550002")
	if st := statusPost(t, hook, 4); st.ID != wamid || st.Status != "sent" {
		t.Fatalf("after a refused send, want the next send's sent (%s): %s", wamid, st.raw)
	}
	hook.WaitN(t, 6)
}

// TestUndeliverableRecipient: a send to a recipient the fake treats as undeliverable (by
// default a wa_id starting with 999) is accepted with a wamid, and then reported "failed" with
// error 131026 in the upstream's shape — and nothing else.
func TestUndeliverableRecipient(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL))
	if !DefaultUndeliverable(UndeliverableRecipient) || DefaultUndeliverable("16505551234") {
		t.Fatal("DefaultUndeliverable")
	}
	before := time.Now().Unix()
	wamid := send(t, f, "+999 555 0100")
	st := statusPost(t, hook, 1)
	if st.ID != wamid || st.Status != "failed" || st.RecipientID != UndeliverableRecipient || st.Pricing != nil || st.unix(t) < before {
		t.Fatalf("failed status: %s", st.raw)
	}
	want := `[{"code":131026,"title":"Message undeliverable","message":"Message undeliverable",` +
		`"error_data":{"details":"Message Undeliverable."},` +
		`"href":"\/documentation\/business-messaging\/whatsapp\/support\/error-codes"}]`
	if string(st.Errors) != want {
		t.Fatalf("errors\n got %s\nwant %s", st.Errors, want)
	}
	// the members in the upstream's order
	if !strings.HasPrefix(st.raw, `{"id":"`) || !strings.Contains(st.raw, `"status":"failed","timestamp":"`) ||
		!strings.HasSuffix(st.raw, `"recipient_id":"`+UndeliverableRecipient+`","errors":`+want+`}`) {
		t.Fatalf("status %s", st.raw)
	}
	// a deliverable send after it: its sent is the next post, so no other status of the
	// undeliverable message came in between
	wamid2 := send(t, f, "16505551234")
	if st := statusPost(t, hook, 2); st.ID != wamid2 || st.Status != "sent" {
		t.Fatalf("after the failed one: %s", st.raw)
	}
	hook.WaitN(t, 4)
}

// TestWithUndeliverable: the rule is the caller's; nil makes every recipient deliverable.
func TestWithUndeliverable(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL), WithStatusOrder("sent"), WithUndeliverable(func(waID string) bool { return waID == "16505550404" }))
	send(t, f, "16505550404")
	send(t, f, UndeliverableRecipient)
	// Each message's statuses are posted by a goroutine of its own: the two posts come in any order.
	a, b := statusPost(t, hook, 1), statusPost(t, hook, 2)
	if a.RecipientID != "16505550404" {
		a, b = b, a
	}
	if a.Status != "failed" || a.RecipientID != "16505550404" || b.Status != "sent" || b.RecipientID != UndeliverableRecipient {
		t.Fatalf("custom rule: %s and %s", a.raw, b.raw)
	}

	hook2 := newHook(t, 200)
	f2 := setup(t, WithCallback(hook2.URL), WithStatusOrder("sent"), WithUndeliverable(nil))
	send(t, f2, UndeliverableRecipient)
	if st := statusPost(t, hook2, 1); st.Status != "sent" {
		t.Fatalf("nil rule: %s", st.raw)
	}
}

// TestStatusOrder: WithStatusOrder posts the statuses in the order given — here read before
// delivered, as the upstream's webhooks may arrive — while their timestamps stay those of the
// events (delivered before read); the undeliverable path is unchanged by it.
func TestStatusOrder(t *testing.T) {
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL), WithStatusOrder("sent", "read", "delivered", "delivered"))
	wamid := send(t, f, "16505551234")
	var got []postedStatus
	for i := 1; i <= 4; i++ {
		st := statusPost(t, hook, i)
		if st.ID != wamid {
			t.Fatalf("post %d: %s", i, st.raw)
		}
		got = append(got, st)
	}
	if got[0].Status != "sent" || got[1].Status != "read" || got[2].Status != "delivered" || got[3].Status != "delivered" {
		t.Fatalf("order %s %s %s %s", got[0].Status, got[1].Status, got[2].Status, got[3].Status)
	}
	sent, read, delivered := got[0].unix(t), got[1].unix(t), got[2].unix(t)
	if !(sent < delivered && delivered < read) || got[3].Timestamp != got[2].Timestamp {
		t.Fatalf("timestamps sent %d delivered %d read %d (repeat %s)", sent, delivered, read, got[3].Timestamp)
	}
	if got[1].Pricing != nil || got[2].Pricing == nil {
		t.Errorf("pricing: read %s, delivered %s", got[1].Pricing, got[2].Pricing)
	}
	send(t, f, UndeliverableRecipient)
	if st := statusPost(t, hook, 5); st.Status != "failed" {
		t.Fatalf("undeliverable with a status order: %s", st.raw)
	}

	// no statuses at all: a marker send on another fake shows the hook is reached
	quiet := newHook(t, 200)
	g := setup(t, WithCallback(quiet.URL), WithStatusOrder())
	send(t, g, "16505551234")
	send(t, g, UndeliverableRecipient)
	if st := statusPost(t, quiet, 1); st.Status != "failed" {
		t.Fatalf("with no statuses, want only the failed one: %s", st.raw)
	}

	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), `"played"`) {
			t.Fatalf("WithStatusOrder(played): %v", r)
		}
	}()
	WithStatusOrder("sent", "played")
}

// TestStatusDelay: with WithStatusDelay the timestamps step by the delay rounded up to whole
// seconds (here 2 s for 1.1 s), so a demo's timeline reads as it happened.
func TestStatusDelay(t *testing.T) {
	t.Parallel()
	hook := newHook(t, 200)
	f := setup(t, WithCallback(hook.URL), WithStatusOrder("sent", "read"), WithStatusDelay(1100*time.Millisecond))
	send(t, f, "16505551234")
	sent, read := statusPost(t, hook, 1), statusPost(t, hook, 2)
	if d := read.unix(t) - sent.unix(t); d != 4 {
		t.Fatalf("read %d s after sent, want 4 (two 2 s steps)", d)
	}
}
