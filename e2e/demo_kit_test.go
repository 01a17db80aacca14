package e2e

import (
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// The demo of `make run` without a Meta app (scripts/dev.sh): the repo's Caddyfile with these
// settings, against the fake upstream with its demo SDK and callback.
const (
	demoAppID     = "demo-app"
	demoAppSecret = "demo-app-secret"
)

// demoWorld is the repo's Caddyfile as the demo runs it, with a fake upstream and a receiver.
type demoWorld struct {
	*relayEnv
	origin   string // Caddy, http://localhost:<port>
	fake     *fakegraph.Server
	apiKey   string
	recv     *testenv.Receiver // the webhook receiver
	seen     int               // deliveries nextDelivery handed out
	receiver string            // its URL
	// fakeReceiver is the fake's own receiver (cmd/fakegraph -receiver), which the dashboard's
	// demo page reads.
	fakeReceiver string
}

// startDemo runs the repo's Caddyfile (only its port changed) with the environment
// scripts/dev.sh exports in demo mode; opts are added to the fake upstream's.
func startDemo(t *testing.T, opts ...fakegraph.Option) *demoWorld {
	t.Helper()
	w := &demoWorld{relayEnv: newRelayEnv(t)}
	port := testenv.FreePort(t)
	w.origin = "http://localhost:" + strconv.Itoa(port) // repoCaddy's, known to the fake before Caddy starts

	// the fake upstream as scripts/dev.sh starts it (cmd/fakegraph -app-id -app-secret -callback)
	w.fake = fakegraph.New(append([]fakegraph.Option{fakegraph.WithAppID(demoAppID), fakegraph.WithAppSecret(demoAppSecret),
		fakegraph.WithDemoSDK(0, fakegraph.Template{Name: "hello_world", Language: "en_US", Status: "APPROVED", Category: "UTILITY"}),
		fakegraph.WithCallback(w.origin + "/webhooks/upstream")}, opts...)...)
	w.fake.Start()
	t.Cleanup(w.fake.Close)

	// a webhook receiver on loopback over HTTPS, its certificate given as root_ca
	w.recv = testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true,
		Respond: func(_ int, rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusNoContent) }})
	w.receiver = w.recv.URL + "/receiver"
	// and the fake's receiver (cmd/fakegraph -receiver -receiver-ca): root_ca holds both CAs
	dir := t.TempDir()
	fakeCA := filepath.Join(dir, "fake-receiver-ca.pem")
	fakeRecv, fakeRecvSrv, err := fakegraph.ListenTLS("127.0.0.1:0", fakeCA, &fakegraph.Receiver{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fakeRecvSrv.Close() }) // the test is over: nothing is left to tell
	w.fakeReceiver = fakeRecv
	fakePEM, err := os.ReadFile(fakeCA)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "receiver-ca.pem")
	if err := os.WriteFile(caFile, append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.recv.Certificate().Raw}), fakePEM...), 0o600); err != nil {
		t.Fatal(err)
	}

	w.repoCaddy(port, nil,
		"WABARELAY_UPSTREAM="+w.fake.URL()+"/v26.0",
		"META_APP_ID="+demoAppID, "META_APP_SECRET="+demoAppSecret, "META_CONFIG_ID=demo-config", "META_VERIFY_TOKEN=demo-verify",
		"WABARELAY_SDK_URL="+w.fake.URL()+"/sdk.js",
		"WABARELAY_CONNECT_ORIGIN_SUFFIX=localhost",
		"WABARELAY_ALLOW_PRIVATE_TARGETS=true",
		"WABARELAY_DELIVERY_ROOT_CA="+caFile,
		"WABARELAY_DEMO_FAKE_UPSTREAM="+w.fake.URL(), "WABARELAY_DEMO_RECEIVER="+w.fakeReceiver)
	_, w.apiKey = w.fix.APIKey(t, w.org, &testenv.APIKeyOpts{Name: "demo"})
	return w
}

// api calls the management API with the demo key.
func (w *demoWorld) api(method, path, body string) relayResp {
	w.t.Helper()
	req, _ := http.NewRequest(method, w.origin+"/v1"+path, strings.NewReader(body))
	req.Header.Set("x-api-key", w.apiKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return do(w.t, req)
}

type demoChannel struct {
	ID                 string  `json:"id"`
	Status             string  `json:"status"`
	ChannelToken       string  `json:"channel_token"`
	ConnectURL         string  `json:"connect_url"`
	PhoneNumberID      *string `json:"phone_number_id"`
	WabaID             *string `json:"waba_id"`
	DisplayPhoneNumber *string `json:"display_phone_number"`
}

// sdkSignup loads the demo SDK as the connect page does and returns the signup written into it.
func (w *demoWorld) sdkSignup(sdkURL string) fakegraph.Signup {
	w.t.Helper()
	r := call(w.t, "GET", sdkURL, "", "")
	m := regexp.MustCompile(`var SIGNUP = (\{.*\});`).FindSubmatch(r.body)
	var su fakegraph.Signup
	if r.status != 200 || m == nil || json.Unmarshal(m[1], &su) != nil || su.Code == "" {
		w.t.Fatalf("sdk.js: %d %.300s", r.status, r.body)
	}
	return su
}

// nextDelivery waits for the receiver's next delivery and returns its body.
func (w *demoWorld) nextDelivery(t *testing.T) []byte {
	t.Helper()
	w.seen++
	return w.recv.WaitN(t, w.seen)[w.seen-1].Body
}

// dashboardClient is a signed-in dashboard session on the demo's Caddy (a cookie-keeping client
// posting forms as the browser does).
type dashboardClient struct {
	t      *testing.T
	origin string
	http   *http.Client
}

func (w *demoWorld) signIn(t *testing.T) *dashboardClient {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &dashboardClient{t: t, origin: w.origin, http: &http.Client{Jar: jar, Timeout: 60 * time.Second}}
	if st, b := c.do("POST", "/dashboard/login", url.Values{"api_key": {w.apiKey}}); st != 200 || !strings.Contains(b, ">Demo</a>") {
		t.Fatalf("sign-in: %d %.400s", st, b)
	}
	return c
}

// do sends a request (a form post when form is set) and returns the status and the page.
func (c *dashboardClient) do(method, path string, form url.Values) (int, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, c.origin+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connectChannel creates a channel through the API and connects a number the demo SDK made up.
func (w *demoWorld) connectChannel(t *testing.T, name string) (demoChannel, fakegraph.Signup) {
	t.Helper()
	r := w.api("POST", "/channels", `{"name":"`+name+`"}`)
	var ch demoChannel
	if r.status != 201 || json.Unmarshal(r.body, &ch) != nil {
		t.Fatalf("create channel: %d %s", r.status, r.body)
	}
	su := w.sdkSignup(w.fake.URL() + "/sdk.js")
	if r := call(t, "POST", w.origin+"/connect/"+ch.ChannelToken, "",
		`{"code":"`+su.Code+`","phone_number_id":"`+su.PhoneNumberID+`","waba_id":"`+su.WabaID+`"}`); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	return ch, su
}
