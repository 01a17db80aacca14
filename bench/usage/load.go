package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/usage"
)

// world is the generated data's handles.
type world struct {
	st       *store.Store
	pool     *pgxpool.Pool
	org      uuid.UUID
	key      string
	channels []uuid.UUID
}

// countries are the recipient countries, the most frequent first.
var countries = []string{"IN", "BR", "ID", "MX", "US", "NG", "DE", "GB", "ES", "IT", "AR", "CO", "TR", "ZA", "EG",
	"SA", "AE", "PK", "FR", "MY", "PE", "CL", "KE", "PH", "NL", "RU", "IL", "AU", "CA", "SG"}

// pairs are the pricing category and type pairs, with their share of the messages and whether
// they are billable.
const pairs = `
	SELECT * FROM unnest(
		ARRAY['marketing', 'utility', 'utility', 'service', 'authentication', 'authentication-international', 'marketing', 'marketing_lite'],
		ARRAY['regular', 'regular', 'free_customer_service', 'free_customer_service', 'regular', 'regular', 'free_entry_point', 'regular'],
		ARRAY[0.33, 0.20, 0.10, 0.22, 0.08, 0.02, 0.03, 0.02]::float8[],
		ARRAY[true, true, false, false, true, true, false, true]) AS p(category, ptype, w, billable)`

// seedSQL writes an org's rollup ($1 the org, $2 its channels, $3 its countries, $4 messages a
// month, $5 the first day, $6 the last, $7 the home country's share, $8 the Zipf exponent of
// the others): see the package comment for the spread.
const seedSQL = `
	WITH p AS (` + pairs + `
	), cc AS (
		SELECT country, j - 1 AS j, cardinality($3::text[]) AS nj FROM unnest($3::text[]) WITH ORDINALITY AS c(country, j)
	), ch AS (
		SELECT id, n, (1.0 / n ^ 0.8) / (SELECT sum(1.0 / g ^ 0.8) FROM generate_series(1, cardinality($2::uuid[])) g) AS w
		FROM unnest($2::uuid[]) WITH ORDINALITY AS c(id, n)
	), cw AS (
		SELECT ch.id, ch.w AS chw, cc.country,
		       CASE WHEN cc.j = (ch.n * 7) % cc.nj THEN $7::float8
		            ELSE (1 - $7::float8) * (1.0 / (((cc.j - (ch.n * 7) % cc.nj + cc.nj) % cc.nj) ^ $8::float8))
		                 / (SELECT sum(1.0 / r ^ $8::float8) FROM generate_series(1, cc.nj - 1) r) END AS w
		FROM ch, cc
	), d AS (
		SELECT day::date AS day, 0.7 + 0.6 * ((hashtext(day::text) & 1023) / 1023.0) AS f
		FROM generate_series($5::date, $6::date, interval '1 day') day
	)
	INSERT INTO usage_daily (org_id, day, channel_id, category, pricing_type, country, messages, billable)
	SELECT $1, d.day, cw.id, p.category, p.ptype, cw.country, x.m, CASE WHEN p.billable THEN x.m ELSE 0 END
	FROM d, cw, p, LATERAL (SELECT round($4::float8 / 30 * cw.chw * cw.w * p.w * d.f)::bigint AS m) x
	WHERE x.m > 0`

// fill generates the data (see the package comment).
func (w *world) fill(ctx context.Context, c config) error {
	start := time.Now()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	first := today.AddDate(0, -c.months, 0)
	nc := min(c.countries, len(countries))
	for o := range c.otherOrgs + 1 {
		org, err := w.st.CreateOrg(ctx, fmt.Sprint("bench ", o))
		if err != nil {
			return err
		}
		var chs []uuid.UUID
		for i := range c.channels {
			ch, err := w.st.CreateChannel(ctx, org.ID, fmt.Sprint("channel ", i), time.Hour)
			if err != nil {
				return err
			}
			chs = append(chs, ch.ID)
		}
		if o == 0 {
			w.org, w.channels = org.ID, chs
			if _, w.key, err = w.st.CreateAPIKey(ctx, org.ID, "bench", nil); err != nil {
				return err
			}
		}
		if _, err := w.pool.Exec(ctx, seedSQL, org.ID, chs, countries[:nc], c.messages, first, today, c.home, c.zipf); err != nil {
			return fmt.Errorf("rollup: %w", err)
		}
		benchkit.Logf("org %d: rollup written (%s)", o, time.Since(start).Round(time.Second))
	}
	// Deltas not folded yet: +1s into buckets of today and yesterday, and every tenth a move of
	// a message (-1 from one bucket, +1 to another).
	if _, err := w.pool.Exec(ctx, `
		WITH b AS (
			SELECT day, channel_id, category, pricing_type, country, row_number() OVER () AS i
			FROM (SELECT * FROM usage_daily WHERE org_id = $1 AND day >= $2::date - 1 ORDER BY random() LIMIT 2000) s
		), n AS (
			SELECT g, 1 + (g * 7919) % (SELECT count(*) FROM b) AS i, 1 + (g * 104729) % (SELECT count(*) FROM b) AS i2
			FROM generate_series(1, $3::int) g
		)
		INSERT INTO usage_deltas (org_id, day, channel_id, category, pricing_type, country, messages, billable)
		SELECT $1, b.day, b.channel_id, b.category, b.pricing_type, b.country, v.n, CASE WHEN b.pricing_type = 'regular' THEN v.n ELSE 0 END
		FROM n JOIN LATERAL (VALUES (n.i, 1), (CASE WHEN n.g % 10 = 0 THEN n.i2 END, -1)) AS v(i, n) ON v.i IS NOT NULL
		JOIN b ON b.i = v.i`, w.org, today, c.deltas); err != nil {
		return fmt.Errorf("deltas: %w", err)
	}
	// (autovacuum's work on a live database: the rollup's days before today are all-visible, so
	// that their reads are index-only scans)
	if _, err := w.pool.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		return err
	}
	// The fill's dirty pages written now, not by the checkpointer in the middle of the measured
	// runs (the last queries' p99 was seen doubled by it: 86 → 138 ms for the same CSV query).
	if _, err := w.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return err
	}
	var rows, month, msgs, deltas int64
	var size string
	if err := w.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_daily),
		(SELECT count(*) FROM usage_daily WHERE org_id = $1 AND day > $2::date - 30),
		(SELECT coalesce(sum(messages), 0) FROM usage_daily WHERE org_id = $1 AND day > $2::date - 30),
		(SELECT count(*) FROM usage_deltas), pg_size_pretty(pg_total_relation_size('usage_daily'))`, w.org, today).
		Scan(&rows, &month, &msgs, &deltas, &size); err != nil {
		return err
	}
	benchkit.Logf("filled in %s: usage_daily %d rows (%s), the measured org's last 30 days %d rows holding %d messages; usage_deltas %d rows",
		time.Since(start).Round(time.Second), rows, size, month, msgs, deltas)
	return nil
}

// query is one measured read.
type query struct {
	name string
	run  func(ctx context.Context) (rows int, err error)
}

// queries returns the measured reads.
func (w *world) queries(ctx context.Context, c config) ([]query, error) {
	var card *usage.RateCard
	if c.rateCard {
		var b strings.Builder
		b.WriteString("country,category,price\n")
		for i, cc := range countries {
			for j, cat := range []string{"marketing", "utility", "service", "authentication", "authentication-international", "marketing_lite"} {
				fmt.Fprintf(&b, "%s,%s,0.%04d\n", cc, cat, 10+(i*37+j*101)%900)
			}
		}
		var err error
		if card, err = usage.ParseRateCard(strings.NewReader(b.String())); err != nil {
			return nil, err
		}
	}
	h := managementapi.New(managementapi.Options{Store: w.st, RateCard: card})
	svc := h.Service()
	p := managementapi.Principal{Key: store.APIKey{OrgID: w.org}}
	today := time.Now().UTC()
	viaService := func(q managementapi.UsageQuery) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			u, err := svc.Usage(ctx, p, q)
			return len(u.Rows), err
		}
	}
	viaHTTP := func(path string) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			req := httptest.NewRequestWithContext(ctx, "GET", path, nil)
			req.Header.Set("X-Api-Key", w.key)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 200 {
				return 0, fmt.Errorf("%s: %d %s", path, rec.Code, benchkit.Cut(rec.Body.String(), 200))
			}
			return rec.Body.Len(), nil
		}
	}
	one := managementapi.UsageQuery{ChannelID: w.channels[0].String()}
	long := managementapi.UsageQuery{Since: today.AddDate(0, 0, -91).Format("2006-01-02")}
	return []query{
		{"service: org, 30 days", viaService(managementapi.UsageQuery{})},
		{"service: busiest channel, 30 days", viaService(one)},
		{"service: org, 92 days", viaService(long)},
		{"HTTP JSON: org, 30 days", viaHTTP("/usage")},
		{"HTTP CSV: org, 30 days", viaHTTP("/usage?format=csv")},
	}, nil
}

// measure runs each query runs times, one at a time, and prints p50, p99 and max.
func measure(ctx context.Context, qs []query, runs int) error {
	fmt.Printf("\n%-36s %10s %10s %10s %12s   (%d runs each)\n", "query", "p50 ms", "p99 ms", "max ms", "rows/bytes", runs)
	for _, q := range qs {
		if _, err := q.run(ctx); err != nil { // warm
			return fmt.Errorf("%s: %w", q.name, err)
		}
		d := make([]time.Duration, runs)
		var n int
		for i := range runs {
			start := time.Now()
			var err error
			if n, err = q.run(ctx); err != nil {
				return fmt.Errorf("%s: %w", q.name, err)
			}
			d[i] = time.Since(start)
		}
		slices.Sort(d)
		fmt.Printf("%-36s %10.3f %10.3f %10.3f %12d\n", q.name, benchkit.MS(d[runs/2]), benchkit.Quantile(d, 0.99), benchkit.MS(d[runs-1]), n)
	}
	return nil
}

// explain runs the org's query once more on a connection that logs its executed plan
// (auto_explain), and prints it.
func (w *world) explain(ctx context.Context, dsn string) error {
	pool, plans, err := benchkit.ExplainPool(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	now := time.Now().UTC()
	if _, err := store.New(pool, nil).Usage(ctx, w.org, store.UsageFilter{Since: now.AddDate(0, 0, -29), Until: now}); err != nil {
		return err
	}
	fmt.Printf("\n=== the org's 30 days: EXPLAIN (ANALYZE, BUFFERS)\n%s\n", strings.Join(plans(), "\n"))
	return nil
}
