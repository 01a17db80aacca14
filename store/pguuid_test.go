package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestUUIDCodec: on a pool configured by store.ConfigurePool (as every pool of the product and
// of testenv), ids go to Postgres and back as binary uuids — not through uuid.UUID's string
// form — with the values, NULLs and arrays they had before.
func TestUUIDCodec(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	a, b := uuid.New(), uuid.Must(uuid.NewV7())

	var one, null uuid.UUID
	var nullPtr, ptr *uuid.UUID
	var arr []uuid.UUID
	var text string
	null = a // a NULL leaves it as it was (as through uuid.UUID's sql.Scanner)
	if err := f.Pool.QueryRow(ctx, `SELECT $1::uuid, NULL::uuid, NULL::uuid, $1::uuid, $2::uuid[], ($2::uuid[])[2]::text`,
		a, []uuid.UUID{a, b}).Scan(&one, &null, &nullPtr, &ptr, &arr, &text); err != nil {
		t.Fatal(err)
	}
	if one != a || null != a || nullPtr != nil || ptr == nil || *ptr != a ||
		len(arr) != 2 || arr[0] != a || arr[1] != b || text != b.String() {
		t.Fatalf("got %v %v %v %v %v %q, want %v %v nil &%v [%v %v] %q", one, null, nullPtr, ptr, arr, text, a, a, a, a, b, b.String())
	}
	var isNull bool
	if err := f.Pool.QueryRow(ctx, `SELECT $1::uuid IS NULL`, (*uuid.UUID)(nil)).Scan(&isNull); err != nil || !isNull {
		t.Fatalf("a nil *uuid.UUID: null %v, %v", isNull, err)
	}

	// The plans pgx picks for them: not uuid.UUID's driver.Valuer (a string per id).
	conn, err := f.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	m := conn.Conn().TypeMap()
	plans := func(m *pgtype.Map) (encode, scan string) {
		return fmt.Sprintf("%T", m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, a)),
			fmt.Sprintf("%T", m.PlanScan(pgtype.UUIDOID, pgtype.BinaryFormatCode, &one))
	}
	if encode, scan := plans(m); strings.Contains(encode, "DriverValuer") || strings.Contains(scan, "SQLScanner") {
		t.Errorf("uuid.UUID encodes with %s, scans with %s", encode, scan)
	}
	// A connection without it takes the string paths (else the check above shows nothing).
	plain, err := pgx.Connect(ctx, f.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plain.Close(ctx) }()
	if encode, scan := plans(plain.TypeMap()); !strings.Contains(encode, "DriverValuer") || !strings.Contains(scan, "SQLScanner") {
		t.Fatalf("without store.ConfigurePool, uuid.UUID encodes with %s, scans with %s: the check shows nothing", encode, scan)
	}
}
