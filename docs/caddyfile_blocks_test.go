package docs_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/wabarelay/wabarelay/caddymodule"
)

// fencedBlock is one fenced code block of a manual page.
type fencedBlock struct {
	file string
	line int // of the opening fence
	text string
}

// fencedBlocks returns the blocks of the README and docs/*.md whose fence is ```<lang> (leading
// indentation allowed: blocks inside list items). The block's lines lose the fence's indentation.
func fencedBlocks(t *testing.T, lang string) []fencedBlock {
	t.Helper()
	files := []string{"../README.md"}
	more, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []fencedBlock
	for _, f := range append(files, more...) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		for i := 0; i < len(lines); i++ {
			trimmed := strings.TrimLeft(lines[i], " \t")
			if trimmed != "```"+lang {
				continue
			}
			indent := lines[i][:len(lines[i])-len(trimmed)]
			b := fencedBlock{file: f, line: i + 1}
			var body []string
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
				body = append(body, strings.TrimPrefix(lines[i], indent))
			}
			b.text = strings.Join(body, "\n") + "\n"
			out = append(out, b)
		}
	}
	return out
}

// placeholderRe finds the environment placeholders of a Caddyfile: {env.NAME} (resolved when the
// config loads) and {$NAME} / {$NAME:default} (substituted when it is adapted).
var placeholderRe = regexp.MustCompile(`\{(?:env\.|\$)([A-Za-z_][A-Za-z0-9_]*)(?::[^}]*)?\}`)

// globalSubblocks are the wabarelay global option's own blocks: a page that shows one of them
// alone shows it inside `wabarelay { … }`.
var globalSubblocks = map[string]bool{"limits": true, "redis": true, "delivery": true, "meta": true}

// jsonName maps a Caddyfile option or subdirective to a key or string value its adapted JSON
// holds when the name itself does not appear there.
var jsonName = map[string]string{
	// Caddy's own
	"read_header": "read_header_timeout",
	"read_body":   "read_timeout",
	"timeouts":    "read_header_timeout",
	"log":         "logs",
	"format":      "encoder",
	"header":      "headers",
	"header_up":   "request",
	"handle":      "subroute",
	"handle_path": "strip_path_prefix",
	"bind":        "listen",
	"tls":         "internal", // a site's `tls internal` (the redis block's `tls` is its JSON key)
	// wabarelay's
	"wabarelay_proxy": "wabarelay_relay",
	"rate_limit":      "requests",
}

// optionNames returns the option or subdirective each line of a Caddyfile block starts with,
// with its line number, skipping site addresses and braces. Inside the `wabarelay` global option
// the names are the JSON keys; elsewhere they map through jsonName. A line
// whose arguments are all zero values ("0", "false") is left out: the JSON omits zero values.
func optionNames(block string) map[int]string {
	out := map[int]string{}
	depth := 0
	inWabarelay := -1 // depth at which the wabarelay option opened, -1 outside it
	for n, line := range strings.Split(block, "\n") {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		opens := fields[len(fields)-1] == "{"
		name := fields[0]
		switch {
		case name == "}":
			depth--
			if depth == inWabarelay {
				inWabarelay = -1
			}
			continue
		case name == "{":
			depth++
			continue
		}
		args := fields[1:]
		if opens {
			args = args[:len(args)-1]
		}
		siteAddress := depth == 0 && opens && name != "wabarelay" && !strings.HasPrefix(name, "wabarelay_") && !globalSubblocks[name]
		zero := len(args) > 0
		for _, a := range args {
			zero = zero && (a == "0" || a == "false")
		}
		if !siteAddress && !zero {
			mapped, ok := jsonName[name]
			if inWabarelay >= 0 || !ok {
				mapped = name
			}
			out[n+1] = mapped
		}
		if (name == "wabarelay" || depth == 0 && globalSubblocks[name]) && opens {
			inWabarelay = depth
		}
		if opens {
			depth++
		}
	}
	return out
}

// completeBlock makes a page's block a whole Caddyfile: a subblock of the global option goes
// inside `wabarelay { … }`, a handler directive inside a site, and every block that uses
// wabarelay without the global option gets its two required settings. `[<matcher>]` (syntax
// notation) is dropped.
func completeBlock(block string) string {
	block = strings.ReplaceAll(block, " [<matcher>]", "")
	first := strings.Fields(block)[0]
	const required = "\tdatabase {env.WABARELAY_DATABASE_URL}\n\tencryption_key {env.WABARELAY_ENCRYPTION_KEY}\n"
	switch {
	case globalSubblocks[first]:
		return "{\n\twabarelay {\n" + required + block + "\t}\n}\n"
	case strings.HasPrefix(first, "wabarelay_"):
		return "{\n\twabarelay {\n" + required + "\t}\n}\n:8080 {\n" + block + "}\n"
	case strings.Contains(block, "wabarelay") && !regexp.MustCompile(`(?m)^\s*wabarelay \{`).MatchString(block):
		return "{\n\twabarelay {\n" + required + "\t}\n}\n" + block
	}
	return block
}

// plausible is a value for an environment placeholder, by its name.
func plausible(t *testing.T, name, caFile string) string {
	switch {
	case strings.HasSuffix(name, "DATABASE_URL"):
		return "postgres://wabarelay@127.0.0.1:1/wabarelay?sslmode=disable"
	case strings.HasSuffix(name, "REDIS_URL"):
		return "redis://127.0.0.1:1"
	case strings.HasSuffix(name, "ENCRYPTION_KEY"):
		return base64.StdEncoding.EncodeToString(make([]byte, 32))
	case strings.HasSuffix(name, "REGISTER_PIN"):
		return "123456"
	case strings.HasSuffix(name, "_CA"):
		return caFile
	case strings.HasSuffix(name, "ALLOW_PRIVATE_TARGETS"):
		return "true"
	case strings.HasSuffix(name, "FAKE_UPSTREAM"):
		return "http://127.0.0.1:8090"
	case strings.HasSuffix(name, "RECEIVER"):
		return "https://127.0.0.1:8091"
	case strings.HasSuffix(name, "UPSTREAM"):
		return "https://graph.facebook.com/v26.0"
	case strings.HasSuffix(name, "SDK_URL"):
		return "https://connect.facebook.net/en_US/sdk.js"
	}
	return "docs-test-value"
}

// jsonWords is every object key and string value of a JSON document.
func jsonWords(v any, into map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			into[k] = true
			jsonWords(x, into)
		}
	case []any:
		for _, x := range v {
			jsonWords(x, into)
		}
	case string:
		into[v] = true
	}
}

// TestCaddyfileBlocksAdapt: every ```caddyfile block of the README and docs/ (a fragment made
// whole by completeBlock) adapts, passes `caddy validate` with its placeholders set to plausible
// values — and again with the placeholders its comments call optional unset —, and every option
// or subdirective it shows appears in the adapted JSON (a line that was dropped, or an option
// the docs name that the code calls otherwise, fails). No block needs a mark: fragments are
// recognised by their first word.
func TestCaddyfileBlocksAdapt(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir()) // Caddy's storage (the local CA of `tls internal`)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	caFile := writeTestCA(t)
	blocks := fencedBlocks(t, "caddyfile")
	if len(blocks) < 5 {
		t.Fatalf("found %d caddyfile blocks; the extraction is broken", len(blocks))
	}
	for _, b := range blocks {
		t.Run(filepath.Base(b.file)+":"+strconv.Itoa(b.line), func(t *testing.T) {
			cfg := completeBlock(b.text)
			optional := map[string]bool{}
			for _, line := range strings.Split(cfg, "\n") {
				_, comment, _ := strings.Cut(line, " #")
				for _, m := range placeholderRe.FindAllStringSubmatch(line, -1) {
					t.Setenv(m[1], plausible(t, m[1], caFile))
					if strings.Contains(strings.ToLower(comment), "optional") {
						optional[m[1]] = true
					}
				}
			}
			check := func(label string) {
				adapted, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": b.file})
				if err != nil {
					t.Fatalf("%s: adapt: %v\n%s", label, err, cfg)
				}
				for _, w := range warnings {
					if !strings.Contains(w.Message, "formatted") { // caddy fmt's indentation advice
						t.Errorf("%s: adapt warning: %s", label, w.Message)
					}
				}
				var doc any
				if err := json.Unmarshal(adapted, &doc); err != nil {
					t.Fatal(err)
				}
				words := map[string]bool{}
				jsonWords(doc, words)
				for line, name := range optionNames(b.text) {
					if !words[name] {
						t.Errorf("%s: %s:%d: %q is not in the adapted JSON", label, b.file, b.line+line, name)
					}
				}
				var c caddy.Config
				if err := json.Unmarshal(adapted, &c); err != nil {
					t.Fatal(err)
				}
				if err := caddy.Validate(&c); err != nil {
					t.Errorf("%s: validate: %v\n%s", label, err, cfg)
				}
			}
			check("placeholders set")
			if len(optional) > 0 {
				for name := range optional {
					t.Setenv(name, "")
				}
				check("optional placeholders unset")
			}
		})
	}
}

// writeTestCA writes a self-signed CA certificate (PEM) for the blocks' root_ca and receiver_ca.
func writeTestCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "docs test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}
