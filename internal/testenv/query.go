package testenv

import (
	"context"
	"testing"
)

// Exec runs a statement on the fixture's database (a test's direct change to rows: a channel
// made active, a key expired), failing the test on an error.
func (f *Fixture) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := f.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
}

// Count returns how many rows table holds.
func (f *Fixture) Count(t testing.TB, table string) int {
	t.Helper()
	return QueryValue[int](t, f, "SELECT count(*) FROM "+table)
}

// CountWhere returns how many rows of table have value in column.
func (f *Fixture) CountWhere(t testing.TB, table, column string, value any) int {
	t.Helper()
	return QueryValue[int](t, f, "SELECT count(*) FROM "+table+" WHERE "+column+" = $1", value)
}

// QueryValue runs a query of one row and one column on the fixture's database and returns the
// value, failing the test on an error (no row included).
func QueryValue[T any](t testing.TB, f *Fixture, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := f.Pool.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
	return v
}
