package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/wabarelay/wabarelay/broadcast"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/relay"
	"github.com/wabarelay/wabarelay/store"
)

// TestBroadcastsCaddyfileOption: `broadcasts { workers <n> lease <d> }` adapts to the JSON
// `broadcasts: {workers, lease}` (workers 0 kept: this instance sends none); bad values are
// refused by the adapter and, given as JSON, by Validate, naming the option.
func TestBroadcastsCaddyfileOption(t *testing.T) {
	cfg := func(block string) string {
		block = "\t\t\t" + strings.ReplaceAll(strings.TrimSpace(block), "\n", "\n\t\t\t")
		return "{\n\twabarelay {\n\t\tdatabase {env.DB}\n\t\tbroadcasts {\n" + block + "\n\t\t}\n\t}\n}\n:80 {\n\trespond ok\n}\n"
	}
	for block, want := range map[string]string{
		"workers 0":             `{"workers":0}`,
		"workers 8\nlease 5m":   `{"workers":8,"lease":300000000000}`,
		"lease 91s":             `{"lease":91000000000}`,
		"":                      `{}`,
		"workers 1\nworkers 2":  `{"workers":2}`,
		"lease 2m\nworkers 16 ": `{"workers":16,"lease":120000000000}`,
	} {
		var parsed struct {
			Apps struct {
				Wabarelay struct {
					Broadcasts json.RawMessage `json:"broadcasts"`
				} `json:"wabarelay"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(adapt(t, cfg(block)), &parsed); err != nil || string(parsed.Apps.Wabarelay.Broadcasts) != want {
			t.Errorf("broadcasts { %s }: adapted to %s (%v), want %s", block, parsed.Apps.Wabarelay.Broadcasts, err, want)
		}
	}
	for _, block := range []string{"workers -1", "workers many", "workers", "lease soon", "lease 0s", "rate 5"} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg(block)), nil)
		if err == nil {
			t.Errorf("broadcasts { %s }: adapted", block)
		}
	}
	neg, zero := -1, 0
	for _, c := range []struct {
		cfg  BroadcastsConfig
		want string
	}{
		{BroadcastsConfig{Workers: &neg}, "broadcasts: workers must be 0"},
		{BroadcastsConfig{Lease: caddy.Duration(90 * time.Second)}, "broadcasts: lease must be longer than the relay's send deadline (1m30s)"},
		{BroadcastsConfig{Workers: &zero, Lease: caddy.Duration(time.Minute)}, "broadcasts: lease"},
	} {
		err := (&App{Broadcasts: &c.cfg}).Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate %+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	if err := (&App{Broadcasts: &BroadcastsConfig{Workers: &zero, Lease: caddy.Duration(3 * time.Minute)}}).Validate(); err != nil {
		t.Errorf("Validate workers 0 lease 3m: %v", err)
	}
}

// TestBroadcastsConfigAndRelayRegistration: the worker's configuration (defaults left to package
// broadcast; workers 0: none), and the relay limit per minute registered by the first relay
// handler (0 without one).
func TestBroadcastsConfigAndRelayRegistration(t *testing.T) {
	zero, six := 0, 6
	for _, c := range []struct {
		cfg  *BroadcastsConfig
		want broadcast.Config
		run  bool
	}{
		{nil, broadcast.Config{}, true},
		{&BroadcastsConfig{Workers: &zero}, broadcast.Config{}, false},
		{&BroadcastsConfig{Workers: &six, Lease: caddy.Duration(3 * time.Minute)}, broadcast.Config{Workers: 6, Lease: 3 * time.Minute}, true},
	} {
		got, run := (&App{Broadcasts: c.cfg}).broadcastConfig()
		if got != c.want || run != c.run {
			t.Errorf("%+v: %+v %v, want %+v %v", c.cfg, got, run, c.want, c.run)
		}
	}

	a := &App{}
	if n := a.relayLimitPerMinute(); n != 0 {
		t.Fatalf("no relay handler: %d", n)
	}
	first, second := &relay.Relay{}, &relay.Relay{}
	a.registerRelay(first, 10, time.Second)
	a.registerRelay(second, 100, time.Minute)
	if a.sender.relay != first || a.relayLimitPerMinute() != 600 {
		t.Fatalf("first relay handler should win: %d", a.relayLimitPerMinute())
	}
	b := &App{}
	b.registerRelay(first, 100, time.Hour)
	if n := b.relayLimitPerMinute(); n != 1 {
		t.Fatalf("100 per hour: %d per minute, want 1 (at least 1)", n)
	}
}

// TestBroadcastsUpstream: the broadcasts' upstream call goes to the app's upstream host with the
// prepared request, copies the answer, and reports a refused connection as a dial error (nothing
// sent) and a timeout as relay.ErrUpstreamTimeout.
func TestBroadcastsUpstream(t *testing.T) {
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.Write([]byte(`{"messages":[{"id":"wamid.X"}]}`))
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL + "/v26.0")
	a := &App{upstream: u}
	up := a.broadcastUpstream(newUpstreamClient())
	r := httptest.NewRequest("POST", "/v26.0/1001/messages", strings.NewReader(`{}`))
	r.Header.Set("Authorization", "Bearer EAAG")
	w := httptest.NewRecorder()
	if err := up(w, r); err != nil || w.Code != 200 || w.Body.String() != `{"messages":[{"id":"wamid.X"}]}` {
		t.Fatalf("answer %d %s, %v", w.Code, w.Body, err)
	}
	if got.URL.Path != "/v26.0/1001/messages" || got.Header.Get("Authorization") != "Bearer EAAG" {
		t.Fatalf("upstream got %s %q", got.URL.Path, got.Header.Get("Authorization"))
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens: refused
	a.upstream, _ = url.Parse("http://" + addr + "/v26.0")
	var op *net.OpError
	if err := up(httptest.NewRecorder(), httptest.NewRequest("POST", "/v26.0/1001/messages", nil)); !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("refused connection: %v", err)
	}

	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer slow.Close()
	a.upstream, _ = url.Parse(slow.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = up(httptest.NewRecorder(), httptest.NewRequest("POST", "/v26.0/1001/messages", nil).WithContext(ctx))
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, relay.ErrUpstreamTimeout) {
		t.Fatalf("timeout: %v", err)
	}
}

// TestBroadcastsThroughTheRelayHandler: with a wabarelay_proxy handler in the configuration,
// the app's sender sends a broadcast's recipients through it to the app's upstream with the
// channel's access token, each once, and each send is in the relay log with its recipient and
// wamid (so on the timeline). With workers 0 the instance sends none.
func TestBroadcastsThroughTheRelayHandler(t *testing.T) {
	f := testenv.NewStore(t)
	fake := fakegraph.New(fakegraph.WithPlainJSON())
	fakeURL := fake.Start()
	t.Cleanup(fake.Close)
	conn := f.Connection()
	conn.UpstreamToken = "EAAGbroadcastToken0123456789"
	fake.AddNumber(conn.PhoneNumberID, conn.WabaID, "+1 555 0100", "Acme")
	fake.AddToken(conn.UpstreamToken, []string{conn.PhoneNumberID}, []string{conn.WabaID})
	fake.AddTemplates(conn.WabaID, fakegraph.Template{ID: "t1", Name: "hello_world", Status: "APPROVED", Category: "UTILITY", Language: "en_US"})
	org := f.Org(t)
	ch := f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: conn})
	t.Setenv("WBR_TEST_DATABASE", f.DSN)
	t.Setenv("WBR_TEST_KEY", f.KeyB64)
	port := testenv.FreePort(t)
	config := func(workers int) string {
		return fmt.Sprintf(`{
	admin off
	persist_config off
	wabarelay {
		database       {env.WBR_TEST_DATABASE}
		encryption_key {env.WBR_TEST_KEY}
		upstream       %s/%s
		relay_log {
			interval 50ms
		}
		broadcasts {
			workers %d
		}
	}
}
http://127.0.0.1:%d {
	handle_path /upstream-proxy/* {
		wabarelay_proxy {
			rate_limit 1000
		}
	}
}`, fakeURL, fake.Version(), workers, port)
	}
	if err := caddy.Load(adapt(t, config(0)), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	create := func(to ...string) store.Broadcast {
		nb := store.NewBroadcast{Name: "b", RatePerMinute: 6000, StartAt: time.Now(),
			Template: json.RawMessage(`{"name":"hello_world","language":{"code":"en_US"}}`)}
		for _, n := range to {
			nb.Recipients = append(nb.Recipients, store.NewRecipient{To: n})
		}
		b, err := f.Store.CreateBroadcast(context.Background(), org.ID, ch.ID, nb)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := create("15550001", "15550002", "15550003")
	time.Sleep(1500 * time.Millisecond) // (an absence: nothing would tell of a send that does not happen)
	if n := len(fake.RequestsTo("POST", "/messages")); n != 0 {
		t.Fatalf("workers 0: %d sends", n)
	}

	if err := caddy.Load(adapt(t, config(2)), true); err != nil {
		t.Fatal(err)
	}
	var got store.Broadcast
	testenv.Eventually(t, 15*time.Second, func() bool {
		var err error
		if got, err = f.Store.GetBroadcast(context.Background(), org.ID, b.ID); err != nil {
			t.Fatal(err)
		}
		return got.Status == store.BroadcastCompleted
	}, "broadcast not completed (%d sends upstream)", len(fake.RequestsTo("POST", "/messages")))
	if got.Counts.Accepted != 3 {
		t.Fatalf("counts %+v", got.Counts)
	}
	// An upstream error fails its recipient with the error's code and title (the answer inspected
	// on the app's relay).
	fake.FailNext("POST /"+conn.PhoneNumberID+"/messages", 1, 0, fakegraph.ErrReengagement())
	c := create("15550009")
	var rs []store.BroadcastRecipient
	testenv.Eventually(t, 15*time.Second, func() bool {
		var err error
		if rs, err = f.Store.BroadcastRecipients(context.Background(), org.ID, c.ID, "", 0, 10); err != nil {
			t.Fatal(err)
		}
		return len(rs) == 1 && rs[0].Status == "failed"
	}, "recipient not failed")
	if rs[0].ErrorCode != 131047 || rs[0].ErrorTitle != "Re-engagement message" {
		t.Fatalf("failed recipient %+v", rs[0])
	}
	sends := fake.RequestsTo("POST", "/"+conn.PhoneNumberID+"/messages")
	sends = sends[:len(sends)-1] // the failed one's
	if len(sends) != 3 {
		t.Fatalf("%d sends upstream, want 3", len(sends))
	}
	for _, s := range sends {
		if s.Header.Get("Authorization") != "Bearer "+conn.UpstreamToken || !strings.HasPrefix(s.Path, "/"+fake.Version()+"/") {
			t.Fatalf("upstream send %s with Authorization %q", s.Path, s.Header.Get("Authorization"))
		}
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		var logged int
		err := f.Pool.QueryRow(context.Background(), `SELECT count(*) FROM relay_log
			WHERE channel_id = $1 AND status = 200 AND wamid IS NOT NULL AND recipient LIKE '1555000%'`, ch.ID).Scan(&logged)
		if err != nil {
			t.Fatal(err)
		}
		return logged == 3
	}, "3 sends in the relay log")
}
