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
// Without it pgx goes through uuid.UUID's driver.Valuer and sql.Scanner, a string per id formatted
// and parsed again: with the intake's and the claims' arrays of ids that was a sixth of Caddy's
// CPU at 5,000 events/s (bench/README.md "Issue 21: ids in binary"). Every pool the product
// opens goes through it.
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
// *uuid.UUID, in front of the driver.Valuer and sql.Scanner paths pgx takes otherwise. A NULL
// scanned into a uuid.UUID leaves it as it was, as before (TestUUIDCodec).
func RegisterUUID(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapUUIDEncodePlan}, m.TryWrapEncodePlanFuncs...)
	m.TryWrapScanPlanFuncs = append([]pgtype.TryWrapScanPlanFunc{tryWrapUUIDScanPlan}, m.TryWrapScanPlanFuncs...)
	m.RegisterDefaultPgType(uuid.UUID{}, "uuid")
	m.RegisterDefaultPgType([]uuid.UUID{}, "_uuid")
}

// uuidValue is uuid.UUID as pgtype's UUIDValuer and UUIDScanner.
type uuidValue uuid.UUID

func (u uuidValue) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: u, Valid: true}, nil }

func (u *uuidValue) ScanUUID(v pgtype.UUID) error {
	*u = uuidValue(v.Bytes)
	return nil
}

func tryWrapUUIDEncodePlan(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if v, ok := value.(uuid.UUID); ok {
		return &wrapUUIDEncodePlan{}, uuidValue(v), true
	}
	return nil, nil, false
}

type wrapUUIDEncodePlan struct{ next pgtype.EncodePlan }

func (p *wrapUUIDEncodePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *wrapUUIDEncodePlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode(uuidValue(value.(uuid.UUID)), buf)
}

func tryWrapUUIDScanPlan(target any) (pgtype.WrappedScanPlanNextSetter, any, bool) {
	if t, ok := target.(*uuid.UUID); ok {
		return &wrapUUIDScanPlan{}, (*uuidValue)(t), true
	}
	return nil, nil, false
}

type wrapUUIDScanPlan struct{ next pgtype.ScanPlan }

func (p *wrapUUIDScanPlan) SetNext(next pgtype.ScanPlan) { p.next = next }

func (p *wrapUUIDScanPlan) Scan(src []byte, dst any) error {
	return p.next.Scan(src, (*uuidValue)(dst.(*uuid.UUID)))
}

var (
	_ pgtype.UUIDValuer  = uuidValue{}
	_ pgtype.UUIDScanner = (*uuidValue)(nil)
)
