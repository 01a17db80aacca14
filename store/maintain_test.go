package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestRetentionPolicy(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		p               store.RetentionPolicy
		retention, hold time.Duration
		err             string
	}{
		{store.RetentionPolicy{}, 30 * day, 7 * day, ""},
		{store.RetentionPolicy{Retention: 7 * day}, 7 * day, 6 * day, ""},
		{store.RetentionPolicy{Retention: 7 * day, MaxHold: day}, 7 * day, day, ""},
		{store.RetentionPolicy{MaxHold: 30 * day}, 30 * day, 0, "max_hold must be shorter than retention"},
		{store.RetentionPolicy{Retention: 6 * day}, 6 * day, 5 * day, "retention must be at least 168h"},
	} {
		r, h := tc.p.Effective()
		err := tc.p.Check()
		if r != tc.retention || h != tc.hold || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("%+v: %v, %v, %v; want %v, %v, %q", tc.p, r, h, err, tc.retention, tc.hold, tc.err)
		}
	}
}

// TestMaintainCreatesPartitions: a round of maintenance makes the partitions from the day before
// the store's clock through PartitionsAhead days after it (and no more), whatever the real date.
func TestMaintainCreatesPartitions(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	later := time.Now().UTC().AddDate(0, 0, 40)
	f.Store.SetClock(clock.NewStub(later))
	exists := func(table string, d time.Time) bool {
		t.Helper()
		return testenv.QueryValue[bool](t, f, `SELECT to_regclass($1) IS NOT NULL`, table+"_p"+d.Format("20060102"))
	}
	for _, table := range []string{"events", "deliveries", "delivery_attempts"} {
		if exists(table, later) {
			t.Fatalf("%s has a partition 40 days ahead before the maintenance", table)
		}
	}
	f.Store.Maintain(ctx, store.RetentionPolicy{}, nil)
	for _, table := range []string{"events", "deliveries", "delivery_attempts"} {
		for k := -1; k <= store.PartitionsAhead; k++ {
			if !exists(table, later.AddDate(0, 0, k)) {
				t.Fatalf("%s has no partition for the clock's day %+d after the maintenance", table, k)
			}
		}
		if exists(table, later.AddDate(0, 0, store.PartitionsAhead+1)) || exists(table, later.AddDate(0, 0, -2)) {
			t.Fatalf("%s has partitions beyond the clock's days", table)
		}
	}
}

// TestMaintainRetentionByTheClock: a round of maintenance decides by the store's clock: a
// paused webhook's held delivery fails once it is older than max_hold, and not a moment before;
// a day's partitions are dropped once the day ended the retention ago (its delivery having
// finished), and not a moment before.
func TestMaintainRetentionByTheClock(t *testing.T) {
	ctx := context.Background()
	f, org := storeWithChannel(t)
	s := f.Store
	w, _ := f.Webhook(t, org.ID, "https://h.example.com")
	clk := clock.NewStub(time.Now())
	s.SetClock(clk)
	policy := store.RetentionPolicy{Retention: 8 * 24 * time.Hour, MaxHold: 2 * 24 * time.Hour}
	if _, err := s.SetWebhookStatus(ctx, org.ID, w.ID, store.WebhookPaused); err != nil {
		t.Fatal(err)
	}
	t0 := clk.Now()
	if res, err := s.StoreEvents(ctx, []store.IncomingItem{{Type: "messages", PhoneNumberID: "1", DedupeKey: "m:held",
		Data: json.RawMessage(`{}`)}}, store.Claim{}); err != nil || res.Deliveries != 1 {
		t.Fatalf("stored %+v, %v", res, err)
	}
	status := func() (queued int, log string) {
		t.Helper()
		queued = testenv.QueryValue[int](t, f, `SELECT count(*) FROM delivery_queue WHERE status = 'held'`)
		log = testenv.QueryValue[string](t, f, `SELECT status FROM deliveries`)
		return queued, log
	}

	clk.Set(t0.Add(policy.MaxHold))
	s.Maintain(ctx, policy, nil)
	if held, log := status(); held != 1 || log != "pending" {
		t.Fatalf("at max_hold: %d held, log %s; want it held still", held, log)
	}
	clk.Advance(time.Microsecond)
	s.Maintain(ctx, policy, nil)
	if held, log := status(); held != 0 || log != "failed" {
		t.Fatalf("past max_hold: %d held, log %s; want it failed", held, log)
	}
	if at := testenv.QueryValue[time.Time](t, f, `SELECT updated_at FROM deliveries`); !at.Equal(clk.Now()) {
		t.Fatalf("failed at %v, want the clock's %v", at, clk.Now())
	}

	day := t0.UTC().Truncate(24 * time.Hour)
	partition := "events_p" + day.Format("20060102")
	exists := func() bool {
		t.Helper()
		return testenv.QueryValue[bool](t, f, `SELECT to_regclass($1) IS NOT NULL`, partition)
	}
	gone := day.AddDate(0, 0, 1).Add(policy.Retention) // the day ended the retention ago
	clk.Set(gone.Add(-time.Microsecond))
	s.Maintain(ctx, policy, nil)
	if !exists() {
		t.Fatalf("%s dropped before its day ended the retention ago", partition)
	}
	clk.Set(gone)
	s.Maintain(ctx, policy, nil)
	if exists() {
		t.Fatalf("%s kept once its day ended the retention ago", partition)
	}
	if n := f.Count(t, "deliveries"); n != 0 {
		t.Fatalf("%d deliveries left, want none", n)
	}
}
