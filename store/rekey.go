package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// sealedColumn is a column holding secretbox values: table.column_enc, each sealed with the
// additional data "table.column:<row id>".
type sealedColumn struct {
	table, column string
	aad           func(uuid.UUID) string
}

// sealedColumns lists every column that holds a sealed secret. A new one must be added here, or
// `caddy wabarelay rekey` leaves it under the old key.
var sealedColumns = []sealedColumn{
	{"channels", "channel_token", channelTokenAAD},
	{"channels", "upstream_token", upstreamTokenAAD},
	{"channels", "register_pin", registerPINAAD},
	{"webhooks", "secret", webhookSecretAAD},
	{"webhooks", "previous_secret", webhookPreviousSecretAAD},
}

// DefaultRekeyBatch is how many values Rekey re-encrypts per transaction unless told otherwise.
const DefaultRekeyBatch = 500

// rekeyMaxPasses bounds the passes over one column: a pass after the first only revisits the
// values that were changed concurrently during the one before.
const rekeyMaxPasses = 10

// RekeyProgress reports Rekey's progress on one column, once per batch.
type RekeyProgress struct {
	// Table and Column name the secret, e.g. "channels" and "upstream_token".
	Table  string `json:"table"`
	Column string `json:"column"`
	// Done is how many of the column's values have been re-encrypted so far.
	Done int64 `json:"done"`
	// Total is how many of its values were not under the first key when Rekey began on it.
	Total int64 `json:"total"`
}

// RekeyOptions tunes Rekey.
type RekeyOptions struct {
	// BatchSize is how many values are re-encrypted per transaction. Default: DefaultRekeyBatch.
	BatchSize int
	// Progress, if set, is called after every batch (and once for a column with nothing to do).
	Progress func(RekeyProgress)

	// beforeWrite, if set, runs between reading a batch of table.column and writing it
	// (tests: a concurrent change of a row).
	beforeWrite func(table, column string)
}

// RekeyResult is what Rekey did.
type RekeyResult struct {
	// Rekeyed is how many values were re-encrypted under the first key.
	Rekeyed int64 `json:"rekeyed"`
	// Concurrent is how many times a value changed between Rekey's read and its write; the
	// write was then skipped (the newer value kept) and the value revisited.
	Concurrent int64 `json:"concurrent"`
	// Unreadable is how many values no configured key opens (they are left as they are).
	Unreadable int64 `json:"unreadable"`
	// Remaining is how many values are still not under the first key at the end (the
	// unreadable ones, and any rewritten under an old key by an instance not yet reloaded).
	Remaining int64 `json:"remaining"`
}

// ErrRekeyIncomplete is returned (wrapped, with the counts) by Rekey when values remain that are
// not under the first key.
var ErrRekeyIncomplete = errors.New("rekey incomplete")

// Rekey re-encrypts every sealed secret that is not under the box's first key (or is in the
// old format), in batches of opts.BatchSize values per transaction. Each value is written only
// if it is unchanged since it was read (compare-and-swap), so a concurrent write by a running
// instance is never overwritten; a value that changed is revisited in a later pass. Values
// already under the first key are skipped, so an interrupted Rekey (ctx cancelled, crash) is
// finished by running it again. The writes change no plaintext and are not announced to the
// instances' caches. When values remain that no key opens or that keep changing under an old
// key, Rekey finishes the rest and returns an error wrapping ErrRekeyIncomplete.
func (s *Store) Rekey(ctx context.Context, opts RekeyOptions) (RekeyResult, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultRekeyBatch
	}
	var res RekeyResult
	var problems []string
	for _, col := range sealedColumns {
		unreadable, err := s.rekeyColumn(ctx, col, opts, &res)
		if err != nil {
			return res, err
		}
		remaining, err := s.countNotCurrent(ctx, col)
		if err != nil {
			return res, err
		}
		res.Unreadable += int64(len(unreadable))
		res.Remaining += remaining
		if len(unreadable) > 0 {
			problems = append(problems, fmt.Sprintf("%s.%s: %d values open with none of the configured keys (row ids %s)",
				col.table, col.column, len(unreadable), idList(unreadable, 5)))
		}
		if other := remaining - int64(len(unreadable)); other > 0 {
			problems = append(problems, fmt.Sprintf("%s.%s: %d values were rewritten under another key while rekey ran (is an instance running without the new key first?)",
				col.table, col.column, other))
		}
	}
	if len(problems) > 0 {
		return res, fmt.Errorf("%w: %d values not under the first key: %v", ErrRekeyIncomplete, res.Remaining, problems)
	}
	return res, nil
}

func idList(ids []uuid.UUID, n int) string {
	s := ""
	for i, id := range ids {
		if i == n {
			return s + fmt.Sprintf(", … %d more", len(ids)-n)
		}
		if i > 0 {
			s += ", "
		}
		s += id.String()
	}
	return s
}

// rekeyColumn runs the passes over one column and returns the ids of the values no key opens.
func (s *Store) rekeyColumn(ctx context.Context, col sealedColumn, opts RekeyOptions, res *RekeyResult) ([]uuid.UUID, error) {
	total, err := s.countNotCurrent(ctx, col)
	if err != nil {
		return nil, err
	}
	p := RekeyProgress{Table: col.table, Column: col.column, Total: total}
	if total == 0 {
		if opts.Progress != nil {
			opts.Progress(p)
		}
		return nil, nil
	}
	var unreadable []uuid.UUID
	for pass := 0; pass < rekeyMaxPasses; pass++ {
		unreadable = unreadable[:0]
		var conflicts int64
		cursor := uuid.Nil
		for {
			ids, old, fresh, last, bad, err := s.rekeyRead(ctx, col, cursor, opts.BatchSize)
			if err != nil {
				return nil, err
			}
			if last == uuid.Nil {
				break
			}
			cursor = last
			unreadable = append(unreadable, bad...)
			if len(ids) == 0 {
				continue
			}
			if opts.beforeWrite != nil {
				opts.beforeWrite(col.table, col.column)
			}
			n, err := s.rekeyWrite(ctx, col, ids, old, fresh)
			if err != nil {
				return nil, err
			}
			p.Done += n
			res.Rekeyed += n
			conflicts += int64(len(ids)) - n
			if opts.Progress != nil {
				opts.Progress(p)
			}
		}
		res.Concurrent += conflicts
		if conflicts == 0 {
			break
		}
	}
	return unreadable, nil
}

// countNotCurrent counts the column's values that are not under the first key.
func (s *Store) countNotCurrent(ctx context.Context, col sealedColumn) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s IS NOT NULL AND substr(%[2]s, 1, %d) <> $1`,
		pgx.Identifier{col.table}.Sanitize(), pgx.Identifier{col.column + "_enc"}.Sanitize(), len(s.box.Header())), s.box.Header()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("rekey %s.%s: count: %w", col.table, col.column, err)
	}
	return n, nil
}

// rekeyRead reads the next batch of values not under the first key after cursor (by id) and
// re-seals them: ids, their values as read and re-sealed, the last id read (uuid.Nil when none
// is left) and the ids of values no key opens.
func (s *Store) rekeyRead(ctx context.Context, col sealedColumn, cursor uuid.UUID, limit int) (ids []uuid.UUID, old, fresh [][]byte, last uuid.UUID, bad []uuid.UUID, err error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT id, %[2]s FROM %[1]s
		WHERE id > $1 AND %[2]s IS NOT NULL AND substr(%[2]s, 1, %[3]d) <> $2 ORDER BY id LIMIT $3`,
		pgx.Identifier{col.table}.Sanitize(), pgx.Identifier{col.column + "_enc"}.Sanitize(), len(s.box.Header())),
		cursor, s.box.Header(), limit)
	if err != nil {
		return nil, nil, nil, uuid.Nil, nil, fmt.Errorf("rekey %s.%s: read: %w", col.table, col.column, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var sealed []byte
		if err := rows.Scan(&id, &sealed); err != nil {
			return nil, nil, nil, uuid.Nil, nil, fmt.Errorf("rekey %s.%s: read: %w", col.table, col.column, err)
		}
		last = id
		aad := []byte(col.aad(id))
		plain, err := s.box.Open(sealed, aad)
		if err != nil {
			bad = append(bad, id)
			continue
		}
		ids, old, fresh = append(ids, id), append(old, sealed), append(fresh, s.box.Seal(plain, aad))
		clear(plain)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, uuid.Nil, nil, fmt.Errorf("rekey %s.%s: read: %w", col.table, col.column, err)
	}
	return ids, old, fresh, last, bad, nil
}

// rekeyWrite stores the re-sealed values in one transaction, each only where the column still
// holds the value that was read, and returns how many it wrote. The transaction sets
// wabarelay.rekey, which keeps the channel trigger from announcing the writes (migration 013).
func (s *Store) rekeyWrite(ctx context.Context, col sealedColumn, ids []uuid.UUID, old, fresh [][]byte) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('wabarelay.rekey', 'on', true)`); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %[1]s AS t SET %[2]s = v.fresh
			FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS v(id, old, fresh)
			WHERE t.id = v.id AND t.%[2]s = v.old`,
			pgx.Identifier{col.table}.Sanitize(), pgx.Identifier{col.column + "_enc"}.Sanitize()), ids, old, fresh)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("rekey %s.%s: write: %w", col.table, col.column, err)
	}
	return n, nil
}
