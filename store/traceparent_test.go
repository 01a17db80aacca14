package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestClaimsCarryTraceparent: a delivery claimed by the inbound hand-off and one claimed from
// the queue both carry the traceparent stored with their event; an event stored without one
// gives claims without one.
func TestClaimsCarryTraceparent(t *testing.T) {
	f, org := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	f.Webhook(t, org.ID, "https://a.example.com", &testenv.WebhookOpts{Name: "a"})
	f.Webhook(t, org.ID, "https://b.example.com", &testenv.WebhookOpts{Name: "b"})
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	items := []store.IncomingItem{
		{Type: "messages", PhoneNumberID: "1", DedupeKey: "traced", Data: json.RawMessage(`{}`), Traceparent: tp},
		{Type: "messages", PhoneNumberID: "1", DedupeKey: "plain", Data: json.RawMessage(`{}`)},
	}
	// 4 deliveries: 2 handed off (one webhook each: the first event's), 2 queued
	res, err := s.StoreEvents(ctx, items, store.Claim{Instance: "i1", Lease: time.Minute, Max: 2})
	if err != nil || len(res.Claimed) != 2 || res.Queued != 2 {
		t.Fatalf("stored %+v, %v: want 2 handed off and 2 queued", res, err)
	}
	traced := map[bool]int{}
	for _, d := range append(res.Claimed, claimAll(t, s)...) {
		switch d.Traceparent {
		case tp:
			traced[true]++
		case "":
			traced[false]++
		default:
			t.Fatalf("claim carries traceparent %q", d.Traceparent)
		}
	}
	if traced[true] != 2 || traced[false] != 2 {
		t.Fatalf("claims with the traceparent: %d, without: %d; want 2 and 2", traced[true], traced[false])
	}
}

// claimAll claims every due delivery for instance "i2".
func claimAll(t *testing.T, s *store.Store) []store.ClaimedDelivery {
	t.Helper()
	c, err := store.NewQueue(s.Pool()).Claim(context.Background(), store.QueueClaim{Instance: "i2", Lease: time.Minute, Limit: 100, PerWebhook: 100})
	if err != nil {
		t.Fatal(err)
	}
	return c.Deliveries
}
