package testenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

// Fixture is a test's store: a fresh database, a pool on it, an encryption key and the
// store.Store that uses them, with factories for the rows tests need (in the manner of River's
// testfactory: an options struct per row, nil for the defaults).
type Fixture struct {
	DSN    string
	Pool   *pgxpool.Pool
	Store  *store.Store
	Box    *secretbox.Box
	Key    []byte // the encryption key (secretbox.KeySize bytes)
	KeyB64 string // Key as the encryption_key option takes it
	seq    atomic.Int64
}

// StoreOpts changes how NewStore sets up; the zero value is a fresh database (Postgres) and a
// random key.
type StoreOpts struct {
	DSN  string                // the database; default a fresh one from Postgres
	Key  []byte                // the encryption key; default random
	Pool func(*pgxpool.Config) // changes the pool's configuration before it connects
}

// NewStore returns a Fixture on a fresh, migrated database (or opts' DSN). The pool is closed at
// the end of the test.
func NewStore(t testing.TB, opts ...*StoreOpts) *Fixture {
	t.Helper()
	o := first(opts)
	f := &Fixture{DSN: o.DSN, Key: o.Key}
	if f.DSN == "" {
		f.DSN = Postgres(t)
	}
	if f.Key == nil {
		f.Key = NewKey()
	}
	f.KeyB64 = base64.StdEncoding.EncodeToString(f.Key)
	cfg, err := pgxpool.ParseConfig(f.DSN)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	store.ConfigurePool(cfg) // as the product's pools
	if o.Pool != nil {
		o.Pool(cfg)
	}
	if f.Pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(f.Pool.Close)
	if f.Box, err = secretbox.New(f.Key); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	f.Store = store.New(f.Pool, f.Box)
	return f
}

// NewKey returns a random encryption key.
func NewKey() []byte {
	k := make([]byte, secretbox.KeySize)
	rand.Read(k)
	return k
}

func first[T any](opts []*T) *T {
	if len(opts) > 0 && opts[0] != nil {
		return opts[0]
	}
	return new(T)
}

func (f *Fixture) next() string { return strconv.FormatInt(f.seq.Add(1), 10) }

// OrgOpts are an org's fields; Name defaults to "org".
type OrgOpts struct {
	Name string
}

// Org creates an org.
func (f *Fixture) Org(t testing.TB, opts ...*OrgOpts) store.Org {
	t.Helper()
	o := first(opts)
	if o.Name == "" {
		o = &OrgOpts{Name: "org"}
	}
	org, err := f.Store.CreateOrg(context.Background(), o.Name)
	if err != nil {
		t.Fatalf("testenv: creating an org: %v", err)
	}
	return org
}

// APIKeyOpts are an API key's fields: no name and no expiry by default.
type APIKeyOpts struct {
	Name      string
	ExpiresAt *time.Time
}

// APIKey creates an API key of org and returns it with its plaintext.
func (f *Fixture) APIKey(t testing.TB, org uuid.UUID, opts ...*APIKeyOpts) (store.APIKey, string) {
	t.Helper()
	o := first(opts)
	k, plain, err := f.Store.CreateAPIKey(context.Background(), org, o.Name, o.ExpiresAt)
	if err != nil {
		t.Fatalf("testenv: creating an API key: %v", err)
	}
	return k, plain
}

// ChannelOpts are a channel's fields: Name "c", a connect link valid for LinkTTL (default an
// hour), and, with Connection set, connected (active) on its number.
type ChannelOpts struct {
	Name       string
	LinkTTL    time.Duration
	Connection *store.Connection
}

// Channel creates a channel of org, connected when opts say so.
func (f *Fixture) Channel(t testing.TB, org uuid.UUID, opts ...*ChannelOpts) store.Channel {
	t.Helper()
	o := *first(opts)
	if o.Name == "" {
		o.Name = "c"
	}
	if o.LinkTTL == 0 {
		o.LinkTTL = time.Hour
	}
	ctx := context.Background()
	c, err := f.Store.CreateChannel(ctx, org, o.Name, o.LinkTTL)
	if err != nil {
		t.Fatalf("testenv: creating a channel: %v", err)
	}
	if o.Connection != nil {
		if err := f.Store.ConnectChannel(ctx, c.ID, *o.Connection); err != nil {
			t.Fatalf("testenv: connecting a channel: %v", err)
		}
	}
	return c
}

// Connection returns a connection on a number of its own (unique within the fixture) for
// ChannelOpts.Connection.
func (f *Fixture) Connection() *store.Connection {
	phone := "1555" + strconv.Itoa(int(time.Now().UnixNano()%1e6)) + f.next()
	return &store.Connection{PhoneNumberID: phone, WabaID: "waba" + phone, UpstreamToken: "tok"}
}

// WebhookOpts are a webhook's fields: Name "w", Events ["messages"], org-scoped unless
// ChannelIDs are given.
type WebhookOpts struct {
	Name       string
	Events     []string
	ChannelIDs []uuid.UUID
}

// Webhook creates a webhook of org delivering to url and returns it with its signing secret.
func (f *Fixture) Webhook(t testing.TB, org uuid.UUID, url string, opts ...*WebhookOpts) (store.Webhook, string) {
	t.Helper()
	o := *first(opts)
	if o.Name == "" {
		o.Name = "w"
	}
	if o.Events == nil {
		o.Events = []string{"messages"}
	}
	w, secret, err := f.Store.CreateWebhook(context.Background(), org,
		store.NewWebhook{Name: o.Name, URL: url, Events: o.Events, ChannelIDs: o.ChannelIDs})
	if err != nil {
		t.Fatalf("testenv: creating a webhook: %v", err)
	}
	return w, secret
}

// WaitListen waits (up to Patience) until a session on the fixture's database listens on the
// notification channel (a LISTEN loop such as internal/pglisten's has connected).
func (f *Fixture) WaitListen(t testing.TB, channel string) {
	t.Helper()
	Eventually(t, Patience, func() bool {
		var n int
		if err := f.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query IN ('LISTEN ' || $1, 'LISTEN "' || $1 || '"')`, channel).Scan(&n); err != nil {
			t.Fatalf("testenv: looking for a session listening on %s: %v", channel, err)
		}
		return n > 0
	}, "LISTEN %s", channel)
}

// StoreWith returns a store on the fixture's pool that encrypts with keys[0] and opens with
// any of keys (a keyring, as during a key rotation).
func (f *Fixture) StoreWith(t testing.TB, keys ...[]byte) *store.Store {
	t.Helper()
	return store.New(f.Pool, Keyring(t, keys...))
}

// Keyring returns a secretbox keyring of keys (keys[0] encrypts).
func Keyring(t testing.TB, keys ...[]byte) *secretbox.Box {
	t.Helper()
	b, err := secretbox.NewKeyring(keys...)
	if err != nil {
		t.Fatalf("testenv: keyring: %v", err)
	}
	return b
}
