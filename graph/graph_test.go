package graph

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

// Distinctive values, so a leak is unmistakable in any error text.
const (
	appID     = "880001234567"
	appSecret = "s3cr3t-app-secret-Qz7"
	theCode   = "AQcode-Zx81-signup"
	theToken  = "EAAtoken-Lk42-business"
	thePIN    = "493817"
	pnid      = "106540352242922"
	wabaID    = "102290129340398"
)

var allSecrets = []string{appSecret, theCode, theToken, thePIN,
	url.QueryEscape(appSecret), url.QueryEscape(theCode), url.QueryEscape(theToken)}

// noSecrets fails when err's text, in any form and anywhere in its chain, holds a secret.
func noSecrets(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("expected an error")
	}
	var texts []string
	for e := err; e != nil; e = errors.Unwrap(e) {
		texts = append(texts, e.Error(), fmt.Sprintf("%v", e), fmt.Sprintf("%+v", e), fmt.Sprintf("%#v", e))
	}
	if ge, ok := errors.AsType[*Error](err); ok {
		texts = append(texts, fmt.Sprintf("%#v", *ge))
	}
	for _, s := range texts {
		for _, sec := range allSecrets {
			if strings.Contains(s, sec) {
				t.Fatalf("error text leaks secret %q: %s", sec, s)
			}
		}
	}
}

type fixture struct {
	g *fakegraph.Server
	c *Client
}

func setup(t *testing.T, opts ...fakegraph.Option) fixture {
	t.Helper()
	opts = append([]fakegraph.Option{fakegraph.WithAppID(appID), fakegraph.WithAppSecret(appSecret)}, opts...)
	g := fakegraph.New(opts...)
	base := g.Start()
	t.Cleanup(g.Close)
	g.AddNumber(pnid, wabaID, "+1 555-0100", "Lucky Shrub")
	g.AddToken(theToken, nil, []string{wabaID})
	return fixture{g: g, c: New(base+"/"+g.Version()+"/", nil)}
}

func asError(t *testing.T, err error) *Error {
	t.Helper()
	noSecrets(t, err)
	ge, ok := errors.AsType[*Error](err)
	if !ok {
		t.Fatalf("want *Error, got %T: %v", err, err)
	}
	return ge
}

func lastRequest(t *testing.T, g *fakegraph.Server) fakegraph.Request {
	t.Helper()
	rs := g.Requests()
	if len(rs) == 0 {
		t.Fatal("the fake received no request")
	}
	return rs[len(rs)-1]
}

func TestNewDefaults(t *testing.T) {
	c := New("https://graph.facebook.com/v26.0/", nil)
	if c.base != "https://graph.facebook.com/v26.0" {
		t.Fatalf("base = %q", c.base)
	}
	if c.hc.Timeout != DefaultTimeout || DefaultTimeout != 15*time.Second {
		t.Fatalf("timeout = %v", c.hc.Timeout)
	}
	hc := &http.Client{Timeout: time.Second}
	c = New("http://x/v26.0", hc)
	if c.hc == hc || c.hc.Timeout != time.Second || hc.CheckRedirect != nil || c.hc.CheckRedirect == nil {
		t.Fatal("New must use a copy of hc with redirects refused, leaving hc alone")
	}
}

func TestExchangeCode(t *testing.T) {
	f := setup(t)
	f.g.AddCode(theCode, theToken, 0)
	tok, err := f.c.ExchangeCode(context.Background(), appID, appSecret, theCode)
	if err != nil {
		t.Fatal(err)
	}
	if tok != theToken {
		t.Fatalf("token = %q", tok)
	}
	r := lastRequest(t, f.g)
	if r.Method != http.MethodGet || r.Path != "/v26.0/oauth/access_token" {
		t.Fatalf("request %s %s", r.Method, r.Path)
	}
	q, _ := url.ParseQuery(r.RawQuery)
	if q.Get("client_id") != appID || q.Get("client_secret") != appSecret || q.Get("code") != theCode || len(q) != 3 {
		t.Fatalf("query %q", r.RawQuery)
	}
	if h := r.Header.Get("Authorization"); h != "" {
		t.Fatalf("unexpected Authorization %q", h)
	}
	if len(r.Body) != 0 {
		t.Fatalf("unexpected body %q", r.Body)
	}
}

func TestExchangeCodeErrors(t *testing.T) {
	ctx := context.Background()

	t.Run("expired", func(t *testing.T) {
		f := setup(t)
		f.g.AddCode(theCode, theToken, -time.Second) // expired
		_, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode)
		e := asError(t, err)
		if e.Status != 400 || e.Code != 100 || e.Subcode != 36007 || e.Type != "OAuthException" || e.FBTraceID == "" {
			t.Fatalf("%+v", e)
		}
		if want := "upstream error 100/36007: This authorization code has expired."; err.Error() != want {
			t.Fatalf("Error() = %q, want %q", err.Error(), want)
		}
	})

	t.Run("used", func(t *testing.T) {
		f := setup(t)
		f.g.AddCode(theCode, theToken, 0)
		if _, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode); err != nil {
			t.Fatal(err)
		}
		_, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode)
		e := asError(t, err)
		if e.Status != 400 || e.Code != 100 || e.Subcode != 36009 || !strings.Contains(e.Message, "has been used") {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("unknown code", func(t *testing.T) {
		f := setup(t)
		_, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode)
		if e := asError(t, err); e.Code != 100 || e.Subcode != 36007 {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("bad secret", func(t *testing.T) {
		f := setup(t, fakegraph.WithAppSecret("the-real-secret"))
		f.g.AddCode(theCode, theToken, 0)
		_, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode)
		e := asError(t, err)
		if e.Status != 400 || e.Code != 1 || e.Message != "Error validating client secret." {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("bad app id", func(t *testing.T) {
		f := setup(t)
		f.g.AddCode(theCode, theToken, 0)
		_, err := f.c.ExchangeCode(ctx, "999", appSecret, theCode)
		if e := asError(t, err); e.Code != 101 {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("no access_token in answer", func(t *testing.T) {
		f := setup(t)
		f.g.FailNext("GET /oauth/access_token", 1, 200, map[string]any{"token_type": "bearer"})
		_, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode)
		noSecrets(t, err)
		if !errors.Is(err, ErrUnexpectedResponse) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestSubscribeUnsubscribe(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	if err := f.c.SubscribeApp(ctx, theToken, wabaID); err != nil {
		t.Fatal(err)
	}
	if sub, _ := f.g.Subscribed(wabaID); !sub {
		t.Fatal("not subscribed")
	}
	r := lastRequest(t, f.g)
	if r.Method != http.MethodPost || r.Path != "/v26.0/"+wabaID+"/subscribed_apps" || r.RawQuery != "" || len(r.Body) != 0 {
		t.Fatalf("request %s %s ?%s body %q", r.Method, r.Path, r.RawQuery, r.Body)
	}
	if h := r.Header.Get("Authorization"); h != "Bearer "+theToken {
		t.Fatalf("Authorization %q", h)
	}

	if err := f.c.UnsubscribeApp(ctx, theToken, wabaID); err != nil {
		t.Fatal(err)
	}
	if sub, _ := f.g.Subscribed(wabaID); sub {
		t.Fatal("still subscribed")
	}
	r = lastRequest(t, f.g)
	if r.Method != http.MethodDelete || r.Path != "/v26.0/"+wabaID+"/subscribed_apps" || r.RawQuery != "" {
		t.Fatalf("request %s %s ?%s", r.Method, r.Path, r.RawQuery)
	}
	if h := r.Header.Get("Authorization"); h != "Bearer "+theToken {
		t.Fatalf("Authorization %q", h)
	}
}

func TestSubscribeErrors(t *testing.T) {
	f := setup(t)
	ctx := context.Background()

	// Unknown token: the dead-token code.
	err := f.c.SubscribeApp(ctx, "EAAunknown-"+theToken, wabaID)
	if e := asError(t, err); e.Status != 401 || e.Code != 190 {
		t.Fatalf("%+v", e)
	}
	// Revoked token.
	f.g.RevokeToken(theToken)
	err = f.c.UnsubscribeApp(ctx, theToken, wabaID)
	if e := asError(t, err); e.Code != 190 || e.Subcode != 460 {
		t.Fatalf("%+v", e)
	}
	// Token without a grant on this WABA.
	f.g.AddToken(theToken, nil, []string{"555"})
	err = f.c.SubscribeApp(ctx, theToken, wabaID)
	if e := asError(t, err); e.Status != 403 || e.Code != 200 {
		t.Fatalf("%+v", e)
	}
	// Unknown object.
	f.g.AddToken(theToken, []string{"*"}, nil)
	err = f.c.SubscribeApp(ctx, theToken, "424242")
	if e := asError(t, err); e.Code != 100 || e.Subcode != 33 || e.Type != "GraphMethodException" {
		t.Fatalf("%+v", e)
	}
	// 200 without "success":true.
	f.g.FailNext("POST /"+wabaID+"/subscribed_apps", 1, 200, map[string]any{"success": false})
	err = f.c.SubscribeApp(ctx, theToken, wabaID)
	noSecrets(t, err)
	if !errors.Is(err, ErrUnexpectedResponse) {
		t.Fatalf("err = %v", err)
	}
}

func TestRegister(t *testing.T) {
	f := setup(t)
	f.g.SetRegistered(pnid, false)
	if err := f.c.Register(context.Background(), theToken, pnid, thePIN); err != nil {
		t.Fatal(err)
	}
	registered, pin, calls := f.g.NumberState(pnid)
	if !registered || pin != thePIN || calls != 1 {
		t.Fatalf("registered=%v pin=%q calls=%d", registered, pin, calls)
	}
	r := lastRequest(t, f.g)
	if r.Method != http.MethodPost || r.Path != "/v26.0/"+pnid+"/register" || r.RawQuery != "" {
		t.Fatalf("request %s %s ?%s", r.Method, r.Path, r.RawQuery)
	}
	if h := r.Header.Get("Authorization"); h != "Bearer "+theToken {
		t.Fatalf("Authorization %q", h)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var body map[string]any
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatal(err)
	}
	if len(body) != 2 || body["messaging_product"] != "whatsapp" || body["pin"] != thePIN {
		t.Fatalf("body %s", r.Body)
	}
}

func TestRegisterErrors(t *testing.T) {
	ctx := context.Background()

	t.Run("wrong pin", func(t *testing.T) {
		f := setup(t)
		f.g.SetNumberPIN(pnid, "111111")
		err := f.c.Register(ctx, theToken, pnid, thePIN)
		e := asError(t, err)
		if e.Status != 400 || e.Code != 133005 || e.Details == "" || !strings.Contains(e.Message, "PIN Mismatch") {
			t.Fatalf("%+v", e)
		}
		if !strings.HasPrefix(err.Error(), "upstream error 133005: (#133005) Two step verification PIN Mismatch") {
			t.Fatalf("Error() = %q", err.Error())
		}
	})

	t.Run("rate limited", func(t *testing.T) {
		f := setup(t)
		f.g.SetRegisterError(pnid, 133016)
		if e := asError(t, f.c.Register(ctx, theToken, pnid, thePIN)); e.Code != 133016 {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("injected 5xx with envelope", func(t *testing.T) {
		f := setup(t)
		f.g.FailNext("POST /"+pnid+"/register", 1, 0, fakegraph.ErrSomethingWentWrong())
		e := asError(t, f.c.Register(ctx, theToken, pnid, thePIN))
		if e.Status != 500 || e.Code != 131000 || e.Details != "Something went wrong" {
			t.Fatalf("%+v", e)
		}
		f.g.FailNext("POST /"+pnid+"/register", 1, 503, fakegraph.GraphError("Service temporarily unavailable", "OAuthException", 2, 0))
		e = asError(t, f.c.Register(ctx, theToken, pnid, thePIN))
		if e.Status != 503 || e.Code != 2 {
			t.Fatalf("%+v", e)
		}
		// Next call goes through.
		if err := f.c.Register(ctx, theToken, pnid, thePIN); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("injected 5xx without envelope", func(t *testing.T) {
		f := setup(t)
		f.g.FailNext("POST /"+pnid+"/register", 1, 502, []byte("<html><body>502 Bad Gateway</body></html>"))
		err := f.c.Register(ctx, theToken, pnid, thePIN)
		noSecrets(t, err)
		if _, ok := errors.AsType[*Error](err); ok || !errors.Is(err, ErrUnexpectedResponse) {
			t.Fatalf("want a wrapped ErrUnexpectedResponse, got %T: %v", err, err)
		}
		if !strings.Contains(err.Error(), "502") || !strings.Contains(err.Error(), "POST /"+pnid+"/register") {
			t.Fatalf("Error() = %q", err.Error())
		}
	})

	t.Run("connection dropped", func(t *testing.T) {
		f := setup(t)
		f.g.FailNext("POST /"+pnid+"/register", 1, -1, nil)
		err := f.c.Register(ctx, theToken, pnid, thePIN)
		noSecrets(t, err)
		if _, ok := errors.AsType[*Error](err); ok {
			t.Fatalf("want a transport error, got %v", err)
		}
	})
}

func TestGetPhoneNumber(t *testing.T) {
	f := setup(t)
	got, err := f.c.GetPhoneNumber(context.Background(), theToken, pnid)
	if err != nil {
		t.Fatal(err)
	}
	want := PhoneNumber{ID: pnid, DisplayPhoneNumber: "+1 555-0100", VerifiedName: "Lucky Shrub"}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	r := lastRequest(t, f.g)
	q, _ := url.ParseQuery(r.RawQuery)
	if r.Method != http.MethodGet || r.Path != "/v26.0/"+pnid || q.Has("access_token") {
		t.Fatalf("request %s %s ?%s", r.Method, r.Path, r.RawQuery)
	}
	fields := strings.Split(q.Get("fields"), ",")
	if !contains(fields, "display_phone_number") || !contains(fields, "verified_name") {
		t.Fatalf("fields %q", q.Get("fields"))
	}
	if h := r.Header.Get("Authorization"); h != "Bearer "+theToken {
		t.Fatalf("Authorization %q", h)
	}

	_, err = f.c.GetPhoneNumber(context.Background(), theToken, "777")
	if e := asError(t, err); e.Code != 100 || e.Subcode != 33 {
		t.Fatalf("%+v", e)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func TestListPhoneNumbers(t *testing.T) {
	f := setup(t)
	f.c.pageSize = 2
	ids := []string{pnid}
	for i := range 4 {
		id := fmt.Sprintf("20000000000000%d", i)
		f.g.AddNumber(id, wabaID, fmt.Sprintf("+1 555-010%d", i+1), "Shrub")
		ids = append(ids, id)
	}
	f.g.AddNumber("300000000000001", "999999", "+1 555-0900", "Other")
	f.g.AddToken(theToken, nil, []string{wabaID, "999999"})
	ctx := context.Background()

	f.g.Reset()
	got, err := f.c.ListPhoneNumbers(ctx, theToken, wabaID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("got %d numbers: %+v", len(got), got)
	}
	for i, n := range got {
		if n.ID != ids[i] || n.DisplayPhoneNumber == "" || n.VerifiedName == "" {
			t.Fatalf("number %d: %+v", i, n)
		}
	}
	rs := f.g.Requests()
	if len(rs) != 3 {
		t.Fatalf("%d requests for 5 numbers in pages of 2", len(rs))
	}
	for _, r := range rs {
		if strings.Contains(r.RawQuery, "access_token") || r.Header.Get("Authorization") != "Bearer "+theToken {
			t.Fatalf("request %s ?%s", r.Path, r.RawQuery)
		}
	}

	for _, tc := range []struct {
		waba, pnid string
		want       bool
	}{{wabaID, ids[4], true}, {wabaID, pnid, true}, {wabaID, "300000000000001", false}, {"999999", pnid, false}, {"999999", "300000000000001", true}} {
		ok, err := f.c.PhoneNumberBelongsToWABA(ctx, theToken, tc.waba, tc.pnid)
		if err != nil || ok != tc.want {
			t.Fatalf("PhoneNumberBelongsToWABA(%s, %s) = %v, %v; want %v", tc.waba, tc.pnid, ok, err, tc.want)
		}
	}

	// A WABA the token is not granted.
	f.g.AddToken(theToken, []string{pnid}, nil)
	_, err = f.c.PhoneNumberBelongsToWABA(ctx, theToken, "999999", pnid)
	if e := asError(t, err); e.Status != 403 {
		t.Fatalf("%+v", e)
	}
}

func TestTransportFailures(t *testing.T) {
	f := setup(t)
	f.g.AddCode(theCode, theToken, 0)
	f.g.Close()
	ctx := context.Background()

	calls := map[string]func() error{
		"ExchangeCode": func() error { _, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode); return err },
		"SubscribeApp": func() error { return f.c.SubscribeApp(ctx, theToken, wabaID) },
		"UnsubscribeApp": func() error {
			return f.c.UnsubscribeApp(ctx, theToken, wabaID)
		},
		"Register": func() error { return f.c.Register(ctx, theToken, pnid, thePIN) },
		"GetPhoneNumber": func() error {
			_, err := f.c.GetPhoneNumber(ctx, theToken, pnid)
			return err
		},
		"PhoneNumberBelongsToWABA": func() error {
			_, err := f.c.PhoneNumberBelongsToWABA(ctx, theToken, wabaID, pnid)
			return err
		},
	}
	for name, fn := range calls {
		t.Run(name, func(t *testing.T) {
			err := fn()
			noSecrets(t, err)
			if _, ok := errors.AsType[*Error](err); ok {
				t.Fatalf("want a transport error, got *Error %v", err)
			}
			if errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrUnexpectedResponse) {
				t.Fatalf("wrong class: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "graph: ") || strings.Contains(err.Error(), "127.0.0.1:") && strings.Contains(err.Error(), "?") {
				t.Fatalf("Error() = %q", err.Error())
			}
		})
	}
	// The exchange's error names the method and path, not the URL.
	_, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode)
	if !strings.HasPrefix(err.Error(), "graph: GET /oauth/access_token: ") || strings.Contains(err.Error(), "client_") {
		t.Fatalf("Error() = %q", err.Error())
	}
}

func TestContextCancel(t *testing.T) {
	f := setup(t)
	f.g.AddCode(theCode, theToken, 0)
	f.g.SetLatency(time.Minute) // an answer, were the context ignored, would take this long
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := f.c.ExchangeCode(ctx, appID, appSecret, theCode)
	noSecrets(t, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the call returned after %v: it did not honour the context", d)
	}

	// The client's own timeout.
	c := New(f.g.URL()+"/v26.0", &http.Client{Timeout: 50 * time.Millisecond})
	err = c.Register(context.Background(), theToken, pnid, thePIN)
	noSecrets(t, err)
	if _, ok := errors.AsType[*Error](err); ok {
		t.Fatalf("err = %v", err)
	}
}

func TestInvalidArguments(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	check := func(name string, err error) {
		t.Helper()
		noSecrets(t, err)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%s: err = %v", name, err)
		}
	}
	_, err := f.c.ExchangeCode(ctx, "", appSecret, theCode)
	check("no app id", err)
	_, err = f.c.ExchangeCode(ctx, appID, "", theCode)
	check("no secret", err)
	_, err = f.c.ExchangeCode(ctx, appID, appSecret, " ")
	check("no code", err)
	check("subscribe no waba", f.c.SubscribeApp(ctx, theToken, ""))
	check("subscribe dotdot", f.c.SubscribeApp(ctx, theToken, ".."))
	check("subscribe no token", f.c.SubscribeApp(ctx, "", wabaID))
	check("unsubscribe no waba", f.c.UnsubscribeApp(ctx, theToken, " "))
	check("register no pnid", f.c.Register(ctx, theToken, "", thePIN))
	check("register no token", f.c.Register(ctx, "", pnid, thePIN))
	check("register newline token", f.c.Register(ctx, theToken+"\r\nX: y", pnid, thePIN))
	check("register no pin", f.c.Register(ctx, theToken, pnid, ""))
	check("register short pin", f.c.Register(ctx, theToken, pnid, thePIN[:5]))
	check("register letters pin", f.c.Register(ctx, theToken, pnid, "49381a"))
	_, err = f.c.GetPhoneNumber(ctx, theToken, "")
	check("get no pnid", err)
	_, err = f.c.GetPhoneNumber(ctx, "", pnid)
	check("get no token", err)
	_, err = f.c.ListPhoneNumbers(ctx, theToken, "")
	check("list no waba", err)
	_, err = f.c.PhoneNumberBelongsToWABA(ctx, theToken, wabaID, "")
	check("belongs no pnid", err)
	_, err = f.c.PhoneNumberBelongsToWABA(ctx, theToken, "", pnid)
	check("belongs no waba", err)
	if n := len(f.g.Requests()); n != 0 {
		t.Fatalf("%d requests reached the upstream", n)
	}
}

func TestPathEscaping(t *testing.T) {
	var (
		mu  sync.Mutex
		got []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.RequestURI+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.EscapedPath(), "/register"), strings.HasSuffix(r.URL.EscapedPath(), "/subscribed_apps"):
			_, _ = w.Write([]byte(`{"success":true}`))
		default:
			_, _ = w.Write([]byte(`{"display_phone_number":"1555","verified_name":"X"}`))
		}
	}))
	defer srv.Close()
	c := New(srv.URL+"/v26.0", srv.Client())
	ctx := context.Background()
	if err := c.SubscribeApp(ctx, theToken, "1/2?x=y"); err != nil {
		t.Fatal(err)
	}
	if err := c.Register(ctx, theToken, "a b#c", thePIN); err != nil {
		t.Fatal(err)
	}
	pn, err := c.GetPhoneNumber(ctx, theToken, "../me")
	if err != nil {
		t.Fatal(err)
	}
	if pn.ID != "../me" {
		t.Fatalf("ID = %q", pn.ID)
	}
	want := []string{
		"POST /v26.0/1%2F2%3Fx=y/subscribed_apps Bearer " + theToken,
		"POST /v26.0/a%20b%23c/register Bearer " + theToken,
		"GET /v26.0/..%2Fme?fields=id%2Cdisplay_phone_number%2Cverified_name Bearer " + theToken,
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestRedirectNotFollowed(t *testing.T) {
	hit := make(chan string, 1)
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit <- r.RequestURI
		_, _ = w.Write([]byte(`{"access_token":"x"}`))
	}))
	defer elsewhere.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.RequestURI, http.StatusFound)
	}))
	defer srv.Close()
	for _, hc := range []*http.Client{nil, srv.Client()} {
		_, err := New(srv.URL+"/v26.0", hc).ExchangeCode(context.Background(), appID, appSecret, theCode)
		noSecrets(t, err)
		if !errors.Is(err, ErrUnexpectedResponse) || !strings.Contains(err.Error(), "302") {
			t.Fatalf("err = %v", err)
		}
	}
	select {
	case u := <-hit:
		t.Fatalf("redirect followed to %s", u)
	default:
	}
}

// The upstream does not echo secrets, but if an answer ever did, the error must not carry them.
func TestEchoedSecretsRedacted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		var b map[string]string
		_ = json.NewDecoder(r.Body).Decode(&b)
		echo := r.Form.Get("client_secret") + " " + url.QueryEscape(r.Form.Get("code")) + " " + r.Header.Get("Authorization") + " " + b["pin"]
		if r.URL.Query().Has("html") {
			w.WriteHeader(500)
			_, _ = w.Write([]byte(echo))
			return
		}
		w.WriteHeader(400)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
			"message": "bad " + echo, "type": "OAuthException", "code": 100,
			"error_user_title": echo, "error_user_msg": echo,
			"error_data": map[string]any{"details": echo}, "fbtrace_id": "T"}})
	}))
	defer srv.Close()
	c := New(srv.URL+"/v26.0", nil)
	ctx := context.Background()
	_, err := c.ExchangeCode(ctx, appID, appSecret, theCode)
	if e := asError(t, err); !strings.Contains(e.Message, redacted) || e.Code != 100 {
		t.Fatalf("%+v", e)
	}
	err = c.Register(ctx, theToken, pnid, thePIN)
	if e := asError(t, err); !strings.Contains(e.Details, redacted) {
		t.Fatalf("%+v", e)
	}
}

func TestNonJSONSuccess(t *testing.T) {
	f := setup(t)
	f.g.FailNext("GET /"+pnid, 1, 200, []byte("<html>ok</html>"))
	_, err := f.c.GetPhoneNumber(context.Background(), theToken, pnid)
	noSecrets(t, err)
	if !errors.Is(err, ErrUnexpectedResponse) {
		t.Fatalf("err = %v", err)
	}
}

func TestErrorString(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{Code: 100, Subcode: 36007, Message: "This authorization code has expired."}, "upstream error 100/36007: This authorization code has expired."},
		{Error{Code: 133005, Message: "(#133005) Two step verification PIN Mismatch", Details: "Two-step verification PIN incorrect."},
			"upstream error 133005: (#133005) Two step verification PIN Mismatch (Two-step verification PIN incorrect.)"},
		{Error{Code: 1, Message: "Same", Details: "Same"}, "upstream error 1: Same"},
		{Error{Code: 131000, Message: "(#131000) Something went wrong", Details: "Something went wrong"}, "upstream error 131000: (#131000) Something went wrong"},
		{Error{Status: 500, Code: 2}, "upstream error 2: HTTP 500"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
