package store_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

// sealV1 seals as builds before key lists did (version byte 1, no key id).
func sealV1(key []byte, plaintext, aad string) []byte {
	block, _ := aes.NewCipher(key)
	aead, _ := cipher.NewGCMWithRandomNonce(block)
	return aead.Seal([]byte{1}, nil, []byte(plaintext), []byte(aad))
}

// rekeyWorld is a database whose secrets are sealed under key A: channels (connected ones with
// an upstream token, some with a registration PIN, some values in the old format) and webhooks.
type rekeyWorld struct {
	fix      *testenv.Fixture
	pool     *pgxpool.Pool
	a, b     []byte
	org      uuid.UUID
	channels map[uuid.UUID][3]string // channel token, upstream token, PIN ("" when none)
	webhooks map[uuid.UUID]string    // signing secret
}

func newRekeyWorld(t *testing.T, nChannels int) *rekeyWorld {
	t.Helper()
	f := testenv.NewStore(t) // its key is A
	pool, st := f.Pool, f.Store
	w := &rekeyWorld{fix: f, pool: pool, a: f.Key, b: testenv.NewKey(), channels: map[uuid.UUID][3]string{}, webhooks: map[uuid.UUID]string{}}
	ctx := context.Background()
	org := f.Org(t)
	w.org = org.ID
	for i := range nChannels {
		opts := &testenv.ChannelOpts{}
		v := [3]string{"", "", ""}
		if i%3 != 2 {
			v[1] = fmt.Sprintf("EAAG-upstream-%d", i)
			opts.Connection = &store.Connection{PhoneNumberID: fmt.Sprint(5000 + i), WabaID: "w", UpstreamToken: v[1]}
		}
		c := f.Channel(t, org.ID, opts)
		v[0] = c.ChannelToken
		if i%2 == 0 {
			v[2] = fmt.Sprintf("%06d", i)
			if err := st.SetChannelPIN(ctx, c.ID, v[2]); err != nil {
				t.Fatal(err)
			}
		}
		if i%4 == 1 { // values written by a build before key lists
			if _, err := pool.Exec(ctx, `UPDATE channels SET channel_token_enc = $2 WHERE id = $1`, c.ID,
				sealV1(w.a, v[0], "channels.channel_token:"+c.ID.String())); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE channels SET upstream_token_enc = $2 WHERE id = $1 AND upstream_token_enc IS NOT NULL`, c.ID,
				sealV1(w.a, v[1], "channels.upstream_token:"+c.ID.String())); err != nil {
				t.Fatal(err)
			}
		}
		w.channels[c.ID] = v
	}
	for range 4 {
		wh, secret := f.Webhook(t, org.ID, "https://r.example/h")
		w.webhooks[wh.ID] = secret
	}
	return w
}

// check opens every secret through the store's own methods with keys and compares it with what
// was written; want overrides values changed since.
func (w *rekeyWorld) check(t *testing.T, keys ...[]byte) {
	t.Helper()
	st := w.fix.StoreWith(t, keys...)
	ctx := context.Background()
	for id, v := range w.channels {
		c, err := st.GetChannel(ctx, w.org, id)
		if err != nil || c.ChannelToken != v[0] {
			t.Fatalf("channel %s: channel token: %v", id, err)
		}
		if v[1] != "" {
			rc, err := st.RelayChannelByToken(ctx, v[0])
			if err != nil || rc.UpstreamToken != v[1] {
				t.Fatalf("channel %s: upstream token: %v", id, err)
			}
		}
		if pin, err := st.ChannelPIN(ctx, id); err != nil || pin != v[2] {
			t.Fatalf("channel %s: pin %q, want %q: %v", id, pin, v[2], err)
		}
	}
	for id, secret := range w.webhooks {
		if got, err := st.WebhookSecret(ctx, id); err != nil || got != secret {
			t.Fatalf("webhook %s: secret: %v", id, err)
		}
	}
}

// values counts the world's sealed values (channel tokens, upstream tokens, PINs, secrets).
func (w *rekeyWorld) values() int64 {
	n := int64(len(w.webhooks))
	for _, v := range w.channels {
		for _, s := range v {
			if s != "" {
				n++
			}
		}
	}
	return n
}

// TestRekey: with keys [B, A], Rekey re-encrypts every secret (including old-format values) under
// B in batches, reporting progress per column; B alone then opens everything, A alone nothing;
// a second run finds nothing to do.
func TestRekey(t *testing.T) {
	w := newRekeyWorld(t, 12)
	w.check(t, w.a)
	st := w.fix.StoreWith(t, w.b, w.a)
	var progress []store.RekeyProgress
	res, err := st.Rekey(context.Background(), store.RekeyOptions{BatchSize: 5, Progress: func(p store.RekeyProgress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rekeyed != w.values() || res.Remaining != 0 || res.Concurrent != 0 || res.Unreadable != 0 {
		t.Fatalf("result %+v, want %d rekeyed", res, w.values())
	}
	last := map[string]store.RekeyProgress{}
	batches := 0
	for _, p := range progress {
		last[p.Table+"."+p.Column] = p
		batches++
	}
	for _, col := range []string{"channels.channel_token", "channels.upstream_token", "channels.register_pin", "webhooks.secret"} {
		if p, ok := last[col]; !ok || p.Done != p.Total || p.Total == 0 {
			t.Fatalf("last progress of %s: %+v (%v)", col, p, ok)
		}
	}
	if last["channels.channel_token"].Total != 12 || batches < 3+2+2+1 {
		t.Fatalf("progress: %+v", progress)
	}
	w.check(t, w.b)
	if _, err := w.fix.StoreWith(t, w.a).WebhookSecret(context.Background(), anyKey(w.webhooks)); !errors.Is(err, secretbox.ErrOpen) {
		t.Fatalf("A still opens a rekeyed secret: %v", err)
	}

	progress = nil
	res, err = st.Rekey(context.Background(), store.RekeyOptions{Progress: func(p store.RekeyProgress) { progress = append(progress, p) }})
	if err != nil || res.Rekeyed != 0 || len(progress) != 5 || progress[0].Total != 0 {
		t.Fatalf("second run: %+v %v %+v", res, err, progress)
	}
}

func anyKey[V any](m map[uuid.UUID]V) uuid.UUID {
	for k := range m {
		return k
	}
	return uuid.Nil
}

// TestRekeyResumes: a Rekey cancelled after its first batch leaves the committed batch under B
// and the rest under A (still readable with [B, A]); running it again finishes the job.
func TestRekeyResumes(t *testing.T) {
	w := newRekeyWorld(t, 12)
	st := w.fix.StoreWith(t, w.b, w.a)
	ctx, cancel := context.WithCancel(context.Background())
	var first store.RekeyProgress
	res, err := st.Rekey(ctx, store.RekeyOptions{BatchSize: 4, Progress: func(p store.RekeyProgress) {
		if first.Table == "" {
			first = p
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted rekey: %+v %v", res, err)
	}
	if first.Done != 4 || res.Rekeyed != 4 {
		t.Fatalf("interrupted after %+v, result %+v", first, res)
	}
	w.check(t, w.b, w.a) // half done: the service reads both
	var underB int
	if err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM channels WHERE substr(channel_token_enc, 1, 5) = $1`, testenv.Keyring(t, w.b).Header()).Scan(&underB); err != nil {
		t.Fatal(err)
	}
	if underB != 4 {
		t.Fatalf("%d channel tokens under B after the interruption, want 4", underB)
	}

	var progress []store.RekeyProgress
	res, err = st.Rekey(context.Background(), store.RekeyOptions{BatchSize: 4, Progress: func(p store.RekeyProgress) { progress = append(progress, p) }})
	if err != nil || res.Rekeyed != w.values()-4 || res.Remaining != 0 {
		t.Fatalf("resumed: %+v %v", res, err)
	}
	if progress[0].Table != "channels" || progress[0].Column != "channel_token" || progress[0].Total != 8 {
		t.Fatalf("resumed run did not skip the done values: %+v", progress[0])
	}
	w.check(t, w.b)
}

// TestRekeyKeepsConcurrentWrites: values changed between Rekey's read and its write are not
// overwritten — one changed by an instance that already seals with B stays as written, one
// changed by an instance still sealing with A is revisited in a second pass and re-encrypted —
// and both keep their new plaintext.
func TestRekeyKeepsConcurrentWrites(t *testing.T) {
	for _, column := range []string{"upstream_token", "secret"} {
		t.Run(column, func(t *testing.T) {
			w := newRekeyWorld(t, 6)
			ctx := context.Background()
			stBA := w.fix.StoreWith(t, w.b, w.a)
			stA := w.fix.StoreWith(t, w.a)
			var once sync.Once
			opts := store.RekeyOptions{BatchSize: 100}
			opts.SetRekeyBeforeWrite(func(_, col string) {
				if col != column {
					return
				}
				once.Do(func() {
					if column == "secret" {
						var ids []uuid.UUID
						for id := range w.webhooks {
							ids = append(ids, id)
						}
						for i, st := range []*store.Store{stBA, stA} {
							secret := fmt.Sprintf("whsec_rewritten%d", i)
							if _, err := w.pool.Exec(ctx, `UPDATE webhooks SET secret_enc = $2 WHERE id = $1`, ids[i],
								st.Box().SealString(secret, "webhooks.secret:"+ids[i].String())); err != nil {
								t.Error(err)
							}
							w.webhooks[ids[i]] = secret
						}
						return
					}
					i := 0
					for id, v := range w.channels {
						if v[1] == "" || i == 2 {
							continue
						}
						v[1] = fmt.Sprintf("EAAG-reconnected-%d", i)
						if err := []*store.Store{stBA, stA}[i].ConnectChannel(ctx, id, store.Connection{PhoneNumberID: fmt.Sprint(7000 + i), WabaID: "w", UpstreamToken: v[1]}); err != nil {
							t.Error(err)
						}
						w.channels[id] = v
						i++
					}
				})
			})
			res, err := stBA.Rekey(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Concurrent != 2 || res.Remaining != 0 || res.Rekeyed != w.values()-1 {
				t.Fatalf("result %+v, want 2 concurrent changes, %d rekeyed, none remaining", res, w.values()-1)
			}
			w.check(t, w.b) // the rewritten values, not the ones rekey read
		})
	}
}

// TestRekeyUnreadable: a value no configured key opens is left alone and reported by row id
// (never by content); every other value is re-encrypted.
func TestRekeyUnreadable(t *testing.T) {
	w := newRekeyWorld(t, 3)
	ctx := context.Background()
	stranger := testenv.Keyring(t, testenv.NewKey())
	id := anyKey(w.webhooks)
	if _, err := w.pool.Exec(ctx, `UPDATE webhooks SET secret_enc = $2 WHERE id = $1`, id, stranger.SealString("whsec_lost", "webhooks.secret:"+id.String())); err != nil {
		t.Fatal(err)
	}
	delete(w.webhooks, id)
	res, err := w.fix.StoreWith(t, w.b, w.a).Rekey(ctx, store.RekeyOptions{})
	if !errors.Is(err, store.ErrRekeyIncomplete) || !strings.Contains(err.Error(), id.String()) || strings.Contains(err.Error(), "whsec_lost") {
		t.Fatalf("err = %v", err)
	}
	if res.Unreadable != 1 || res.Remaining != 1 || res.Rekeyed != w.values() {
		t.Fatalf("result %+v", res)
	}
	w.check(t, w.b)
}

// TestRekeyKeepsCaches: rekey announces nothing on wabarelay_channels (no plaintext changes, so
// no instance's relay cache is flushed), while an ordinary change still is announced.
func TestRekeyKeepsCaches(t *testing.T) {
	w := newRekeyWorld(t, 4)
	ctx := context.Background()
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN wabarelay_channels`); err != nil {
		t.Fatal(err)
	}
	st := w.fix.StoreWith(t, w.b, w.a)
	if res, err := st.Rekey(ctx, store.RekeyOptions{BatchSize: 2}); err != nil || res.Rekeyed == 0 {
		t.Fatalf("rekey: %+v %v", res, err)
	}
	marker := anyKey(w.channels)
	if _, err := st.DeactivateChannel(ctx, marker); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != marker.String() {
		t.Fatalf("first notification after rekey is for %s, want the deactivated %s: rekey announced its writes", n.Payload, marker)
	}
}
