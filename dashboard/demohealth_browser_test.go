package dashboard_test

import (
	"net/http"
	"testing"

	"github.com/wabarelay/wabarelay/dashboard"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestBrowserDemoLayout: the Demo page, with its health and window buttons for a channel with a
// long name, fits a 375 px phone and a 1280 px desktop (no sideways scrolling, nothing out of
// its card); screenshots of each.
func TestBrowserDemoLayout(t *testing.T) {
	t.Parallel()
	e, b := newBrowserEnv(t, func(o *dashboard.Options) {
		o.Demo = &dashboard.Demo{FakeUpstream: "http://127.0.0.1:1", Receiver: "https://127.0.0.1:1", Relay: "http://127.0.0.1:1/upstream-proxy"}
	})
	e.Channel(t, e.org.ID, &testenv.ChannelOpts{Name: "Sales and after-sales service, Europe", Connection: e.Connection()})
	// The screens only read the data: they run in parallel.
	for _, v := range viewports {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			p := v.page(t, b)
			signIn(t, p, e, e.key)
			if resp := p.Navigate(t, e.srv.URL+"/dashboard/demo"); int(resp.Status) != http.StatusOK {
				t.Fatalf("demo page: HTTP %d", resp.Status)
			}
			checkLayout(t, p, "demo", v)
			p.AssertNoConsoleErrors(t)
		})
	}
}
