package store_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// BenchmarkIntakeContacts measures what recording the customers' windows costs intake: a post of
// 10 incoming messages from 10 customers (of 1,000, each writing again and again) through
// StoreEvents, one webhook taking them, on one connection; Postgres backend CPU per message
// (pg-µs/msg). Variants: "contacts" (each message from a wa_id with its timestamp: the contacts
// upsert runs) and "none" (the same messages from a sender that is no wa_id: the statement is
// skipped). Run: go test -run '^$' -bench IntakeContacts ./store
func BenchmarkIntakeContacts(b *testing.B) {
	const perPost = 10
	for _, recorded := range []bool{false, true} {
		name := "none"
		if recorded {
			name = "contacts"
		}
		b.Run(name, func(b *testing.B) {
			f, pid := oneConnStore(b)
			ctx := context.Background()
			org := f.Org(b)
			f.Channel(b, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "1", WabaID: "w", UpstreamToken: "t"}})
			f.Webhook(b, org.ID, "https://h.example.com")
			seq := 0
			post := func() []store.IncomingItem {
				items := make([]store.IncomingItem, perPost)
				now := time.Now()
				for i := range items {
					seq++
					from := "1555" + strconv.Itoa(1000000+seq%1000)
					if !recorded {
						from = "user." + from
					}
					id := "wamid.bench" + strconv.Itoa(seq)
					items[i] = store.IncomingItem{Type: "messages", PhoneNumberID: "1", DedupeKey: "m:" + id, Customer: from,
						WAMID: id, Sent: now, Data: json.RawMessage(`{"message":{"id":"` + id + `"},"contact":null}`)}
				}
				return items
			}
			for range 100 { // warm: plans, and the 1,000 customers' rows
				if _, err := f.Store.StoreEvents(ctx, post(), store.Claim{}); err != nil {
					b.Fatal(err)
				}
			}
			cpu0 := procCPU(b, pid)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				items := post()
				b.StartTimer()
				if _, err := f.Store.StoreEvents(ctx, items, store.Claim{}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((procCPU(b, pid)-cpu0).Microseconds())/float64(b.N*perPost), "pg-µs/msg")
		})
	}
}
