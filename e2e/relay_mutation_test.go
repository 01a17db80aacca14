package e2e

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestRelayMutations: 600 seeded mutations of valid relay calls (bodies with NUL characters,
// invalid UTF-8, truncation, odd idempotency keys; odd paths and credentials) never get a 5xx
// and never lose the connection: every answer is read whole.
func TestRelayMutations(t *testing.T) {
	t.Parallel()
	redisURL := testenv.Redis(t)
	e := newRelayEnv(t)
	// a catch-all route with a limit no mutation run reaches
	origin := e.caddyWith(redisURL, "", "handle {\n\t\twabarelay_proxy {\n\t\t\trate_limit 100000 1m\n\t\t}\n\t}")
	ch := e.channel(true)
	rng := rand.New(rand.NewSource(9))
	valid := `{"messaging_product":"whatsapp","to":"15551234567","type":"text","text":{"body":"hello"},"idempotency_key":"KEY"}`
	paths := []string{"/" + pnid + "/messages", "/v26.0/" + pnid + "/messages", "/" + wabaID + "/message_templates", "/" + pnid}
	mutateBody := func(b []byte) []byte {
		b = bytes.Clone(b)
		switch rng.Intn(9) {
		case 0: // flip a byte
			b[rng.Intn(len(b))] ^= byte(1 + rng.Intn(255))
			return b
		case 1: // a \u0000 escape inside a string
			return bytes.Replace(b, []byte("hello"), []byte(`hel\u0000lo`), 1)
		case 2: // a raw NUL or invalid UTF-8 byte inside a string
			return bytes.Replace(b, []byte("hello"), []byte("hel\x00\xff\xfelo"), 1)
		case 3: // truncate
			return b[:rng.Intn(len(b))]
		case 4: // the key as another JSON type
			return bytes.Replace(b, []byte(`"KEY"`), []byte([]string{`1`, `null`, `{}`, `["k"]`, `true`}[rng.Intn(5)]), 1)
		case 5: // a key that is too long, or empty, or holds odd characters
			return bytes.Replace(b, []byte(`"KEY"`), []byte([]string{`"` + strings.Repeat("k", 300) + `"`, `""`, `"k\u0000"`, "\"k\xff\"", `"k\ud800"`}[rng.Intn(5)]), 1)
		case 6: // the key twice
			return bytes.Replace(b, []byte(`{`), []byte(`{"idempotency_key":"dup",`), 1)
		case 7: // nested depth
			return []byte(strings.Repeat("[", 10000))
		default: // insert random bytes
			i := rng.Intn(len(b))
			junk := make([]byte, 1+rng.Intn(8))
			rng.Read(junk)
			b = append(b[:i], append(junk, b[i:]...)...)
		}
		return b
	}
	mutatePath := func(p string) string {
		switch rng.Intn(6) {
		case 0:
			return p + "/" + strconv.Itoa(rng.Intn(1e6))
		case 1:
			return strings.Replace(p, "/", "%2F", 2)
		case 2:
			return p + "/../" + otherPnid
		case 3:
			return p + "?access_token=x&%zz"
		case 4:
			return "/" + strings.Repeat("a", 3000)
		default:
			return p
		}
	}
	client := &http.Client{}
	for i := 0; i < 600; i++ {
		method := []string{"POST", "POST", "POST", "GET", "DELETE", "PUT"}[rng.Intn(6)]
		body := mutateBody([]byte(strings.Replace(valid, "KEY", "k"+strconv.Itoa(rng.Intn(50)), 1)))
		path := paths[rng.Intn(len(paths))]
		if rng.Intn(3) == 0 {
			path = mutatePath(path)
		}
		req, err := http.NewRequest(method, origin+path, bytes.NewReader(body))
		if err != nil {
			continue // not a request a client can send
		}
		req.Header.Set("Content-Type", []string{"application/json", "text/plain", "application/json; charset=latin1", ""}[rng.Intn(4)])
		switch rng.Intn(8) {
		case 0:
			req.Header.Set("Authorization", "Bearer "+randomToken())
		case 1:
			req.Header.Set("Authorization", "bearer  "+ch.ChannelToken)
		case 2:
			req.Header.Set("Authorization", "Bearer "+ch.ChannelToken+"x")
		default:
			req.Header.Set("Authorization", "Bearer "+ch.ChannelToken)
		}
		desc := fmt.Sprintf("#%d %s %s %q", i, method, path, body)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: connection lost: %v", desc, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: answer cut off: %v", desc, err)
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("%s: %d %s", desc, resp.StatusCode, b)
		}
	}
}
