package caddymodule

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestRateCardOption: `rate_card` prices GET /usage through Caddy, and a reload with a new card
// prices the next query with it. Not parallel: it loads Caddy in process.
func TestRateCardOption(t *testing.T) {
	dir := t.TempDir()
	card := filepath.Join(dir, "rates.csv")
	if err := os.WriteFile(card, []byte("country,category,price\nUS,marketing,0.0250\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := startInstance(t, "rate_card "+card)
	if _, err := in.pool.Exec(context.Background(), `INSERT INTO usage_daily (org_id, day, channel_id, category, pricing_type, country, messages, billable)
		SELECT org_id, (now() AT TIME ZONE 'UTC')::date, gen_random_uuid(), 'marketing', 'regular', 'US', 4, 4 FROM api_keys LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	cost := func() string {
		t.Helper()
		status, body, err := in.request("GET", "/v1/usage", "")
		var u struct {
			Totals struct{ Cost *string } `json:"totals"`
		}
		if err != nil || status != 200 || json.Unmarshal(body, &u) != nil || u.Totals.Cost == nil {
			t.Fatalf("usage: %d %s %v", status, body, err)
		}
		return *u.Totals.Cost
	}
	if got := cost(); got != "0.1000" {
		t.Fatalf("cost %s, want 0.1000", got)
	}
	if err := os.WriteFile(card, []byte("country,category,price\nUS,marketing,0.03\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in.load(caddyfileFor(in.port, "rate_card "+card))
	if got := cost(); got != "0.12" {
		t.Fatalf("after the reload: cost %s, want 0.12", got)
	}
}

// TestRateCardValidate: a rate card that does not parse fails `caddy validate`, naming the file
// and the line; a missing file too.
func TestRateCardValidate(t *testing.T) {
	t.Setenv("WBR_TEST_DATABASE", "postgres://x@127.0.0.1/db")
	t.Setenv("WBR_TEST_KEY", base64.StdEncoding.EncodeToString(make([]byte, 32)))
	dir := t.TempDir()
	for body, want := range map[string]string{
		"country,category,price\nUS,marketing,0.02\nUS,marketing,0.03\n": "line 3: country US and category marketing are already priced on line 2",
		"country,category,price\nUS,marketing,-1\n":                      `line 2: price "-1" is negative`,
		"country,category,price\nUS,marketing,cheap\n":                   `line 2: price "cheap" is not a decimal number`,
		"country,price\nUS,1\n":                                          "line 1: the header must be country,category,price",
	} {
		card := filepath.Join(dir, "rates.csv")
		if err := os.WriteFile(card, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		err := caddy.Validate(mustConfig(t, adapt(t, caddyfileFor(testenv.FreePort(t), "rate_card "+card))))
		if err == nil || !strings.Contains(err.Error(), "rate_card "+card+": "+want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	err := caddy.Validate(mustConfig(t, adapt(t, caddyfileFor(testenv.FreePort(t), "rate_card "+filepath.Join(dir, "none.csv")))))
	if err == nil || !strings.Contains(err.Error(), "rate_card: open ") {
		t.Errorf("missing file: %v", err)
	}
}
