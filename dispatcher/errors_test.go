package dispatcher

import (
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// internalText matches what a delivery log must never show a tenant: an IPv4 or IPv6 address,
// an address with a port, or the resolver's wording.
var internalText = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+|\[?[0-9a-fA-F]*:[0-9a-fA-F:]+\]?|:\d+|lookup|no such host|dial|127\.|\.invalid`)

// closedPort returns an address on which nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestDeliveryErrorsAreClassified: every kind of failed attempt, against a real listener, is
// shown in the delivery log (the attempt's error and the delivery's last error) as its class
// only, with no address or resolver text; the full error is in the operator's log.
func TestDeliveryErrorsAreClassified(t *testing.T) {
	selfSigned := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(selfSigned.Close)
	status500 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(status500.Close)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://10.0.0.1/elsewhere", http.StatusFound)
	}))
	t.Cleanup(redirect.Close)

	hanging, _ := hangingListener(t)
	cases := []struct {
		name, url, want string
		allowPrivate    bool
	}{
		{"closed port", "http://" + closedPort(t) + "/hook", ClassConnectionRefused, true},
		{"unresolvable host", "https://wabarelay-test.invalid/hook", ClassDNS, true},
		{"self-signed certificate", selfSigned.URL + "/hook", ClassTLS, true},
		{"never answers", hanging, ClassTimeout, true},
		{"status 500", status500.URL + "/hook", "http_500", true},
		{"redirect", redirect.URL + "/hook", "http_302", true},
		{"private address refused", status500.URL + "/hook", ClassAddressNotAllowed, false},
		// An internal name that resolves (to a refused address) is told like one that does not.
		{"internal name refused", "http://localhost:" + status500.URL[strings.LastIndexByte(status500.URL, ':')+1:] + "/hook", ClassDNS, false},
		{"unresolvable host, private targets refused", "https://wabarelay-test.invalid/hook", ClassDNS, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.webhook(c.url)
			ids := e.events(1)
			core, logs := observer.New(zapcore.DebugLevel)
			timeout := time.Second
			if c.want == ClassTimeout {
				timeout = 200 * time.Millisecond // (what the case waits for: nothing else can end it)
			}
			cfg := Config{RetryDelays: []time.Duration{}, Timeout: timeout, Lease: 30 * time.Second,
				PollInterval: 50 * time.Millisecond, AllowPrivateTargets: c.allowPrivate, InstanceID: "test-" + uuid.NewString()[:6]}
			e.launch(e.st.WebhookSecret, cfg, zap.New(core))

			testenv.Eventually(t, patience, e.statusIs(ids[0], "failed"), "failed")
			at := e.attemptRows(ids[0])
			row := e.delivery(ids[0])
			if len(at) != 1 || at[0].err == nil || row.lastErr == nil {
				t.Fatalf("attempts %+v, delivery %+v", at, row)
			}
			for _, got := range []string{*at[0].err, *row.lastErr} {
				if got != c.want {
					t.Errorf("delivery log error %q, want %q", got, c.want)
				}
				if internalText.MatchString(got) {
					t.Errorf("delivery log error %q shows an address or resolver text", got)
				}
			}
			// The operator's log has the full error.
			failed := logs.FilterMessageSnippet("delivery attempt failed").All()
			if len(failed) == 0 {
				t.Fatal("no log line for the failed attempt")
			}
			fields := failed[0].ContextMap()
			if fields["class"] != c.want || fields["error"] == "" || fields["error"] == c.want {
				t.Errorf("operator log fields %v", fields)
			}
			t.Logf("tenant sees %q; operator log: %v", *row.lastErr, fields["error"])
		})
	}
}

// TestClassifyHidesWhetherNamesResolve: with private targets refused, the class of a failed
// request (made by the delivery client itself, against real names and a real listener) does
// not tell whether a host name resolves: a name of this host that resolves to a refused
// address (localhost) and a name that resolves nowhere get the same class, dns_error. An
// address named in the URL itself is address_not_allowed: that says nothing the URL did not.
func TestClassifyHidesWhetherNamesResolve(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a request reached a refused address")
	}))
	t.Cleanup(srv.Close)
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	if addrs, err := net.LookupHost("localhost"); err != nil || len(addrs) == 0 {
		t.Fatalf("localhost does not resolve here (%v): the test needs a name that does", err)
	}
	client := newClient(Config{Timeout: 5 * time.Second, Workers: 1})
	class := func(url string) string {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: answered %d; want a refused dial", url, resp.StatusCode)
		}
		return classify(err, req.URL.Hostname())
	}
	resolves := class("http://localhost:" + port + "/hook")
	unresolvable := class("http://wabarelay-test.invalid:" + port + "/hook")
	if resolves != unresolvable || resolves != ClassDNS {
		t.Errorf("a name that resolves to a refused address: %q, a name that does not resolve: %q; want both %q",
			resolves, unresolvable, ClassDNS)
	}
	for _, literal := range []string{"http://127.0.0.1:" + port + "/hook", "http://[::1]:" + port + "/hook"} {
		if got := class(literal); got != ClassAddressNotAllowed {
			t.Errorf("%s: %q, want %q", literal, got, ClassAddressNotAllowed)
		}
	}
}
