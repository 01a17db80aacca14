package docs_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/dispatcher"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// deliveries is what a real receiver got: a delivery signed with one secret, and one made during
// a secret rotation's grace (signed with the new and the old secret).
type deliveries struct {
	plain, rotated testenv.Delivery
	secret         string // plain's, the rotation's old one
	fresh          string // the rotation's new one
}

// realDeliveries stores an incoming message for an org whose webhook points at a local HTTPS
// receiver and runs a dispatcher until the receiver has its delivery; then rotates the webhook's
// secret and does the same again: the bytes and headers a real receiver sees.
func realDeliveries(t *testing.T) deliveries {
	t.Helper()
	ctx := context.Background()
	f := testenv.NewStore(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	org := f.Org(t)
	conn := f.Connection()
	f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: conn})
	wh, secret := f.Webhook(t, org.ID, rc.URL+"/hook")
	event := func() {
		item := store.IncomingItem{Type: "messages", PhoneNumberID: conn.PhoneNumberID, DedupeKey: "docs-" + uuid.NewString(),
			Data: json.RawMessage(`{"message": {"id": "wamid.docs", "text": {"body": "héllo \u00e9 — ok"}}}`)}
		if res, err := f.Store.StoreEvents(ctx, []store.IncomingItem{item}, store.Claim{}); err != nil || res.Events != 1 {
			t.Fatalf("store event: %+v %v", res, err)
		}
	}
	event()

	d, err := dispatcher.New(f.Pool, f.Store.WebhookSecret, dispatcher.Config{
		Timeout: 10 * time.Second, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond,
		AllowPrivateTargets: true, RootCAs: rc.Roots(), InstanceID: "docs-" + uuid.NewString()[:6],
		PreviousSecrets: f.Store.PreviousWebhookSecret,
	}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(runCtx, f.DSN) }()
	defer func() { cancel(); <-done }()
	out := deliveries{plain: rc.WaitN(t, 1)[0], secret: secret}
	if _, out.fresh, err = f.Store.RotateWebhookSecret(ctx, org.ID, wh.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	event()
	out.rotated = rc.WaitN(t, 2)[1]
	return out
}

// snippet returns the receiver guide's verifier in lang (the first ```<lang> block holding a
// verify function).
func snippet(t *testing.T, lang string) string {
	t.Helper()
	for _, b := range fencedBlocks(t, lang) {
		if filepath.Base(b.file) == "receiver-guide.md" && strings.Contains(b.text, "verify") {
			return b.text
		}
	}
	t.Fatalf("receiver-guide.md: no %s verifier", lang)
	return ""
}

// verifierHarness is, per language, the interpreter, the program's file name and how the
// guide's snippet becomes a program (Go's is built first, to the file name without .go). The
// program's arguments are a mode, the secret, the body's file and the mode's strings; the exit
// status (0 accepted, 1 rejected) is decided by, per mode: "svc" verify(secret, body,
// X-Svc-Signature); "standard" verifyStandard(secret, body, webhook-id, webhook-timestamp,
// webhook-signature); "dedupe" firstDelivery(id) true then false for the same id.
var verifierHarness = []struct {
	lang, tool, file string
	program          func(snippet string) string
	command          func(file string) []string
}{
	{"go", "go", "verify.go", func(s string) string {
		return `package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

` + s + `
func main() {
	body, err := os.ReadFile(os.Args[3])
	secret, a := os.Args[2], os.Args[4:]
	ok := false
	switch os.Args[1] {
	case "svc":
		ok = verify(secret, body, a[0])
	case "standard":
		ok = verifyStandard(secret, body, a[0], a[1], a[2])
	case "dedupe":
		ok = firstDelivery(a[0]) && !firstDelivery(a[0])
	}
	if err != nil || !ok {
		os.Exit(1)
	}
}
`
	}, func(f string) []string { return []string{strings.TrimSuffix(f, ".go")} }},
	{"js", "node", "verify.js", func(s string) string {
		return s + `
const [mode, secret, bodyFile, ...a] = process.argv.slice(2);
const body = require('fs').readFileSync(bodyFile);
const ok = mode === 'svc' ? verify(secret, body, a[0])
  : mode === 'standard' ? verifyStandard(secret, body, a[0], a[1], a[2])
  : firstDelivery(a[0]) && !firstDelivery(a[0]);
process.exit(ok ? 0 : 1);
`
	}, func(f string) []string { return []string{"node", f} }},
	{"python", "python3", "verify.py", func(s string) string {
		return s + `
import sys
mode, secret, a = sys.argv[1], sys.argv[2], sys.argv[4:]
with open(sys.argv[3], "rb") as fh:
    body = fh.read()
if mode == "svc":
    ok = verify(secret, body, a[0])
elif mode == "standard":
    ok = verify_standard(secret, body, a[0], a[1], a[2])
else:
    ok = first_delivery(a[0]) and not first_delivery(a[0])
sys.exit(0 if ok else 1)
`
	}, func(f string) []string { return []string{"python3", f} }},
}

// TestReceiverGuideVerifiers: the receiver guide's Go, Node and Python verifiers, run as
// written (inside a small harness), accept real deliveries — the bytes and headers a dispatcher
// sent to a local receiver — by X-Svc-Signature and by the Standard Webhooks headers: one signed
// with one secret, and one made during a secret rotation (two signatures in each header) with
// either secret. They reject them with one body byte changed, with another secret, with a
// signature from another timestamp or for another webhook-id; the guide's de-duplication takes an
// event id once. A missing interpreter skips its language.
func TestReceiverGuideVerifiers(t *testing.T) {
	dl := realDeliveries(t)
	svc := func(d testenv.Delivery) string { return d.Header.Get("X-Svc-Signature") }
	std := func(d testenv.Delivery) []string {
		return []string{d.Header.Get("Webhook-Id"), d.Header.Get("Webhook-Timestamp"), d.Header.Get("Webhook-Signature")}
	}
	header := svc(dl.plain)
	if header == "" || strings.Count(svc(dl.rotated), ",v1=") != 2 || len(strings.Fields(std(dl.rotated)[2])) != 2 {
		t.Fatalf("deliveries without the expected signatures: %v, %v", dl.plain.Header, dl.rotated.Header)
	}
	tampered := append([]byte(nil), dl.plain.Body...)
	tampered[len(tampered)/2] ^= 0x01
	t0, _, _ := strings.Cut(strings.TrimPrefix(header, "t="), ",")
	ts, _ := strconv.ParseInt(t0, 10, 64)
	otherTime := strings.Replace(header, "t="+t0, "t="+strconv.FormatInt(ts-1, 10), 1)
	otherID := std(dl.plain)
	otherID[0] = uuid.NewString()
	another := "whsec_" + strings.Repeat("A", 43) + "="

	type check struct {
		mode, secret string
		body         []byte
		args         []string
	}
	accepted := map[string]check{
		"a delivery (X-Svc-Signature)":                      {"svc", dl.secret, dl.plain.Body, []string{header}},
		"a delivery (webhook-signature)":                    {"standard", dl.secret, dl.plain.Body, std(dl.plain)},
		"a rotated delivery with the old secret (X-Svc)":    {"svc", dl.secret, dl.rotated.Body, []string{svc(dl.rotated)}},
		"a rotated delivery with the new secret (X-Svc)":    {"svc", dl.fresh, dl.rotated.Body, []string{svc(dl.rotated)}},
		"a rotated delivery with the old secret (standard)": {"standard", dl.secret, dl.rotated.Body, std(dl.rotated)},
		"a rotated delivery with the new secret (standard)": {"standard", dl.fresh, dl.rotated.Body, std(dl.rotated)},
		"an event id once (de-duplication)":                 {"dedupe", "", nil, []string{dl.plain.Header.Get("Webhook-Id")}},
	}
	rejected := map[string]check{
		"a changed body byte (X-Svc)":                {"svc", dl.secret, tampered, []string{header}},
		"a changed body byte (standard)":             {"standard", dl.secret, tampered, std(dl.plain)},
		"another secret (X-Svc)":                     {"svc", another, dl.plain.Body, []string{header}},
		"another secret (standard)":                  {"standard", another, dl.plain.Body, std(dl.plain)},
		"another timestamp (X-Svc)":                  {"svc", dl.secret, dl.plain.Body, []string{otherTime}},
		"another webhook-id (standard)":              {"standard", dl.secret, dl.plain.Body, otherID},
		"a rotated delivery, another secret (X-Svc)": {"svc", another, dl.rotated.Body, []string{svc(dl.rotated)}},
		"a rotated delivery, another secret (std)":   {"standard", another, dl.rotated.Body, std(dl.rotated)},
	}

	// The languages run in parallel: each has its own directory, the checks are only read.
	for _, h := range verifierHarness {
		t.Run(h.lang, func(t *testing.T) {
			t.Parallel()
			if _, err := exec.LookPath(h.tool); err != nil {
				t.Skipf("%s not installed: the %s verifier is not run", h.tool, h.lang)
			}
			dir := t.TempDir()
			prog := filepath.Join(dir, h.file)
			if err := os.WriteFile(prog, []byte(h.program(snippet(t, h.lang))), 0o600); err != nil {
				t.Fatal(err)
			}
			if h.lang == "go" { // compiled once, then run per case
				build := exec.Command("go", "build", "-o", strings.TrimSuffix(prog, ".go"), prog)
				build.Dir = dir
				build.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=off")
				if out, err := build.CombinedOutput(); err != nil {
					t.Fatalf("the Go verifier does not build: %v\n%s", err, out)
				}
			}
			run := func(c check) (bool, string) {
				bodyFile := filepath.Join(dir, "body")
				if err := os.WriteFile(bodyFile, c.body, 0o600); err != nil {
					t.Fatal(err)
				}
				args := append(append(h.command(prog), c.mode, c.secret, bodyFile), c.args...)
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Dir = dir
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1 && len(out) == 0) {
					t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return err == nil, string(out)
			}
			for name, c := range accepted {
				if ok, out := run(c); !ok {
					t.Errorf("rejects %s\n%s", name, out)
				}
			}
			for name, c := range rejected {
				if ok, _ := run(c); ok {
					t.Errorf("accepts %s", name)
				}
			}
		})
	}
}
