package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// BenchmarkClaimBesideOrderedBacklog measures a claim (and the hand-back of what it took) while
// another org's ordered webhook has its conversation's head in flight and 1,000, 10,000 or
// 100,000 deliveries of the conversation queued behind it: the claim takes the one due delivery
// of a plain webhook of a second org. It reports the queue rows the claim reads (rows/claim,
// EXPLAIN ANALYZE of the claim statement as it runs). The backlog is stored through StoreEvents
// (1,000 deliveries) and grown by copying its queued rows, as replays of the window queue them.
// Run: go test -run '^$' -bench ClaimBesideOrderedBacklog ./store
func BenchmarkClaimBesideOrderedBacklog(b *testing.B) {
	for _, size := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			ctx := context.Background()
			f := testenv.NewStore(b)
			orgA, orgB := f.Org(b), f.Org(b)
			f.Channel(b, orgA.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "111", WabaID: "w", UpstreamToken: "t"}})
			f.Channel(b, orgB.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "222", WabaID: "w2", UpstreamToken: "t"}})
			ordered, _ := f.Webhook(b, orgA.ID, "https://ordered.example.com", &testenv.WebhookOpts{Events: []string{"messages"}})
			if _, err := f.Store.SetWebhookOrdering(ctx, orgA.ID, ordered.ID, store.OrderingConversation); err != nil {
				b.Fatal(err)
			}
			f.Webhook(b, orgB.ID, "https://plain.example.com", &testenv.WebhookOpts{Events: []string{"messages"}})
			q := store.NewQueue(f.Pool)
			put := func(pn string, from, n int) {
				items := make([]store.IncomingItem, n)
				for i := range items {
					items[i] = store.IncomingItem{Type: "messages", PhoneNumberID: pn, Customer: "x", DedupeKey: fmt.Sprintf("m:%s:%d", pn, from+i),
						Data: json.RawMessage(`{"message":{"id":"m","from":"x"}}`)}
				}
				if _, err := f.Store.StoreEvents(ctx, items, store.Claim{}); err != nil {
					b.Fatal(err)
				}
			}
			claim := store.QueueClaim{Instance: "bench", Lease: time.Hour, Limit: 100, PerWebhook: 100}
			put("111", 0, 1)
			if c, err := q.Claim(ctx, claim); err != nil || len(c.Deliveries) != 1 { // the head, in flight for good
				b.Fatalf("head: %+v %v", c, err)
			}
			for i := range 10 {
				put("111", 1+i*100, 100)
			}
			f.Exec(b, `
				INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status, next_attempt_at, conversation)
				SELECT gen_random_uuid(), created_at, event_id, webhook_id, status, next_attempt_at, conversation
				FROM delivery_queue CROSS JOIN generate_series(1, $2 / 1000 - 1)
				WHERE webhook_id = $1 AND status <> 'in_flight'`, ordered.ID, size)
			put("222", 0, 1)
			f.Exec(b, `ANALYZE delivery_queue`)
			claim.Instance = "bench2"
			_, rows, _ := claimCost(b, f.Pool, claim)
			b.ResetTimer()
			for range b.N {
				c, err := q.Claim(ctx, claim)
				if err != nil || len(c.Deliveries) != 1 {
					b.Fatalf("claim: %d taken, %v", len(c.Deliveries), err)
				}
				if err := q.Release(ctx, claim.Instance, []store.Handback{{ID: c.Deliveries[0].ID, Claim: c.Deliveries[0].Claim}}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(rows, "rows/claim")
		})
	}
}
