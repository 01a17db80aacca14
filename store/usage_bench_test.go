package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// BenchmarkPricedStatus measures what counting the usage costs the intake: posts of 10 "sent"
// statuses of new messages through StoreEvents (no webhook), without and with a pricing object
// (each priced one moves its message into its bucket and appends a delta), on one connection;
// Postgres backend CPU per status (pg-µs/status) beside the time. The variant priced-next
// posts 5 priced "sent" of new messages and 5 priced "delivered" of the previous post's: half
// the statuses are of messages that have a row already (their usage moves by usageSQL). Run:
// go test -run '^$' -bench PricedStatus -benchtime 2000x ./store
func BenchmarkPricedStatus(b *testing.B) {
	const perPost = 10
	for _, name := range []string{"unpriced", "priced", "priced-next"} {
		priced, next := name != "unpriced", name == "priced-next"
		b.Run(name, func(b *testing.B) {
			f, pid := oneConnStore(b)
			ctx := context.Background()
			org := f.Org(b).ID
			conn := f.Connection()
			f.Channel(b, org, &testenv.ChannelOpts{Connection: conn})
			pricing := ""
			if priced {
				pricing = `,"pricing":{"billable":true,"pricing_model":"PMP","category":"marketing","type":"regular"}`
			}
			seq := 0
			post := func() {
				now := time.Now()
				var statuses []string
				for i := range perPost {
					id, st := seq, "sent"
					if next && i%2 == 1 {
						id, st = seq-perPost-1, "delivered" // (the previous post's sent; none before the first)
					}
					statuses = append(statuses, fmt.Sprintf(`{"id":"wamid.HBgLMTU1NTEyMzQ1NjcVAgARGBI%d","status":"%s","timestamp":"%d","recipient_id":"%s"%s}`,
						100000000+id, st, now.Unix(), []string{"12127365000", "919876543210", "5511987654321"}[i%3], pricing))
					seq++
				}
				body := `{"object":"whatsapp_business_account","entry":[{"id":"waba","changes":[{"field":"messages","value":{
					"metadata":{"phone_number_id":"` + conn.PhoneNumberID + `"},"statuses":[` + strings.Join(statuses, ",") + `]}}]}]}`
				parsed, err := inbound.Parse([]byte(body))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := f.Store.StoreEvents(ctx, parsed.Items, store.Claim{}); err != nil {
					b.Fatal(err)
				}
			}
			for range 20 { // partitions, plans
				post()
			}
			cpu0 := procCPU(b, pid)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				post()
			}
			b.StopTimer()
			pg := procCPU(b, pid) - cpu0
			b.ReportMetric(float64(pg.Microseconds())/float64(b.N*perPost), "pg-µs/status")
		})
	}
}
