package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// priced is an upstream status object with a pricing object (raw JSON).
func priced(wamid, st string, at time.Time, recipient, pricing string) string {
	return fmt.Sprintf(`{"id":%q,"status":%q,"timestamp":"%d","recipient_id":%q,"pricing":%s}`, wamid, st, at.Unix(), recipient, pricing)
}

// pricing is a well-formed pricing object.
func pricing(category, typ string, billable bool) string {
	return fmt.Sprintf(`{"billable":%t,"pricing_model":"PMP","category":%q,"type":%q}`, billable, category, typ)
}

// usageOf returns the org's usage of the last 10 days, each row as
// "day channel category type country messages billable" (day as days before today).
func (e *timelineEnv) usageOf(t *testing.T, org uuid.UUID) []string {
	t.Helper()
	now := time.Now().UTC()
	rows, err := e.f.Store.Usage(context.Background(), org, store.UsageFilter{Since: now.AddDate(0, 0, -10), Until: now.AddDate(0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	today := now.Truncate(24 * time.Hour)
	var out []string
	for _, r := range rows {
		ch := "ch"
		if r.ChannelID != e.ch.ID {
			ch = r.ChannelID.String()
		}
		out = append(out, fmt.Sprintf("-%d %s %s %s %s %d %d", int(today.Sub(r.Day)/(24*time.Hour)), ch, r.Category, r.PricingType, r.Country, r.Messages, r.Billable))
	}
	return out
}

func expectUsage(t *testing.T, step string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s: usage\n%s\nwant\n%s", step, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// daysAgo is noon UTC n days ago.
func daysAgo(n int) time.Time {
	return time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -n).Add(12 * time.Hour)
}

// TestUsageCountsOnce: a message is counted once, under its latest pricing, on the day of its
// first priced status: sent then delivered with the same pricing is one message; a repeated
// status changes nothing; a delivered with another category moves the message; a late sent
// does not move it back; a priced status from before moves it to its earlier day.
func TestUsageCountsOnce(t *testing.T) {
	e := newTimelineEnv(t)
	const us = "12127365000" // US
	mkt := pricing("marketing", "regular", true)

	e.post(t, e.pnid, []string{priced("wamid.U1", "sent", daysAgo(2), us, mkt)}, nil)
	expectUsage(t, "sent", e.usageOf(t, e.org), "-2 ch marketing regular US 1 1")
	e.post(t, e.pnid, []string{priced("wamid.U1", "delivered", daysAgo(1), us, mkt)}, nil)
	expectUsage(t, "delivered, same pricing", e.usageOf(t, e.org), "-2 ch marketing regular US 1 1")
	// the upstream re-sends both (duplicates), and read comes without pricing
	e.post(t, e.pnid, []string{priced("wamid.U1", "sent", daysAgo(2), us, mkt), priced("wamid.U1", "delivered", daysAgo(1), us, mkt),
		status("wamid.U1", "read", daysAgo(1).Unix(), us)}, nil)
	expectUsage(t, "re-sent", e.usageOf(t, e.org), "-2 ch marketing regular US 1 1")

	// a second message: its delivered says utility, free: it moves there
	e.post(t, e.pnid, []string{priced("wamid.U2", "sent", daysAgo(1), us, mkt)}, nil)
	e.post(t, e.pnid, []string{priced("wamid.U2", "delivered", daysAgo(1), us, pricing("utility", "free_customer_service", false))}, nil)
	expectUsage(t, "changed category", e.usageOf(t, e.org),
		"-2 ch marketing regular US 1 1",
		"-1 ch utility free_customer_service US 1 0")

	// a third: delivered comes first; its late sent (lower rank) says otherwise, and is from
	// the day before: the pricing stays delivered's, the day becomes sent's
	e.post(t, e.pnid, []string{priced("wamid.U3", "delivered", daysAgo(1), us, pricing("authentication", "regular", true))}, nil)
	e.post(t, e.pnid, []string{priced("wamid.U3", "sent", daysAgo(2), us, mkt)}, nil)
	expectUsage(t, "late sent", e.usageOf(t, e.org),
		"-2 ch authentication regular US 1 1",
		"-2 ch marketing regular US 1 1",
		"-1 ch utility free_customer_service US 1 0")

	// in one post: sent and delivered of a new message, with different pricing: delivered wins,
	// on sent's day; a status with no pricing, or whose message is another channel's, counts nothing
	other, otherPN := e.channel(t, e.org)
	e.post(t, otherPN, []string{priced("wamid.U4", "delivered", daysAgo(1), "442079460958", pricing("marketing", "regular", true))}, nil)
	e.post(t, e.pnid, []string{
		priced("wamid.U5", "sent", daysAgo(1), us, mkt),
		priced("wamid.U5", "delivered", daysAgo(0), us, pricing("utility", "regular", true)),
		status("wamid.U6", "sent", daysAgo(0).Unix(), us),
		priced("wamid.U4", "sent", daysAgo(0), us, mkt), // U4 is the other channel's message
	}, nil)
	got := e.usageOf(t, e.org)
	expectUsage(t, "one post", got,
		"-2 ch authentication regular US 1 1",
		"-2 ch marketing regular US 1 1",
		"-1 ch utility free_customer_service US 1 0",
		"-1 ch utility regular US 1 1",
		"-1 "+other.ID.String()+" marketing regular GB 1 1")
	// (rows ordered by day, then channel id: the other channel is newer, a greater UUIDv7)
	if !slices.IsSorted([]string{e.ch.ID.String(), other.ID.String()}) {
		t.Fatal("channel ids out of order")
	}
}

// TestUsageOddPricing: pricing objects of odd shapes never fail intake and are counted under
// their verbatim values ("unknown" for what is missing); a pricing that is not an object, or
// null, is no pricing; the day of a garbage timestamp is the arrival's.
func TestUsageOddPricing(t *testing.T) {
	e := newTimelineEnv(t)
	now := time.Now().UTC()
	long := strings.Repeat("é", 40) // 80 bytes: cut at 64
	res := e.post(t, e.pnid, []string{
		priced("wamid.O1", "sent", now, "12127365000", `{}`),
		priced("wamid.O2", "sent", now, "12127365000", `{"category":7,"type":null,"billable":"true","pricing_model":["x"]}`),
		priced("wamid.O3", "sent", now, "", `{"category":"","type":{"a":1},"billable":1}`),
		priced("wamid.O4", "sent", now, "not a number", `{"category":"marketing_lite","type":"free_entry_point","billable":true}`),
		priced("wamid.O5", "sent", now, "12127365000", `"marketing"`),
		priced("wamid.O6", "sent", now, "12127365000", `null`),
		priced("wamid.O7", "sent", now, "12127365000", `[1,2]`),
		priced("wamid.O8", "sent", now, "12127365000", `{"category":"\u0000x","type":"`+long+`"}`),
		`{"id":"wamid.O9","status":"sent","timestamp":"yesterday","recipient_id":"5511987654321","pricing":{"category":"utility","type":"regular","billable":true}}`,
		`{"id":"wamid.O10","status":"sent","timestamp":"99999999999","recipient_id":"5511987654321","pricing":{"category":"utility","type":"regular","billable":true}}`,
	}, nil)
	if res.Events != 10 {
		t.Fatalf("stored %+v", res)
	}
	cut := strings.Repeat("é", 32)
	expectUsage(t, "odd pricing", e.usageOf(t, e.org),
		"-0 ch 7 unknown US 1 1",
		"-0 ch marketing_lite free_entry_point ZZ 1 1",
		"-0 ch unknown unknown US 1 0",
		"-0 ch unknown unknown ZZ 1 0",
		"-0 ch unknown "+cut+" US 1 0", // (bytewise: "u" before "é")
		"-0 ch utility regular BR 2 2")
}

// TestUsageFold: folding the deltas into the daily rollup keeps every total; later moves are
// deltas against folded counts; the rollup outlives the messages' retention.
func TestUsageFold(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	mkt := pricing("marketing", "regular", true)
	for i := range 5 {
		e.post(t, e.pnid, []string{priced(fmt.Sprintf("wamid.F%d", i), "sent", daysAgo(i%2), "919876543210", mkt)}, nil)
	}
	e.post(t, e.pnid, []string{priced("wamid.F0", "delivered", daysAgo(0), "919876543210", pricing("utility", "regular", true))}, nil)
	before := e.usageOf(t, e.org)
	expectUsage(t, "before", before,
		"-1 ch marketing regular IN 2 2",
		"-0 ch marketing regular IN 2 2",
		"-0 ch utility regular IN 1 1")
	n, err := e.f.Store.FoldUsage(ctx)
	if err != nil || n != 7 { // five +1, and F0's move: -1, +1
		t.Fatalf("fold: %d %v", n, err)
	}
	var deltas int
	if err := e.f.Pool.QueryRow(ctx, `SELECT count(*) FROM usage_deltas`).Scan(&deltas); err != nil || deltas != 0 {
		t.Fatalf("%d deltas left (%v)", deltas, err)
	}
	expectUsage(t, "after the fold", e.usageOf(t, e.org), before...)
	if n, err := e.f.Store.FoldUsage(ctx); err != nil || n != 0 {
		t.Fatalf("second fold: %d %v", n, err)
	}

	// a move after the fold: -1 from a folded bucket, +1 to a new one
	e.post(t, e.pnid, []string{priced("wamid.F1", "delivered", daysAgo(1), "919876543210", pricing("service", "free_customer_service", false))}, nil)
	moved := []string{
		"-1 ch marketing regular IN 1 1",
		"-1 ch service free_customer_service IN 1 0",
		"-0 ch marketing regular IN 2 2",
		"-0 ch utility regular IN 1 1"}
	expectUsage(t, "moved after the fold", e.usageOf(t, e.org), moved...)
	e.f.Store.Maintain(ctx, store.RetentionPolicy{}, nil) // the maintenance loop folds
	if err := e.f.Pool.QueryRow(ctx, `SELECT count(*) FROM usage_deltas`).Scan(&deltas); err != nil || deltas != 0 {
		t.Fatalf("after Maintain: %d deltas left (%v)", deltas, err)
	}
	expectUsage(t, "folded again", e.usageOf(t, e.org), moved...)

	// the retention deletes the messages; the usage stays
	if n, err := e.f.Store.PruneMessages(ctx, time.Now().Add(time.Hour)); err != nil || n != 5 {
		t.Fatalf("prune: %d %v", n, err)
	}
	expectUsage(t, "after the retention", e.usageOf(t, e.org), moved...)
	// another org sees none of it
	if got := e.usageOf(t, e.f.Org(t).ID); len(got) != 0 {
		t.Fatalf("another org: %v", got)
	}
}
