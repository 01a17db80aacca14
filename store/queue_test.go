package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	Type      string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Rows      float64    `json:"Actual Rows"`
	Loops     float64    `json:"Actual Loops"`
	Filtered  float64    `json:"Rows Removed by Filter"`
	Rechecked float64    `json:"Rows Removed by Index Recheck"`
	Hit       int        `json:"Shared Hit Blocks"`
	Read      int        `json:"Shared Read Blocks"`
	Plans     []planNode `json:"Plans"`
}

// tableRows returns the rows the plan read from tables and indexes (kept or filtered out, times
// the loops), by relation.
func (n planNode) tableRows(into map[string]float64) {
	switch n.Type {
	case "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan":
		into[n.Relation] += (n.Rows + n.Filtered + n.Rechecked) * n.Loops
	}
	for _, c := range n.Plans {
		c.tableRows(into)
	}
}

// claimCost runs claimSQL for c inside transactions that are rolled back and returns the rows
// it claimed per webhook, the rows it read from delivery_queue (kept or filtered out: the work
// of a claim, as a count rather than a time) and the shared buffers it touched.
func claimCost(t testing.TB, pool *pgxpool.Pool, c store.QueueClaim) (took map[uuid.UUID]int, queueRows float64, buffers int) {
	t.Helper()
	ctx := context.Background()
	args := store.ClaimArgs(c)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The plan the claim runs on: generic, under its guard (see store.QueryGeneric).
	if _, err := tx.Exec(ctx, store.PlanGuardSQL); err != nil {
		t.Fatal(err)
	}
	plan, _ := explainPrepared(t, tx, "claim", store.ClaimSQL, args, "ANALYZE, BUFFERS, FORMAT JSON")
	read := map[string]float64{}
	plan.tableRows(read)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The same claim for real, rolled back too, for what it takes.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rows, err := store.QueryGeneric(ctx, tx, store.ClaimSQL, args...)
	if err != nil {
		t.Fatal(err)
	}
	took = map[uuid.UUID]int{}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		took[uuid.UUID(vals[2].([16]byte))]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return took, read["delivery_queue"], plan.Hit + plan.Read
}

// queueDue queues n deliveries of org's webhook w with status st, due a minute ago, with their
// events, straight into the tables (faster than storing events by the thousand).
func queueDue(t *testing.T, pool *pgxpool.Pool, org, w uuid.UUID, n int, st string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `
		WITH e AS (
			INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at)
			SELECT gen_random_uuid(), $1, gen_random_uuid(), 'messages', 'k', '{}', now() FROM generate_series(1, $3)
			RETURNING id, created_at
		), d AS (
			INSERT INTO deliveries (id, event_id, webhook_id, created_at)
			SELECT gen_random_uuid(), e.id, $2, e.created_at FROM e RETURNING id, event_id, created_at
		)
		INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status, next_attempt_at)
		SELECT d.id, d.created_at, d.event_id, $2, $4, now() - interval '1 minute' FROM d`, org, w, n, st); err != nil {
		t.Fatal(err)
	}
}

// TestClaimNeverScansOtherBacklogs: beside a paused webhook holding 50,000 deliveries and a slow
// webhook at its per-webhook cap on this instance with 20,000 due ones, a claim for a healthy
// webhook reads (kept or filtered out) a few queue rows per row it takes and per webhook, not
// their backlogs: held rows are not in the claims' index, and a webhook at its cap is skipped,
// not scanned. (Its buffers grow only with the indexes' depth.)
func TestClaimNeverScansOtherBacklogs(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	s, pool := f.Store, f.Pool
	org := f.Org(t)
	hook := func(name string) uuid.UUID {
		w, _ := f.Webhook(t, org.ID, "https://"+name+".example.com", &testenv.WebhookOpts{Name: name})
		return w.ID
	}
	healthy, slow, paused := hook("healthy"), hook("slow"), hook("paused")
	if _, err := s.SetWebhookStatus(ctx, org.ID, paused, store.WebhookPaused); err != nil {
		t.Fatal(err)
	}
	queue := func(w uuid.UUID, n int, st string) { queueDue(t, pool, org.ID, w, n, st) }
	queue(healthy, 200, "pending")
	claim := store.QueueClaim{Instance: "i", Lease: time.Minute, Limit: 50, PerWebhook: 16, Busy: map[uuid.UUID]int{slow: 16}}
	analyze := func() {
		if _, err := pool.Exec(ctx, `ANALYZE delivery_queue`); err != nil {
			t.Fatal(err)
		}
	}
	analyze()
	took, base, baseBuf := claimCost(t, pool, claim)
	if took[healthy] != 16 || len(took) != 1 {
		t.Fatalf("baseline claim took %v, want 16 (its per-webhook cap) of the healthy webhook only", took)
	}

	queue(paused, 50000, "held")
	queue(slow, 20000, "pending")
	analyze()
	took, loaded, loadedBuf := claimCost(t, pool, claim)
	if took[healthy] != 16 || len(took) != 1 {
		t.Fatalf("claim beside the backlogs took %v, want 16 of the healthy webhook only", took)
	}
	t.Logf("claim: %.0f queue rows read and %d buffers alone, %.0f rows and %d buffers beside 50,000 held and 20,000 capped deliveries",
		base, baseBuf, loaded, loadedBuf)
	// Each row taken is read about twice (the due index, then the update by primary key), plus
	// a probe or two per webhook with pending rows; scanning the slow webhook's backlog alone
	// would read 20,000.
	if taken := float64(took[healthy]); loaded > 3*taken+10 {
		t.Fatalf("claim read %.0f queue rows to take %.0f beside other webhooks' backlogs (%.0f alone): it scans them", loaded, taken, base)
	}

	// The slow webhook below its cap is served too, in turn with the healthy one.
	claim.Busy = map[uuid.UUID]int{slow: 14}
	took, _, _ = claimCost(t, pool, claim)
	if took[healthy] != 16 || took[slow] != 2 {
		t.Fatalf("claim with 2 free slots for the slow webhook took %v", took)
	}
}

// TestClaimSharesPerOrgFirst: a claim gives each org with due work an equal share, however many
// webhooks it has, and splits an org's share across its webhooks round robin (the org's cursor
// moves on from claim to claim); an org at its per-org cap on this instance gets nothing, and
// the claim still reads no webhook's backlog beyond what it takes.
func TestClaimSharesPerOrgFirst(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	pool := f.Pool
	orgA, orgB := f.Org(t, &testenv.OrgOpts{Name: "a"}), f.Org(t, &testenv.OrgOpts{Name: "b"})
	hook := func(org uuid.UUID, name string) uuid.UUID {
		w, _ := f.Webhook(t, org, "https://"+name+".example.com", &testenv.WebhookOpts{Name: name})
		return w.ID
	}
	queue := func(org, w uuid.UUID, n int) { queueDue(t, pool, org, w, n, "pending") }
	a := hook(orgA.ID, "a")
	queue(orgA.ID, a, 2000)
	bHooks := map[uuid.UUID]bool{}
	for i := range 60 {
		h := hook(orgB.ID, "b"+string(rune('a'+i/26))+string(rune('a'+i%26)))
		bHooks[h] = true
		queue(orgB.ID, h, 50)
	}
	if _, err := pool.Exec(ctx, `ANALYZE delivery_queue`); err != nil {
		t.Fatal(err)
	}

	c := store.QueueClaim{Instance: "i", Lease: time.Minute, Limit: 20, PerWebhook: 64, PerOrg: 128}
	took, rows, _ := claimCost(t, pool, c)
	fromB := 0
	for h, n := range took {
		if bHooks[h] {
			fromB += n
			if n != 1 {
				t.Errorf("B's webhook %v got %d of B's share of 10 (60 webhooks: one each)", h, n)
			}
		}
	}
	if took[a] != 10 || fromB != 10 {
		t.Fatalf("claim of 20 took %d for org A (1 webhook) and %d for org B (60 webhooks), want 10 and 10", took[a], fromB)
	}
	// two probes per webhook with pending rows, about two reads per row taken
	t.Logf("claim of 20 beside 61 webhooks with pending rows: %.0f queue rows read", rows)
	if rows > 2*61+3*20+10 {
		t.Fatalf("claim read %.0f queue rows to take 20 beside 61 webhooks' backlogs", rows)
	}

	// Round robin within B: successive claims serve B's webhooks in turn, each once before any
	// twice.
	q := store.NewQueue(pool)
	seen := map[uuid.UUID]int{}
	for range 6 {
		got, err := q.Claim(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		c.After = got.Next
		for _, d := range got.Deliveries {
			if d.OrgID == orgB.ID {
				seen[d.WebhookID]++
			} else if d.OrgID != orgA.ID || d.WebhookID != a {
				t.Fatalf("claimed delivery %+v of neither org", d)
			}
		}
	}
	if len(seen) != 60 {
		t.Fatalf("6 claims of 10 for B served %d of its 60 webhooks, want each once: %v", len(seen), seen)
	}

	// B at its per-org cap: all of the claim goes to A.
	c.BusyOrgs = map[uuid.UUID]int{orgB.ID: 128}
	took, _, _ = claimCost(t, pool, c)
	if took[a] != 20 || len(took) != 1 {
		t.Fatalf("with org B at its cap, the claim took %v, want 20 of A's webhook", took)
	}
}
