package caddymodule

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestCLIWithoutKey: commands that change no secret need no encryption key (docs/configuration.md#cli), and a
// missing setting is named in the error.
func TestCLIWithoutKey(t *testing.T) {
	f := testenv.NewStore(t)
	dsn := f.DSN
	org := f.Org(t, &testenv.OrgOpts{Name: "acme"})
	ch := f.Channel(t, org.ID)
	t.Setenv("WABARELAY_DATABASE_URL", dsn)
	t.Setenv("WABARELAY_ENCRYPTION_KEY", "")

	out, err := runCLITest(t, "channel", "deactivate", "--id", ch.ID.String())
	if err != nil || len(out) != 1 || out[0]["status"] != "inactive" || out[0]["inactive_reason"] != "operator" {
		t.Fatalf("deactivate without a key: %v %v", out, err)
	}
	if _, err := runCLITest(t, "channel", "deactivate", "--id", ch.ID.String()); err != nil {
		t.Fatalf("channel deactivate: %v", err)
	}
	out, err = runCLITest(t, "channel", "reconnect", "--id", ch.ID.String())
	if err != nil || len(out) != 1 || out[0]["token_expires_at"] == nil {
		t.Fatalf("reconnect without a key: %v %v", out, err)
	}
	for _, args := range [][]string{{"apikey", "list", "--org", org.ID.String()}, {"org", "create", "--name", "b"}, {"migrate"}} {
		if _, err := runCLITest(t, args...); err != nil {
			t.Fatalf("%v without a key: %v", args, err)
		}
	}
	t.Setenv("WABARELAY_DATABASE_URL", "")
	if _, err := runCLITest(t, "channel", "deactivate", "--id", ch.ID.String()); err == nil || !strings.Contains(err.Error(), "WABARELAY_DATABASE_URL") {
		t.Fatalf("missing database: %v", err)
	}
}

// TestCLITimestamps: every timestamp the CLI prints has the management API's form (RFC 3339 in
// UTC with milliseconds, managementapi.TimeLayout), not the machine's zone: created_at (to the
// microsecond in the database) and expires_at (to the millisecond) alike.
func TestCLITimestamps(t *testing.T) {
	f := testenv.NewStore(t)
	org := f.Org(t, &testenv.OrgOpts{Name: "acme"})
	ch := f.Channel(t, org.ID)
	t.Setenv("WABARELAY_DATABASE_URL", f.DSN)
	t.Setenv("WABARELAY_ENCRYPTION_KEY", "")

	form := regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$`)
	check := func(what string, line map[string]any, fields ...string) {
		t.Helper()
		for _, k := range fields {
			s, ok := line[k].(string)
			if !ok || !form.MatchString(s) {
				t.Errorf("%s: %s = %#v, want RFC 3339 UTC with milliseconds", what, k, line[k])
			}
		}
	}
	out, err := runCLITest(t, "org", "create", "--name", "b")
	if err != nil || len(out) != 1 {
		t.Fatalf("org create: %v %v", out, err)
	}
	check("org create", out[0], "created_at")
	out, err = runCLITest(t, "apikey", "create", "--org", org.ID.String(), "--expires-in", "30d")
	if err != nil || len(out) != 1 {
		t.Fatalf("apikey create: %v %v", out, err)
	}
	check("apikey create", out[0], "created_at", "expires_at")
	keyID := out[0]["id"].(string)
	out, err = runCLITest(t, "apikey", "revoke", "--id", keyID)
	if err != nil || len(out) != 1 {
		t.Fatalf("apikey revoke: %v %v", out, err)
	}
	check("apikey revoke", out[0], "created_at", "expires_at", "revoked_at")
	out, err = runCLITest(t, "apikey", "list", "--org", org.ID.String())
	if err != nil || len(out) == 0 {
		t.Fatalf("apikey list: %v %v", out, err)
	}
	for _, l := range out {
		check("apikey list", l, "created_at")
	}
	if _, err := runCLITest(t, "channel", "deactivate", "--id", ch.ID.String()); err != nil {
		t.Fatalf("channel deactivate: %v", err)
	}
	out, err = runCLITest(t, "channel", "reconnect", "--id", ch.ID.String())
	if err != nil || len(out) != 1 {
		t.Fatalf("channel reconnect: %v %v", out, err)
	}
	check("channel reconnect", out[0], "token_expires_at")
}

// TestCLIRekey: `caddy wabarelay rekey` takes the keys from repeated or comma-separated
// --encryption-key or from WABARELAY_ENCRYPTION_KEY, re-encrypts every secret under the first,
// prints one progress line per batch and a summary, never a secret; a missing or malformed key
// is named in the error without its value.
func TestCLIRekey(t *testing.T) {
	ctx := context.Background()
	newKey := func() (string, []byte) {
		k := testenv.NewKey()
		return base64.StdEncoding.EncodeToString(k), k
	}
	a64, a := newKey()
	b64, b := newKey()
	c64, c := newKey()
	f := testenv.NewStore(t, &testenv.StoreOpts{Key: a})
	dsn, pool, boxA := f.DSN, f.Pool, f.Box
	org := f.Org(t, &testenv.OrgOpts{Name: "acme"})
	var secrets []string
	var channels []store.Channel
	for i := range 5 {
		up := fmt.Sprintf("EAAG-cli-upstream-%d", i)
		ch := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: fmt.Sprint(3000 + i), WabaID: "w", UpstreamToken: up}})
		channels = append(channels, ch)
		secrets = append(secrets, ch.ChannelToken, up)
	}
	wh, whsec := f.Webhook(t, org.ID, "https://r.example/h")
	secrets = append(secrets, whsec, a64, b64, c64)
	t.Setenv("WABARELAY_DATABASE_URL", dsn)

	// errors: no key, a malformed one (named by position, never shown)
	t.Setenv("WABARELAY_ENCRYPTION_KEY", "")
	if _, err := runCLITest(t, "rekey"); err == nil || !strings.Contains(err.Error(), "WABARELAY_ENCRYPTION_KEY") {
		t.Fatalf("no key: %v", err)
	}
	for _, args := range [][]string{{"--encryption-key", b64 + ",c2hvcnQ="}, {"--encryption-key", b64, "--encryption-key", "!!" + a64}} {
		_, err := runCLITest(t, append([]string{"rekey"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "--encryption-key") || !strings.Contains(err.Error(), "key 2 of 2") ||
			strings.Contains(err.Error(), b64) || strings.Contains(err.Error(), a64) {
			t.Fatalf("malformed key %v: %v", args[1:], err)
		}
	}
	if _, err := runCLITest(t, "rekey", "--encryption-key", b64, "--batch-size", "0"); err == nil || !strings.Contains(err.Error(), "--batch-size") {
		t.Fatalf("bad batch size: %v", err)
	}

	// repeated flags: [B, A]
	out, err := runCLITest(t, "rekey", "--encryption-key", b64, "--encryption-key", a64, "--batch-size", "2")
	if err != nil {
		t.Fatalf("rekey: %v %v", out, err)
	}
	raw, _ := json.Marshal(out)
	for _, s := range secrets {
		if strings.Contains(string(raw), s) {
			t.Fatal("rekey output shows a secret")
		}
	}
	last := out[len(out)-1]
	boxB := testenv.Keyring(t, b)
	if last["result"] != "complete" || last["rekeyed"] != float64(11) || last["remaining"] != float64(0) || last["key_id"] != boxB.KeyIDs()[0] {
		t.Fatalf("summary: %v", last)
	}
	var sawBatch bool
	for _, l := range out[:len(out)-1] {
		if l["table"] == "channels" && l["column"] == "upstream_token" && l["done"] == float64(2) && l["total"] == float64(5) {
			sawBatch = true
		}
	}
	if !sawBatch || len(out) < 3+3+1+1 {
		t.Fatalf("progress lines: %v", out)
	}
	stB := f.StoreWith(t, b)
	for i, ch := range channels {
		rc, err := stB.RelayChannelByToken(ctx, ch.ChannelToken)
		if err != nil || rc.UpstreamToken != fmt.Sprintf("EAAG-cli-upstream-%d", i) {
			t.Fatalf("B alone: channel %d: %v", i, err)
		}
	}

	// the environment, comma- or space-separated: [C, B] moves everything on to C; a second
	// run finds nothing to do
	for i, env := range []string{c64 + ", " + b64, c64 + " " + b64} {
		t.Setenv("WABARELAY_ENCRYPTION_KEY", env)
		out, err = runCLITest(t, "rekey")
		want := float64(11)
		if i == 1 {
			want = 0
		}
		if err != nil || out[len(out)-1]["rekeyed"] != want || out[len(out)-1]["result"] != "complete" {
			t.Fatalf("rekey from the environment #%d: %v %v", i, out, err)
		}
	}
	if s, err := f.StoreWith(t, c).WebhookSecret(ctx, wh.ID); err != nil || s != whsec {
		t.Fatalf("C alone: webhook secret: %v", err)
	}

	// a value no key opens: the rest is done, the summary says incomplete, exit is non-zero
	if _, err := pool.Exec(ctx, `UPDATE channels SET register_pin_enc = $2 WHERE id = $1`, channels[0].ID,
		boxA.SealString("123456", "channels.register_pin:"+channels[0].ID.String())); err != nil {
		t.Fatal(err)
	}
	out, err = runCLITest(t, "rekey")
	if err == nil || !strings.Contains(err.Error(), channels[0].ID.String()) || out[len(out)-1]["result"] != "incomplete" || out[len(out)-1]["unreadable"] != float64(1) {
		t.Fatalf("unreadable value: %v %v", out, err)
	}
}
