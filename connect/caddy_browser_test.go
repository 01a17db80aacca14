package connect_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/browsertest"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestBrowserRealCaddy runs the whole connection in headless Chromium against the real Caddy
// build: the connect link served by wabarelay_connect, the page loading a local stub of the
// upstream SDK that plays the FINISH event, the completion against the fake upstream; then the
// channel is active. Screenshots: artifacts/caddy-connect-{page,success,expired}.png.
func TestBrowserRealCaddy(t *testing.T) {
	t.Parallel()
	browsertest.ChromiumPath(t) // fails (or skips locally) before anything is started
	const code, token = "es-code-1", "EAAGbusinessFromSignup"
	w := newWorld(t, "")
	w.fake.AddToken(token, []string{pnid}, []string{waba})
	sdk := httptest.NewServer(http.FileServer(http.Dir("testdata")))
	t.Cleanup(sdk.Close)

	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	testenv.StartCaddy(t, fmt.Sprintf(`{
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
}`, w.fake.URL(), base, appID, appSecret, configID, sdk.URL, base), "WBR_TEST_DATABASE="+w.DSN, "WBR_TEST_KEY="+w.KeyB64)
	ch := w.channel()
	// The code's lifetime starts once Caddy runs, as a code handed to a browser would.
	w.fake.AddCode(code, token, 5*time.Minute)

	b := browsertest.Shared(t)
	runConnectFlow(t, b, base+"/connect/"+ch.ChannelToken, flowCase{
		Stub:      stubConfig{PhoneNumberID: pnid, WABAID: waba, Code: code},
		WantState: "success", WantText: []string{"WhatsApp is connected"},
		PageShot: "caddy-connect-page.png", ResultShot: "caddy-connect-success.png",
	}, func(t *testing.T, res flowResult) {
		got := w.get(ch.ID)
		if got.Status != "active" || got.WabaID == nil || *got.WabaID != waba || got.PhoneNumberID == nil || *got.PhoneNumberID != pnid {
			t.Fatalf("channel after the browser flow: %+v", got)
		}
		if sub, _ := w.fake.Subscribed(waba); !sub {
			t.Fatal("app not subscribed")
		}
	})
	checkExpiredPage(t, b, base+"/connect/"+ch.ChannelToken, "caddy-connect-expired.png", "Support line")
}
