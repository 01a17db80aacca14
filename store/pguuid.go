package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ConfigurePool prepares the config of a pool that a Store (or a Queue) will use: ids
// (uuid.UUID, and slices of them) are encoded and scanned as Postgres's binary uuid directly.
// Without it pgx goes through uuid.UUID's driver.Valuer and sql.Scanner, a string per id
// formatted and parsed again: with the intake's and the claims' arrays of ids, a large share of
// Caddy's CPU under load (bench/README.md, "Figures behind the defaults (inbound, delivery)").
// Every pool the product opens goes through it.
func ConfigurePool(cfg *pgxpool.Config) {
	next := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		RegisterUUID(conn.TypeMap())
		if next != nil {
			return next(ctx, conn)
		}
		return nil
	}
}

// RegisterUUID makes m encode uuid.UUID as a Postgres uuid in binary and scan a uuid into
// *uuid.UUID (alone or in a slice) directly: its codec for uuid (and uuid[]'s elements) takes
// them before pgx looks for their driver.Valuer and sql.Scanner. A NULL scanned into a
// uuid.UUID leaves it as it was, as uuid.UUID's Scan does (TestUUIDCodec).
func RegisterUUID(m *pgtype.Map) {
	t := &pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}}
	m.RegisterType(t)
	m.RegisterType(&pgtype.Type{Name: "_uuid", OID: pgtype.UUIDArrayOID, Codec: &pgtype.ArrayCodec{ElementType: t}})
	m.RegisterDefaultPgType(uuid.UUID{}, "uuid")
	m.RegisterDefaultPgType([]uuid.UUID{}, "_uuid")
}

// uuidCodec is pgtype.UUIDCodec that also takes uuid.UUID values and *uuid.UUID targets.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(uuid.UUID); ok {
		if next := c.UUIDCodec.PlanEncode(m, oid, format, uuidValue{}); next != nil {
			return &encodeUUIDPlan{next: next}
		}
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

func (c uuidCodec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if _, ok := target.(*uuid.UUID); ok {
		if next := c.UUIDCodec.PlanScan(m, oid, format, (*uuidValue)(nil)); next != nil {
			return &scanUUIDPlan{next: next}
		}
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

// uuidValue is uuid.UUID as pgtype's UUIDValuer and UUIDScanner.
type uuidValue uuid.UUID

func (u uuidValue) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: u, Valid: true}, nil }

func (u *uuidValue) ScanUUID(v pgtype.UUID) error {
	if v.Valid {
		*u = uuidValue(v.Bytes)
	}
	return nil
}

type encodeUUIDPlan struct{ next pgtype.EncodePlan }

func (p *encodeUUIDPlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode(uuidValue(value.(uuid.UUID)), buf)
}

type scanUUIDPlan struct{ next pgtype.ScanPlan }

func (p *scanUUIDPlan) Scan(src []byte, dst any) error {
	return p.next.Scan(src, (*uuidValue)(dst.(*uuid.UUID)))
}

var (
	_ pgtype.Codec       = uuidCodec{}
	_ pgtype.UUIDValuer  = uuidValue{}
	_ pgtype.UUIDScanner = (*uuidValue)(nil)
)
