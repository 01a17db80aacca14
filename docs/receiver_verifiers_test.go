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

// realDelivery stores one incoming message for an org whose webhook points at a local HTTPS
// receiver, runs a dispatcher until the receiver has the delivery, and returns what the receiver
// got and the webhook's secret: the bytes and headers a real receiver sees.
func realDelivery(t *testing.T) (testenv.Delivery, string) {
	t.Helper()
	ctx := context.Background()
	f := testenv.NewStore(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	org := f.Org(t)
	conn := f.Connection()
	f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: conn})
	_, secret := f.Webhook(t, org.ID, rc.URL+"/hook")
	item := store.IncomingItem{Type: "messages", PhoneNumberID: conn.PhoneNumberID, DedupeKey: "docs-" + uuid.NewString(),
		Data: json.RawMessage(`{"message": {"id": "wamid.docs", "text": {"body": "héllo \u00e9 — ok"}}}`)}
	if res, err := f.Store.StoreEvents(ctx, []store.IncomingItem{item}, store.Claim{}); err != nil || res.Events != 1 {
		t.Fatalf("store event: %+v %v", res, err)
	}

	d, err := dispatcher.New(f.Pool, f.Store.WebhookSecret, dispatcher.Config{
		Timeout: 10 * time.Second, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond,
		AllowPrivateTargets: true, RootCAs: rc.Roots(), InstanceID: "docs-" + uuid.NewString()[:6],
	}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(runCtx, f.DSN) }()
	defer func() { cancel(); <-done }()
	return rc.WaitN(t, 1)[0], secret
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
// guide's snippet becomes a program (Go's is built first, to the file name without .go): verify(secret, the body file's bytes, the header) decides
// the exit status (0 accepted, 1 rejected).
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
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"time"
)

` + s + `
func main() {
	body, err := os.ReadFile(os.Args[2])
	if err != nil || !verify(os.Args[1], body, os.Args[3]) {
		os.Exit(1)
	}
}
`
	}, func(f string) []string { return []string{strings.TrimSuffix(f, ".go")} }},
	{"js", "node", "verify.js", func(s string) string {
		return s + `
const [secret, bodyFile, header] = process.argv.slice(2);
process.exit(verify(secret, require('fs').readFileSync(bodyFile), header) ? 0 : 1);
`
	}, func(f string) []string { return []string{"node", f} }},
	{"python", "python3", "verify.py", func(s string) string {
		return s + `
import sys
with open(sys.argv[2], "rb") as fh:
    body = fh.read()
sys.exit(0 if verify(sys.argv[1], body, sys.argv[3]) else 1)
`
	}, func(f string) []string { return []string{"python3", f} }},
}

// TestReceiverGuideVerifiers: the receiver guide's Go, Node and Python verifiers, run as
// written (inside a small harness), accept a real delivery — the bytes and X-Svc-Signature a
// dispatcher sent to a local receiver — and reject it with one body byte changed, with another
// secret and with a signature from another timestamp. A missing interpreter skips its language.
func TestReceiverGuideVerifiers(t *testing.T) {
	dl, secret := realDelivery(t)
	header := dl.Header.Get("X-Svc-Signature")
	if header == "" {
		t.Fatalf("delivery without X-Svc-Signature: %v", dl.Header)
	}
	tampered := append([]byte(nil), dl.Body...)
	tampered[len(tampered)/2] ^= 0x01
	t0, _, _ := strings.Cut(strings.TrimPrefix(header, "t="), ",")
	ts, _ := strconv.ParseInt(t0, 10, 64)
	otherTime := strings.Replace(header, "t="+t0, "t="+strconv.FormatInt(ts-1, 10), 1)

	for _, h := range verifierHarness {
		t.Run(h.lang, func(t *testing.T) {
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
			verify := func(secret string, body []byte, header string) (bool, string) {
				bodyFile := filepath.Join(dir, "body")
				if err := os.WriteFile(bodyFile, body, 0o600); err != nil {
					t.Fatal(err)
				}
				args := append(h.command(prog), secret, bodyFile, header)
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Dir = dir
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1 && len(out) == 0) {
					t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return err == nil, string(out)
			}
			if ok, out := verify(secret, dl.Body, header); !ok {
				t.Errorf("the real delivery is rejected\n%s", out)
			}
			for name, c := range map[string]struct {
				secret, header string
				body           []byte
			}{
				"a changed body byte": {secret, header, tampered},
				"another secret":      {"whsec_" + strings.Repeat("A", 43) + "=", header, dl.Body},
				"another timestamp":   {secret, otherTime, dl.Body},
			} {
				if ok, _ := verify(c.secret, c.body, c.header); ok {
					t.Errorf("accepted with %s", name)
				}
			}
		})
	}
}
