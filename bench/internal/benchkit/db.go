package benchkit

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

// DefaultPG is the admin DSN every program's -pg defaults to: the local Postgres.
const DefaultPG = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// WithDatabase returns dsn naming database db instead.
func WithDatabase(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("-pg: invalid URL")
		}
		u.Path = "/" + db
		return u.String(), nil
	}
	return dsn + " dbname=" + db, nil // key=value form: the last dbname wins
}

// NewDatabase creates the database name on the server of adminDSN, migrates it, and registers
// its removal (DROP … WITH (FORCE)) with cl. It returns the database's DSN.
func NewDatabase(ctx context.Context, adminDSN, name string, cl *Cleanups) (string, error) {
	dsn, err := WithDatabase(adminDSN, name)
	if err != nil {
		return "", err
	}
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return "", fmt.Errorf("postgres admin connection (-pg): %w", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		_ = admin.Close(context.Background()) // closed whatever Close returns; the Exec error is the one to report
		return "", fmt.Errorf("create database: %w", err)
	}
	Logf("database %s created", name)
	cl.Add(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if _, err := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			Logf("drop database %s: %v", name, err)
		} else {
			Logf("database %s dropped", name)
		}
		_ = admin.Close(dctx) // closed whatever Close returns; the database is dropped or logged
	})
	return dsn, store.MigrateDSN(ctx, dsn)
}

// Settings returns the values of the named Postgres settings (current_setting) as a session
// of dsn sees them; "?" for each when they cannot be read.
func Settings(ctx context.Context, dsn string, names ...string) []string {
	out := make([]string, len(names))
	for i := range out {
		out[i] = "?"
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return out
	}
	defer func() { _ = conn.Close(context.Background()) }() // closed even if Close returns an error
	for i, name := range names {
		_ = conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&out[i])
	}
	return out
}

// QueryInt runs sql, which returns one integer, on a connection of its own to dsn; -1 on error.
func QueryInt(dsn, sql string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return -1
	}
	defer func() { _ = conn.Close(ctx) }() // closed even if Close returns an error
	var n int64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		return -1
	}
	return n
}

// SetupStore opens a store on dsn for making a bench's data: at most conns connections, whose
// sessions skip the WAL flush per commit (setup data need not survive a crash). Close the
// returned pool when done.
func SetupStore(ctx context.Context, dsn string, key []byte, conns int32) (*store.Store, *pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, err
	}
	if conns > 0 {
		pcfg.MaxConns = conns
	}
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	box, err := secretbox.New(key)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return store.New(pool, box), pool, nil
}

// CreateChannels creates n active channels of org, channel i named and connected as
// channel(i) says, with workers of them at a time, and returns their channel tokens.
func CreateChannels(ctx context.Context, st *store.Store, org uuid.UUID, n, workers int,
	channel func(i int) (name string, conn store.Connection)) ([]string, error) {
	tokens := make([]string, n)
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				name, conn := channel(i)
				ch, err := st.CreateChannel(ctx, org, name, time.Hour)
				if err != nil {
					err = fmt.Errorf("create channel: %w", err)
				} else if err = st.ConnectChannel(ctx, ch.ID, conn); err != nil {
					err = fmt.Errorf("connect channel: %w", err)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					next.Store(int64(n))
					return
				}
				tokens[i] = ch.ChannelToken
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return tokens, ctx.Err()
}

// DurableStore creates and migrates a database named prefix and a random suffix on the server
// of adminDSN (its removal registered with cl, as NewDatabase), logs the server's version and
// durability settings, and opens a store on it with a new key: the measured store, on the
// server's settings as they are. It returns the database's DSN, the store and its pool.
func DurableStore(ctx context.Context, adminDSN, prefix string, cl *Cleanups) (string, *store.Store, *pgxpool.Pool, error) {
	dsn, err := NewDatabase(ctx, adminDSN, prefix+RandHex(4), cl)
	if err != nil {
		return "", nil, nil, err
	}
	pool, err := Pool(ctx, dsn, cl)
	if err != nil {
		return "", nil, nil, err
	}
	s := Settings(ctx, dsn, "fsync", "synchronous_commit", "server_version")
	Logf("Postgres %s, fsync %s, synchronous_commit %s; load %s", s[2], s[0], s[1], LoadAvg())
	box, err := secretbox.New(NewKey())
	if err != nil {
		return "", nil, nil, err
	}
	return dsn, store.New(pool, box), pool, nil
}

// ExplainPool opens a one-connection pool on dsn whose session logs every statement's executed
// plan (auto_explain: ANALYZE, BUFFERS, timing) as a notice; plans returns the plans logged
// since its last call, and forgets them. Close the pool when done.
func ExplainPool(ctx context.Context, dsn string) (pool *pgxpool.Pool, plans func() []string, err error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, err
	}
	var mu sync.Mutex
	var logged []string
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		logged = append(logged, n.Message)
		mu.Unlock()
	}
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
			SET auto_explain.log_buffers = on; SET auto_explain.log_timing = on; SET auto_explain.log_level = notice`)
		return err
	}
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, nil, err
	}
	return pool, func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := logged
		logged = nil
		return out
	}, nil
}
