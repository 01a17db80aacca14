package e2e

import (
	"net"
	"net/http"
	"testing"
)

// TestConnectCookieSecureThroughTrustedProxy: behind a TLS-terminating proxy that Caddy trusts
// (`trusted_proxies`), the connect cookie is Secure when the proxy says the client used HTTPS;
// the same header from an untrusted peer changes nothing.
func TestConnectCookieSecureThroughTrustedProxy(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	origin := e.caddySite(`servers {
		trusted_proxies static 127.0.0.2/32
	}`, "", e.fake.URL(), `handle /connect/* {
		wabarelay_connect
	}`)
	ch := e.channel(false)
	from := func(ip string) bool {
		t.Helper()
		client := &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport:     &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext},
		}
		req, _ := http.NewRequest("GET", origin+"/connect/"+ch.ChannelToken, nil)
		req.Header.Set("X-Forwarded-Proto", "https")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
			t.Fatalf("from %s: %d %v", ip, resp.StatusCode, resp.Header)
		}
		return resp.Cookies()[0].Secure
	}
	if !from("127.0.0.2") {
		t.Error("trusted proxy said https: cookie not Secure")
	}
	if from("127.0.0.1") {
		t.Error("untrusted peer's X-Forwarded-Proto made the cookie Secure")
	}
}
