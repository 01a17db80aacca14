package store_test

import (
	"context"
	"testing"
	"time"

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

// TestMaintainCreatesPartitions: one round of maintenance makes the partitions ahead.
func TestMaintainCreatesPartitions(t *testing.T) {
	f := testenv.NewStore(t)
	s, pool := f.Store, f.Pool
	ctx := context.Background()
	s.Maintain(ctx, store.RetentionPolicy{}, nil)
	name := "events_p" + time.Now().UTC().AddDate(0, 0, store.PartitionsAhead).Format("20060102")
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil || !ok {
		t.Fatalf("partition %s after Maintain: %v %v", name, ok, err)
	}
}
