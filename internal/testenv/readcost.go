package testenv

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/store"
)

// ReadCost measures the work of reads as a count, not a time: it runs read with a store on the
// database dsn whose pool records every statement it runs (queries, and batches as one unit),
// then runs each recorded statement again, with the same arguments, under EXPLAIN (ANALYZE,
// FORMAT JSON) — a batch's statements in one transaction, in order, so that a guard's settings
// (set_config(…, true)) hold for the statement after it as they did —, in transactions that are
// rolled back, and returns the rows the plans read from each table — kept or filtered out, times
// the loops, a partition (<table>_pYYYYMMDD) counted under its table — summed over the
// statements. Only reads are recorded (statements starting with SELECT or WITH). The store's
// read functions (store.ListMessages, store.SendsPerMinute, …) are what the API's and the
// dashboard's handlers call, so this is the work of the requests that call them.
func ReadCost(t testing.TB, dsn string, read func(s *store.Store)) map[string]float64 {
	t.Helper()
	rec := &statementRecorder{}
	f := NewStore(t, &StoreOpts{DSN: dsn, Pool: func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = rec }})
	read(f.Store)
	rec.mu.Lock()
	units := rec.units
	rec.mu.Unlock()
	ctx := context.Background()
	cost := map[string]float64{}
	for _, unit := range units {
		tx, err := f.Pool.Begin(ctx)
		if err != nil {
			t.Fatalf("testenv: read cost: %v", err)
		}
		for _, st := range unit.stmts {
			head := strings.ToUpper(strings.TrimSpace(st.sql))
			if !strings.HasPrefix(head, "SELECT") && !strings.HasPrefix(head, "WITH") {
				continue
			}
			var plan []byte
			if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+st.sql, st.args...).Scan(&plan); err != nil {
				tx.Rollback(ctx)
				t.Fatalf("testenv: read cost: explain %s: %v", st.sql, err)
			}
			if os.Getenv("WABARELAY_READCOST_PLANS") != "" { // (to see the plans: -v with this set)
				t.Logf("read cost: %s\n%s", st.sql, plan)
			}
			var p []struct{ Plan explainNode }
			if err := json.Unmarshal(plan, &p); err != nil || len(p) != 1 {
				tx.Rollback(ctx)
				t.Fatalf("testenv: read cost: plan %s: %v", plan, err)
			}
			p[0].Plan.tableRows(cost)
		}
		tx.Rollback(ctx)
	}
	return cost
}

// statementRecorder is a pgx tracer keeping the statements a pool runs, with their arguments
// (the query options pgx takes among them left out): a query as a unit of its own, a batch's
// queries as one unit.
type statementRecorder struct {
	mu    sync.Mutex
	units []*recordedUnit
}

type recordedUnit struct{ stmts []recordedStatement }

type recordedStatement struct {
	sql  string
	args []any
}

type unitKey struct{}

func (r *statementRecorder) add(u *recordedUnit, sql string, args []any) {
	for len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryRewriter:
			args = args[1:]
			continue
		}
		break
	}
	r.mu.Lock()
	if u == nil {
		u = &recordedUnit{}
		r.units = append(r.units, u)
	}
	u.stmts = append(u.stmts, recordedStatement{sql, args})
	r.mu.Unlock()
}

func (r *statementRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(nil, d.SQL, d.Args)
	return ctx
}

func (r *statementRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *statementRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	u := &recordedUnit{}
	r.mu.Lock()
	r.units = append(r.units, u)
	r.mu.Unlock()
	return context.WithValue(ctx, unitKey{}, u)
}

func (r *statementRecorder) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	u, _ := ctx.Value(unitKey{}).(*recordedUnit)
	r.add(u, d.SQL, d.Args)
}

func (r *statementRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// explainNode is a node of an EXPLAIN (ANALYZE, FORMAT JSON) plan.
type explainNode struct {
	Type      string        `json:"Node Type"`
	Relation  string        `json:"Relation Name"`
	Rows      float64       `json:"Actual Rows"`
	Loops     float64       `json:"Actual Loops"`
	Filtered  float64       `json:"Rows Removed by Filter"`
	Rechecked float64       `json:"Rows Removed by Index Recheck"`
	Plans     []explainNode `json:"Plans"`
}

var partitionSuffix = regexp.MustCompile(`_p\d{8}$`)

// tableRows adds the rows the plan read from tables and indexes (kept or filtered out, times the
// loops) to into, by table.
func (n explainNode) tableRows(into map[string]float64) {
	switch n.Type {
	case "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan":
		into[partitionSuffix.ReplaceAllString(n.Relation, "")] += (n.Rows + n.Filtered + n.Rechecked) * n.Loops
	}
	for _, c := range n.Plans {
		c.tableRows(into)
	}
}
