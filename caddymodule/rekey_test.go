package caddymodule

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestEncryptionKeyList: `encryption_key` takes several arguments (joined into the one JSON
// string) or one value holding a comma/space-separated list; Provision accepts a list and refuses
// a duplicate or malformed key, naming its position and never its value.
func TestEncryptionKeyList(t *testing.T) {
	cfg := adapt(t, "{\n wabarelay {\n database {env.DB}\n encryption_key {env.NEW} {file./run/old}\n }\n}\n:80 {\n respond ok\n}")
	if !strings.Contains(string(cfg), `"encryption_key":"{env.NEW} {file./run/old}"`) {
		t.Fatalf("adapted: %s", cfg)
	}
	if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n wabarelay {\n encryption_key\n }\n}\n:80 {\n respond ok\n}"), nil); err == nil {
		t.Fatal("encryption_key without a key adapted")
	}
	k := func() string { return base64.StdEncoding.EncodeToString(testenv.NewKey()) }
	a, b := k(), k()
	t.Setenv("WBR_TEST_DATABASE", "postgres://x@127.0.0.1/db")
	for _, tc := range []struct{ keys, wantErr string }{
		{b + "," + a, ""}, {b + " " + a, ""}, {b + ", " + a + "\n", ""},
		{b + "," + b, "keys 1 and 2 are the same"}, {b + ",c2hvcnQ=", "key 2 of 2"}, {" , ", "no encryption key"},
	} {
		t.Setenv("WBR_TEST_KEY", tc.keys)
		err := caddy.Validate(mustConfig(t, adapt(t, caddyfileFor(testenv.FreePort(t), ""))))
		if tc.wantErr == "" && err != nil {
			t.Fatalf("keys %d long: %v", len(tc.keys), err)
		}
		if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "encryption_key") ||
			strings.Contains(err.Error(), b) || strings.Contains(err.Error(), a)) {
			t.Fatalf("want an error with %q: %v", tc.wantErr, err)
		}
	}
}
