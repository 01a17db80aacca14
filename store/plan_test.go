package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// planNodes returns every node of a plan (EXPLAIN FORMAT JSON), depth first.
func planNodes(n planNode, into []planNode) []planNode {
	into = append(into, n)
	for _, c := range n.Plans {
		into = planNodes(c, into)
	}
	return into
}

// explainPrepared prepares sql as name in tx, explains its execution (EXPLAIN (options)
// EXECUTE) under the settings in effect and returns the plan and how many generic plans the
// statement has had, then deallocates it. args are the parameters, given to EXECUTE as
// literals (a utility statement takes no protocol parameters); nil: every parameter NULL, for
// a generic plan, which does not look at them.
func explainPrepared(t testing.TB, tx pgx.Tx, name, sql string, args []any, options string) (planNode, int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
		t.Fatalf("prepare %s: %v", name, err)
	}
	var types []string
	if err := tx.QueryRow(ctx, `SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = $1`, name).Scan(&types); err != nil {
		t.Fatal(err)
	}
	lits := make([]string, len(types))
	for i, typ := range types {
		lits[i] = "NULL"
		if args != nil {
			if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT coalesce(quote_literal($1::%s::text) || '::%[1]s', 'NULL')", typ), args[i]).Scan(&lits[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	var plan []byte
	if err := tx.QueryRow(ctx, fmt.Sprintf("EXPLAIN (%s) EXECUTE %s(%s)", options, name, strings.Join(lits, ", "))).Scan(&plan); err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	var p []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &p); err != nil || len(p) != 1 {
		t.Fatalf("plan %s: %v", plan, err)
	}
	var generic int64
	if err := tx.QueryRow(ctx, `SELECT generic_plans FROM pg_prepared_statements WHERE name = $1`, name).Scan(&generic); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "DEALLOCATE "+name); err != nil {
		t.Fatal(err)
	}
	return p[0].Plan, generic
}

// TestGenericPlansCannotDegrade: the statements run on generic plans (the claims, the health
// sums, the completions, the intake's deliveries) are planned, under the guard they run with,
// as generic plans without a sequential or bitmap scan or a hash or merge join, even on empty
// tables that were never analysed — where, without the guard, their generic plans read and
// hash tables whole for as long as the connection keeps them.
func TestGenericPlansCannotDegrade(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	tx, err := f.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, store.PlanGuardSQL); err != nil {
		t.Fatal(err)
	}
	i := 0
	for name, sql := range store.GenericStatements {
		i++
		plan, generic := explainPrepared(t, tx, fmt.Sprintf("guarded_%d", i), sql, nil, "FORMAT JSON")
		if generic < 1 {
			t.Errorf("%s: not planned as a generic plan under the guard", name)
		}
		for _, n := range planNodes(plan, nil) {
			switch n.Type {
			case "Seq Scan", "Bitmap Heap Scan", "Hash Join", "Merge Join":
				t.Errorf("%s: its generic plan on empty tables has a %s (%s)", name, n.Type, n.Relation)
			}
		}
	}

	// Without the guard's scan and join settings, the same statements planned generic on the
	// same empty tables read tables sequentially and hash them: what the guard prevents.
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = on; SET LOCAL enable_bitmapscan = on; SET LOCAL enable_hashjoin = on; SET LOCAL enable_mergejoin = on`); err != nil {
		t.Fatal(err)
	}
	unguarded := 0
	for name, sql := range store.GenericStatements {
		i++
		plan, _ := explainPrepared(t, tx, fmt.Sprintf("unguarded_%d", i), sql, nil, "FORMAT JSON")
		for _, n := range planNodes(plan, nil) {
			if n.Type == "Seq Scan" || n.Type == "Hash Join" {
				t.Logf("unguarded, %s has a %s (%s)", name, n.Type, n.Relation)
				unguarded++
			}
		}
	}
	if unguarded == 0 {
		t.Fatal("without the guard's settings no generic plan has a sequential scan or a hash join: the test shows nothing")
	}
}

// TestQueryGenericGuardEndsWithItsStatement: the guard's settings hold for the statement run by
// queryGeneric and end with its implicit transaction — the connection's next statement runs
// under the server's defaults —, whatever exec mode the connection string gives pgx (a
// transaction-mode pooler needs one without the statement cache).
func TestQueryGenericGuardEndsWithItsStatement(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.NewStore(t).DSN
	const show = `SELECT current_setting('plan_cache_mode') || ' ' || current_setting('enable_seqscan') || ' ' ||
		current_setting('enable_bitmapscan') || ' ' || current_setting('enable_hashjoin') || ' ' ||
		current_setting('enable_mergejoin')`
	for _, mode := range []string{"", "cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run("mode "+mode, func(t *testing.T) {
			f := testenv.NewStore(t, &testenv.StoreOpts{DSN: dsn, Pool: func(cfg *pgxpool.Config) {
				cfg.MaxConns = 1
				if mode != "" {
					cfg.ConnConfig.DefaultQueryExecMode = map[string]pgx.QueryExecMode{
						"cache_statement": pgx.QueryExecModeCacheStatement, "cache_describe": pgx.QueryExecModeCacheDescribe,
						"describe_exec": pgx.QueryExecModeDescribeExec, "exec": pgx.QueryExecModeExec,
						"simple_protocol": pgx.QueryExecModeSimpleProtocol,
					}[mode]
				}
			}})
			rows, err := store.QueryGeneric(ctx, f.Pool, show)
			if err != nil {
				t.Fatal(err)
			}
			var inside []string
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				inside = append(inside, s)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if len(inside) != 1 || inside[0] != "force_generic_plan off off off off" {
				t.Fatalf("settings inside queryGeneric: %q", inside)
			}
			var after string // (the pool's one connection)
			if err := f.Pool.QueryRow(ctx, show).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after != "auto on on on on" {
				t.Fatalf("settings after queryGeneric on the same connection: %q", after)
			}
		})
	}
}
