package connect_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/connect"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestCompletionNumberMustBelongToAccount: a phone_number_id that is not one of the business
// account's numbers is refused before the upstream registers anything; the channel stays
// pending.
func TestCompletionNumberMustBelongToAccount(t *testing.T) {
	w := newWorld(t, "")
	c := w.channel()
	a := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGmix"), "999", waba)) // 999 is account 888's
	if a.status != 409 || a.body["error"] != connect.MsgNotInAccount {
		t.Fatalf("number of another account: %d %s", a.status, a.raw)
	}
	if got := w.get(c.ID); got.Status != "pending" || got.PhoneNumberID != nil {
		t.Fatalf("channel changed: %+v", got)
	}
	if n := len(w.fake.RequestsTo("POST", "/register")) + len(w.fake.RequestsTo("POST", "/subscribed_apps")); n != 0 {
		t.Fatalf("the upstream was asked to subscribe or register %d times", n)
	}
}

// TestConcurrentCompletions: two completions of one link with different numbers, in flight at
// the same time: exactly one wins, and the channel is the winner's.
func TestConcurrentCompletions(t *testing.T) {
	w := newWorld(t, "")
	w.fake.AddNumber("1777", waba, "+1 555-010-0777", "Second")
	c := w.channel()
	codeA, codeB := w.code("EAAGa"), w.code("EAAGb")
	w.fake.AddToken("EAAGa", []string{pnid, "1777"}, []string{waba})
	w.fake.AddToken("EAAGb", []string{pnid, "1777"}, []string{waba})
	w.fake.SetLatency(100 * time.Millisecond) // both are in flight together
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i, body := range []string{completion(codeA, pnid, waba), completion(codeB, "1777", waba)} {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = w.post("/connect/"+c.ChannelToken, body) }()
	}
	wg.Wait()
	w.fake.SetLatency(0)
	won := -1
	for i, a := range answers {
		if a.status == 200 {
			if won >= 0 {
				t.Fatalf("both completions won: %s / %s", answers[0].raw, answers[1].raw)
			}
			won = i
		} else if a.status != 410 && a.status != 409 {
			t.Fatalf("loser answered %d %s", a.status, a.raw)
		}
	}
	if won < 0 {
		t.Fatalf("no completion won: %s / %s", answers[0].raw, answers[1].raw)
	}
	got := w.get(c.ID)
	if got.Status != "active" || got.PhoneNumberID == nil || *got.PhoneNumberID != answers[won].body["phone_number_id"] {
		t.Fatalf("stored %+v, winner %s", got, answers[won].raw)
	}
}

// TestOperatorDeactivationDuringCompletion: an operator deactivation landing while the
// upstream calls run is not undone by the completion; once the operator reopens the link, the
// owner can complete it.
func TestOperatorDeactivationDuringCompletion(t *testing.T) {
	w := newWorld(t, "")
	c := w.channel()
	w.fake.SetLatency(200 * time.Millisecond)
	done := make(chan answer, 1)
	code := w.code("EAAGop")
	go func() { done <- w.post("/connect/"+c.ChannelToken, completion(code, pnid, waba)) }()
	// deactivate once the completion is under way upstream
	testenv.Eventually(t, testenv.Patience, func() bool { return len(w.fake.RequestsTo("GET", "/oauth/access_token")) > 0 },
		"the completion to reach the upstream")
	if _, err := w.Store.DeactivateChannel(context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	a := <-done
	w.fake.SetLatency(0)
	if a.status != 409 || a.body["error"] != connect.MsgDeactivated {
		t.Fatalf("completion after deactivation: %d %s", a.status, a.raw)
	}
	if got := w.get(c.ID); got.Status != "inactive" || got.InactiveReason == nil || *got.InactiveReason != "operator" {
		t.Fatalf("deactivation undone: %+v", got)
	}
	// the operator reopens it: now the owner can connect
	if _, err := w.Store.ReopenLink(context.Background(), nil, c.ID, time.Hour, true); err != nil {
		t.Fatal(err)
	}
	if a := w.post("/connect/"+c.ChannelToken, completion(w.code("EAAGop2"), pnid, waba)); a.status != 200 || a.body["status"] != "active" {
		t.Fatalf("after the operator reopened: %d %s", a.status, a.raw)
	}
}
