package e2e

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestRekeyLive rotates the encryption key on a running instance while it relays sends and
// delivers events the whole time, following docs/operations.md: start with key A; reload with
// [B, A]; run `caddy wabarelay rekey` concurrently with the traffic; reload with [B] alone.
// Every relay call must succeed with its own channel's upstream token (the fake upstream records
// the token it saw), every event must be delivered with a valid signature, and at the end no
// secret is left that B alone does not open.
func TestRekeyLive(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t) // its store seals with key A
	ctx := context.Background()
	keyB := testenv.NewKey()
	keyB64 := base64.StdEncoding.EncodeToString(keyB)

	// connected channels, each on its own number with its own upstream token
	type liveChannel struct {
		id               uuid.UUID
		pnid, token, ups string
	}
	var live []liveChannel
	for i := range 16 {
		pn, up := fmt.Sprint(4100+i), fmt.Sprintf("EAAG-live-upstream-%d", i)
		e.fake.AddNumber(pn, wabaID, "+1 555 0100", "Acme")
		e.fake.AddToken(up, []string{pn}, []string{wabaID})
		c := e.fix.Channel(t, e.org, &testenv.ChannelOpts{Name: "live",
			Connection: &store.Connection{PhoneNumberID: pn, WabaID: wabaID, UpstreamToken: up}})
		live = append(live, liveChannel{c.ID, pn, c.ChannelToken, up})
	}
	// more sealed values, so that rekey runs many batches while the traffic goes on
	const idle = 1200
	for range idle {
		e.fix.Channel(t, e.org, &testenv.ChannelOpts{Name: "idle"})
	}
	// two receivers, each with its own webhook and signing secret (which it checks every
	// delivery's signatures with)
	var receivers []*testenv.Receiver
	var certs []*x509.Certificate
	webhooks := map[*testenv.Receiver]store.Webhook{}
	secrets := map[*testenv.Receiver]string{}
	for range 2 {
		rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
		webhooks[rc], secrets[rc] = e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "r"})
		rc.Verify(secrets[rc])
		receivers = append(receivers, rc)
		certs = append(certs, rc.Certificate())
	}
	caPath := testenv.CAFile(t, certs...)

	port, adminPort := freePortPair(t)
	config := func(keys string) string {
		return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	wabarelay {
		database       {env.WBR_TEST_DATABASE}
		encryption_key %s
		upstream       %s/v26.0
		meta {
			app_secret   %s
			verify_token %s
		}
		delivery {
			retry_delays 200ms 200ms 200ms
			timeout      5s
			lease        10s
			root_ca      %s
			allow_private_targets
		}
	}
}
http://127.0.0.1:%d {
	handle_path %s/* {
		wabarelay_proxy
	}
	handle /webhooks/upstream {
		wabarelay_inbound
	}
}
`, adminPort, keys, e.fake.URL(), testAppSecret, testVerifyToken, caPath, port, proxyPrefix)
	}
	origin := e.caddyFile(config("{env.WBR_KEY_A}"), port, "WBR_TEST_DATABASE="+e.dsn, "WBR_KEY_A="+e.keyB64, "WBR_KEY_B="+keyB64)
	reload := func(keys string) {
		t.Helper()
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/load", adminPort), "text/caddyfile", strings.NewReader(config(keys)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("reload with %s: %d %s", keys, resp.StatusCode, b)
		}
	}

	// traffic for the whole procedure: sends round-robin over the channels (each channel well
	// under its 100/min), and upstream event posts of one message each
	var stop atomic.Bool
	var sendsOK, sendConnErrs, posted, postConnErrs atomic.Int64
	var failMu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		failMu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		failMu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // sender
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			c := live[i%len(live)]
			req, _ := http.NewRequest("POST", origin+proxyPrefix+"/"+c.pnid+"/messages", strings.NewReader(textBody))
			req.Header.Set("Authorization", "Bearer "+c.token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				sendConnErrs.Add(1) // a connection reset by the listener handover of a reload
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				fail("send on channel %d: %d %s", i%len(live), resp.StatusCode, b)
			} else {
				sendsOK.Add(1)
			}
			time.Sleep(75 * time.Millisecond) // pacing under the rate limit, not synchronisation
		}
	}()
	go func() { // upstream events
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			c := live[i%len(live)]
			body := upstreamBatch(map[string][2][]string{c.pnid: {{fmt.Sprint("live", i)}, nil}})
			resp, err := http.DefaultClient.Do(signedRequest(origin+"/webhooks/upstream", testAppSecret, body))
			if err != nil {
				postConnErrs.Add(1)
				i-- // not taken: post the same message again
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				fail("event post %d: %d %s", i, resp.StatusCode, b)
			} else {
				posted.Store(int64(i + 1))
			}
			time.Sleep(30 * time.Millisecond) // pacing, not synchronisation
		}
	}()
	t.Cleanup(func() { stop.Store(true); wg.Wait() })
	delivered := func() int64 {
		n := int64(-1)
		for _, rc := range receivers {
			d := len(rc.PerEvent())
			if n < 0 || int64(d) < n {
				n = int64(d)
			}
		}
		return n
	}
	// progress: more sends answered and more events delivered (to both receivers) than before
	progress := func(what string) {
		t.Helper()
		s0, d0 := sendsOK.Load(), delivered()
		testenv.Eventually(t, time.Minute, func() bool { return sendsOK.Load() >= s0+10 && delivered() >= d0+10 }, "progress (%s)", what)
		t.Logf("%s: %d sends ok, %d events delivered to each receiver", what, sendsOK.Load(), delivered())
	}

	progress("key A")
	reload("{env.WBR_KEY_B} {env.WBR_KEY_A}")
	progress("keys [B, A]")

	// rekey concurrently with the traffic; the traffic must make progress while it runs
	type rekeyOut struct {
		lines []map[string]any
		err   error
	}
	done := make(chan rekeyOut, 1)
	go func() {
		lines, err := runCLI(t, "rekey", "--database", e.dsn, "--encryption-key", keyB64+","+e.keyB64, "--batch-size", "5")
		done <- rekeyOut{lines, err}
	}()
	var out rekeyOut
	s0 := sendsOK.Load()
	select {
	case out = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("rekey did not finish within 2 minutes")
	}
	if out.err != nil || len(out.lines) == 0 || out.lines[len(out.lines)-1]["result"] != "complete" || out.lines[len(out.lines)-1]["remaining"] != float64(0) {
		t.Fatalf("rekey: %v %v", out.lines, out.err)
	}
	t.Logf("rekey: %d lines, summary %v; %d sends ok while it ran", len(out.lines), out.lines[len(out.lines)-1], sendsOK.Load()-s0)
	progress("after rekey")
	reload("{env.WBR_KEY_B}")
	progress("key B alone")
	stop.Store(true)
	wg.Wait()

	// every event posted is delivered to both receivers, every delivery correctly signed
	total := posted.Load()
	testenv.Eventually(t, 2*time.Minute, func() bool { return delivered() == total }, "every event posted delivered")
	for i, rc := range receivers {
		if d := len(rc.PerEvent()); int64(d) != total {
			t.Fatalf("receiver %d: %d of %d events", i, d, total)
		}
	}
	failMu.Lock()
	if len(failures) > 0 {
		t.Fatalf("%d failed calls during the rotation, first: %s", len(failures), failures[0])
	}
	failMu.Unlock()
	// the upstream saw each channel's own token on every send
	byNumber := map[string]string{}
	for _, c := range live {
		byNumber[c.pnid] = c.ups
	}
	sends := 0
	for _, r := range e.fake.RequestsTo("POST", "/messages") {
		pn := strings.Split(strings.TrimPrefix(r.Path, "/v26.0/"), "/")[0]
		if want := byNumber[pn]; r.Header.Get("Authorization") != "Bearer "+want {
			t.Fatalf("upstream send for %s carried the wrong token", pn)
		}
		sends++
	}
	if int64(sends) < sendsOK.Load() {
		t.Fatalf("upstream saw %d sends, the relay answered %d", sends, sendsOK.Load())
	}
	t.Logf("%d sends and %d events (x%d receivers) through the rotation; %d send and %d post connection resets at reloads",
		sends, total, len(receivers), sendConnErrs.Load(), postConnErrs.Load())

	// nothing is left under A: B alone opens every secret (listing the channels opens every
	// channel token)
	stB := e.fix.StoreWith(t, keyB)
	chans, err := stB.ListChannels(ctx, e.org)
	if err != nil || len(chans) != idle+len(live) {
		t.Fatalf("B alone: list channels: %d %v", len(chans), err)
	}
	for _, c := range live {
		rc, err := stB.RelayChannelByToken(ctx, c.token)
		if err != nil || rc.UpstreamToken != c.ups {
			t.Fatalf("B alone: upstream token of %s: %v", c.id, err)
		}
	}
	for _, rc := range receivers {
		if s, err := stB.WebhookSecret(ctx, webhooks[rc].ID); err != nil || s != secrets[rc] {
			t.Fatalf("B alone: webhook secret: %v", err)
		}
	}
}

// freePortPair returns two distinct free ports.
func freePortPair(t *testing.T) (int, int) {
	t.Helper()
	a := testenv.FreePort(t)
	for {
		if b := testenv.FreePort(t); b != a {
			return a, b
		}
	}
}
