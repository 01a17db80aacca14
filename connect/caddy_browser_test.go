package connect_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/jackc/pgx/v5/pgxpool"

	_ "github.com/wabarelay/wabarelay/caddymodule"
	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

// TestBrowserRealCaddy runs the whole connection in headless Chromium against the real Caddy
// build: the connect link served by wabarelay_connect, the page loading a local stub of the
// upstream SDK that plays the FINISH event, the completion against the fake upstream; then the
// channel is active. Screenshots: artifacts/caddy-connect-{page,success,expired}.png.
func TestBrowserRealCaddy(t *testing.T) {
	browsertest.ChromiumPath(t) // fails (or skips locally) before anything is started
	const code, token = "es-code-1", "EAAGbusinessFromSignup"
	fake := fakegraph.New(fakegraph.WithAppID(appID), fakegraph.WithAppSecret(appSecret))
	fake.Start()
	t.Cleanup(fake.Close)
	fake.AddNumber(pnid, waba, "+1 555-010-0100", "Acme Support")
	fake.AddToken(token, []string{pnid}, []string{waba})
	fake.AddCode(code, token, 5*time.Minute)
	sdk := httptest.NewServer(http.FileServer(http.Dir("testdata")))
	t.Cleanup(sdk.Close)

	dsn := testenv.Postgres(t)
	key := make([]byte, 32)
	rand.Read(key)
	t.Setenv("WBR_TEST_DATABASE", dsn)
	t.Setenv("WBR_TEST_KEY", base64.StdEncoding.EncodeToString(key))
	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(fmt.Sprintf(`{
	admin off
	persist_config off
	wabarelay {
		database       {env.WBR_TEST_DATABASE}
		encryption_key {env.WBR_TEST_KEY}
		upstream       %s/v26.0
		connect_base   %s
		meta {
			app_id     %s
			app_secret %s
			config_id  %s
			sdk_url    %s/stub-sdk.js
		}
	}
}
%s {
	handle /connect/* {
		wabarelay_connect {
			origin_suffix 127.0.0.1
		}
	}
}`, fake.URL(), base, appID, appSecret, configID, sdk.URL, base)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })

	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	box, _ := secretbox.New(key)
	st := store.New(pool, box)
	org, _ := st.CreateOrg(context.Background(), "Acme")
	ch, err := st.CreateChannel(context.Background(), org.ID, "Support line", time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	b := browsertest.Start(t)
	runConnectFlow(t, b, base+"/connect/"+ch.ChannelToken, flowCase{
		Stub:      stubConfig{PhoneNumberID: pnid, WABAID: waba, Code: code},
		WantState: "success", WantText: []string{"WhatsApp is connected"},
		PageShot: "caddy-connect-page.png", ResultShot: "caddy-connect-success.png",
	}, func(t *testing.T, res flowResult) {
		got, err := st.GetChannel(context.Background(), org.ID, ch.ID)
		if err != nil || got.Status != "active" || got.WabaID == nil || *got.WabaID != waba || got.PhoneNumberID == nil || *got.PhoneNumberID != pnid {
			t.Fatalf("channel after the browser flow: %+v %v", got, err)
		}
		if sub, _ := fake.Subscribed(waba); !sub {
			t.Fatal("app not subscribed")
		}
	})
	checkExpiredPage(t, b, base+"/connect/"+ch.ChannelToken, "caddy-connect-expired.png", "Support line")
}
