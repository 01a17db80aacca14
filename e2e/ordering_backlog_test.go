package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestOrderedBacklogKeepsOtherOrgsOnTime: an org's ordered webhook has its
// conversation's head in flight to a receiver that never answers, and 300,000 deliveries of the
// conversation queued behind it (as repeated replays of its window queue them); another org's 20
// events each fail their first attempt, with no retry delay: every retry arrives within
// lateBound of its due time (the first attempt's answer). Before the fix every claim read the
// whole blocked backlog (about 4 µs a row) and the other org's retries waited for the claims.
func TestOrderedBacklogKeepsOtherOrgsOnTime(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ctx := context.Background()
	release := make(chan struct{})
	stuck := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}})
	t.Cleanup(func() { close(release) }) // (before the receiver's Close, which waits for its handlers)

	const events = 20
	// lateBound is how late a retry of the other org may arrive. Beside the whole suite on two
	// slow cores the latest came 0.54-0.89 s late, and once 1.2 s with a busy loop beside it.
	// Before the fix each claim read the 300,000 rows (about 4 µs a row: over a second per
	// claim) and the retries waited for several claims. The deterministic guard of the claim's
	// reads is store.TestOrderedClaimReadsFewRows (at most 20 rows read behind 100,000).
	const lateBound = 3 * time.Second
	var mu sync.Mutex
	answered := map[string]time.Time{} // message id → when its failed first attempt was answered
	late := map[string]time.Duration{} // message id → its retry's arrival after its due time
	other := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, r *http.Request) {
		var ev struct {
			Data struct {
				Message struct{ ID string } `json:"message"`
			} `json:"data"`
		}
		_ = json.NewDecoder(r.Body).Decode(&ev)
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		first, seen := answered[ev.Data.Message.ID]
		if !seen {
			answered[ev.Data.Message.ID] = now
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		if _, done := late[ev.Data.Message.ID]; !done {
			late[ev.Data.Message.ID] = now.Sub(first)
		}
		w.WriteHeader(http.StatusNoContent)
	}})
	// No retry delay: a retry is due once its failed attempt is recorded, a moment after the
	// answer its lateness is counted from (which overstates it by that moment). The head's lease
	// outlasts the test.
	appExtra := fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n retry_delays 0s 0s 0s\n timeout 5m\n lease 10m\n failure_threshold 1000\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, testenv.CAFile(t, stuck.Certificate()))
	origin := e.caddyWith("", appExtra, "handle /webhooks/upstream {\n wabarelay_inbound\n}")

	// the ordered org: one customer's messages, the first in flight for good
	e.channelOn(true, pnid)
	w, _ := e.fix.Webhook(t, e.org, stuck.URL+"/hook", &testenv.WebhookOpts{Name: "ordered"})
	if _, err := e.store.SetWebhookOrdering(ctx, e.org, w.ID, store.OrderingConversation); err != nil {
		t.Fatal(err)
	}
	ids, froms := make([]string, 50), make([]string, 50)
	for i := range ids {
		ids[i], froms[i] = fmt.Sprintf("a%02d", i), "15550003333"
	}
	if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, conversationBatch(ids, froms)); status != 200 {
		t.Fatalf("inbound: %d %s", status, body)
	}
	stuck.WaitN(t, 1)
	// the backlog: copies of the conversation's queued deliveries, as replays of its window make
	if _, err := e.pool.Exec(ctx, `
		INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status, next_attempt_at, conversation)
		SELECT gen_random_uuid(), q.created_at, q.event_id, q.webhook_id, 'waiting', q.next_attempt_at, q.conversation
		FROM delivery_queue q CROSS JOIN generate_series(1, 6200) g
		WHERE q.webhook_id = $1 AND q.status = 'waiting'`, w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `ANALYZE delivery_queue`); err != nil {
		t.Fatal(err)
	}
	backlog := e.countRows(`SELECT count(*) FROM delivery_queue WHERE webhook_id = $1`, w.ID)
	t.Logf("ordered backlog: %d deliveries behind one in flight", backlog)

	// the other org: 20 events, each failing its first attempt
	orgB := e.fix.Org(t).ID
	e.fix.Channel(t, orgB, &testenv.ChannelOpts{Connection: connection(pnid2)})
	_, secret := e.fix.Webhook(t, orgB, other.URL+"/hook", &testenv.WebhookOpts{Name: "other"})
	other.Verify(secret)
	msgs := make([]string, events)
	for i := range msgs {
		msgs[i] = fmt.Sprintf(`{"from":"15550004444","id":"b%02d","timestamp":"1700000000","type":"text","text":{"body":"hi"}}`, i)
	}
	post := `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":` +
		`{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550100","phone_number_id":"` + pnid2 + `"},` +
		`"messages":[` + strings.Join(msgs, ",") + `]}}]}]}`
	if status, body := signedPost(t, origin+"/webhooks/upstream", testAppSecret, post); status != 200 {
		t.Fatalf("inbound: %d %s", status, body)
	}
	testenv.Eventually(t, time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(late) == events
	}, "every retry of the other org delivered")
	mu.Lock()
	defer mu.Unlock()
	var worst time.Duration
	for id, d := range late {
		worst = max(worst, d)
		if d > lateBound {
			t.Errorf("%s: retry arrived %v after its due time, beside %d blocked deliveries of another org", id, d, backlog)
		}
	}
	t.Logf("the other org's retries: latest %v after its due time", worst)
	if n := stuck.Count(); n != 1 {
		t.Errorf("the ordered webhook got %d requests, want its head only", n)
	}
}
