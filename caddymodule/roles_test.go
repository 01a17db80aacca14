package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestAdaptDeliveryWorkers: `workers 0` survives the Caddyfile adapter as "workers":0 (it is
// not the unset default), an unset workers is absent from the JSON, and a negative count is
// refused by the adapter and, given as JSON, by Validate.
func TestAdaptDeliveryWorkers(t *testing.T) {
	delivery := func(block string) string {
		t.Helper()
		cfg := adapt(t, "{\n\twabarelay {\n\t\tdatabase {env.DB}\n\t\tdelivery {\n"+block+"\n\t\t}\n\t}\n}\n:80 {\n\trespond ok\n}")
		var parsed struct {
			Apps struct {
				Wabarelay struct {
					Delivery json.RawMessage `json:"delivery"`
				} `json:"wabarelay"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(cfg, &parsed); err != nil {
			t.Fatal(err)
		}
		return string(parsed.Apps.Wabarelay.Delivery)
	}
	if got := delivery("workers 0"); got != `{"workers":0}` {
		t.Errorf("workers 0 adapts to %s, want {\"workers\":0}", got)
	}
	if got := delivery("workers 12"); got != `{"workers":12}` {
		t.Errorf("workers 12 adapts to %s", got)
	}
	if got := delivery("timeout 5s"); got != `{"timeout":5000000000}` {
		t.Errorf("unset workers adapts to %s, want no workers key", got)
	}
	for _, bad := range []string{"workers -1", "workers", "workers 1 2", "workers x"} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n wabarelay {\n delivery {\n "+bad+"\n }\n }\n}\n:80 {\n respond ok\n}"), nil)
		if err == nil {
			t.Errorf("adapted %q", bad)
		}
	}

	// JSON config (what the adapter produces, or written by hand)
	for raw, want := range map[string]string{
		`{"delivery":{"workers":0}}`:  "",
		`{"delivery":{"workers":64}}`: "",
		`{"delivery":{}}`:             "",
		`{"delivery":{"workers":-1}}`: "delivery: workers must be 0 (no dispatcher on this instance) or more, got -1",
		// the dispatcher's lease rule (dispatcher.Config.Validate), the default timeout 10s
		`{"delivery":{"lease":5000000000}}`: "delivery: dispatcher: lease 5s must exceed the attempt timeout 10s",
		// max_hold must be shorter than the (default 720h) retention
		`{"delivery":{"max_hold":2592000000000000}}`:                           "delivery: max_hold must be shorter than retention",
		`{"delivery":{"retention":604800000000000,"max_hold":86400000000000}}`: "",
		`{"delivery":{"retention":604800000000000}}`:                           "", // max_hold then defaults to 144h
	} {
		var a App
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			t.Fatal(err)
		}
		err := a.Validate()
		if got := fmt.Sprint(err); (want == "" && err != nil) || (want != "" && got != want) {
			t.Errorf("Validate(%s) = %v, want %q", raw, err, want)
		}
	}
	var a App
	if err := json.Unmarshal([]byte(`{"delivery":{"workers":0}}`), &a); err != nil {
		t.Fatal(err)
	}
	if a.Delivery.Workers == nil || *a.Delivery.Workers != 0 {
		t.Fatalf(`"workers":0 unmarshals to %v, want a pointer to 0`, a.Delivery.Workers)
	}
}

// TestRolesReloadNoDispatcher: in process, an app with workers 0 starts no dispatcher, serves the
// API and reports healthy; reloads from a dispatcher to none and back (each stopping the old
// config's app, with or without a dispatcher) and a final stop succeed, with one pool reference.
// Not parallel: it loads Caddy in process and reads the running app and its pool references.
func TestRolesReloadNoDispatcher(t *testing.T) {
	in := startInstance(t) // default delivery: a dispatcher
	running := func() *App {
		t.Helper()
		a, err := caddy.ActiveContext().AppIfConfigured("wabarelay")
		if err != nil {
			t.Fatal(err)
		}
		return a.(*App)
	}
	if running().dispatcher == nil {
		t.Fatal("default delivery settings started no dispatcher")
	}
	for i, tc := range []struct {
		extra string
		want  bool // a dispatcher
	}{
		{"delivery {\n workers 0\n}", false},
		{"", true},
		{"delivery {\n workers 0\n timeout 5s\n}", false},
	} {
		in.load(caddyfileFor(in.port, tc.extra))
		app := running()
		if got := app.dispatcher != nil; got != tc.want {
			t.Fatalf("reload %d (%q): dispatcher running = %v, want %v", i, tc.extra, got, tc.want)
		}
		if (app.dispatcherDone != nil) != tc.want {
			t.Fatalf("reload %d: dispatcherDone set = %v", i, app.dispatcherDone != nil)
		}
		if err := app.Health(context.Background()); err != nil {
			t.Fatalf("reload %d: health: %v", i, err)
		}
		if status, body, err := in.request("GET", "/v1/channels", ""); err != nil || status != 200 {
			t.Fatalf("reload %d: API: %d %s %v", i, status, body, err)
		}
	}
	if n := poolRefs(t, in.dsn); n != 1 {
		t.Fatalf("pool references after reloads = %d, want 1", n)
	}
	start := time.Now()
	if err := caddy.Stop(); err != nil {
		t.Fatalf("stop with no dispatcher: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("stop with no dispatcher took %v", took)
	}
}
