package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/redis/go-redis/v9"
)

// appJSON adapts a Caddyfile whose global options hold opts and returns apps.wabarelay.
func appJSON(t *testing.T, opts string) string {
	t.Helper()
	var parsed struct {
		Apps struct {
			Wabarelay json.RawMessage `json:"wabarelay"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(adapt(t, "{\n\twabarelay {\n"+opts+"\n\t}\n}\n:80 {\n\trespond ok\n}\n"), &parsed); err != nil {
		t.Fatal(err)
	}
	return string(parsed.Apps.Wabarelay)
}

// TestRedisConfigCaddyfile: the URL form stays a JSON string; the block form becomes an object
// with its placeholders unresolved; malformed forms are refused.
func TestRedisConfigCaddyfile(t *testing.T) {
	if got := appJSON(t, "redis {env.REDIS_URL}"); !strings.Contains(got, `"redis":"{env.REDIS_URL}"`) {
		t.Fatalf("url form: %s", got)
	}
	got := appJSON(t, `redis {
		addresses 10.0.0.1:6379 10.0.0.2:6379 10.0.0.3:6379
		username relay
		password {env.REDIS_PASSWORD}
		tls
	}`)
	want := `"redis":{"addresses":["10.0.0.1:6379","10.0.0.2:6379","10.0.0.3:6379"],"username":"relay","password":"{env.REDIS_PASSWORD}","tls":true}`
	if !strings.Contains(got, want) {
		t.Fatalf("block form:\n got %s\nwant %s", got, want)
	}
	if got := appJSON(t, "redis {\n addresses s1:26379 s2:26379\n master_name mymaster\n db 2\n}"); !strings.Contains(got,
		`"redis":{"addresses":["s1:26379","s2:26379"],"master_name":"mymaster","db":2}`) {
		t.Fatalf("sentinel form: %s", got)
	}
	for _, bad := range []string{
		"redis",
		"redis a b",
		"redis redis://x {\n tls\n}",
		"redis {\n addresses\n}",
		"redis {\n db two\n}",
		"redis {\n cluster yes\n}",
	} {
		if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n wabarelay {\n "+bad+"\n }\n}\n:80 {\n respond ok\n}"), nil); err == nil && bad != "redis" {
			t.Errorf("adapted %q", bad)
		}
	}
}

// TestRedisConfigResolve: JSON in either form; placeholders resolved at provision time;
// conflicting settings refused, with errors that never carry a value; the client kind follows
// the config.
func TestRedisConfigResolve(t *testing.T) {
	var c RedisConfig
	if err := json.Unmarshal([]byte(`"redis://127.0.0.1:6379/0"`), &c); err != nil || c.URL != "redis://127.0.0.1:6379/0" {
		t.Fatalf("string form: %+v %v", c, err)
	}
	if b, _ := json.Marshal(c); string(b) != `"redis://127.0.0.1:6379/0"` {
		t.Fatalf("string form marshals as %s", b)
	}
	t.Setenv("WBR_TEST_REDIS_PW", "s3cret-pw")
	c = RedisConfig{}
	if err := json.Unmarshal([]byte(`{"addresses":["127.0.0.1:1","127.0.0.1:2"],"password":"{env.WBR_TEST_REDIS_PW}"}`), &c); err != nil {
		t.Fatal(err)
	}
	repl := caddy.NewReplacer()
	r, err := c.resolve(repl)
	if err != nil || r.Password != "s3cret-pw" || c.Password != "{env.WBR_TEST_REDIS_PW}" {
		t.Fatalf("resolved %+v (config keeps %q) %v", r, c.Password, err)
	}
	client, err := r.newClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := client.(*redis.ClusterClient); !ok {
		t.Fatalf("several addresses gave a %T, want a cluster client", client)
	}
	_ = client.Close() // never connected: nothing to report
	for name, bad := range map[string]RedisConfig{
		"url and more":    {URL: "redis://u:s3cret-pw@h/0", Password: "s3cret-pw"},
		"nothing":         {Username: "u"},
		"db with cluster": {Addresses: []string{"a:1", "b:2"}, DB: 1, Password: "s3cret-pw"},
	} {
		_, err := bad.resolve(repl)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error carries the secret: %v", name, err)
		}
	}
	one, _ := RedisConfig{Addresses: []string{"127.0.0.1:1"}}.newClient()
	if _, ok := one.(*redis.Client); !ok {
		t.Fatalf("one address gave a %T, want a plain client", one)
	}
	_ = one.Close() // never connected: nothing to report
	// With master_name, even several addresses are sentinels, not a cluster.
	failover, _ := RedisConfig{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}, MasterName: "m"}.newClient()
	if _, ok := failover.(*redis.Client); !ok {
		t.Fatalf("sentinel config gave a %T, want a failover client", failover)
	}
	_ = failover.Close() // never connected: nothing to report
}
