package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

// inboundEnv starts Caddy with the inbound handler and delivery to an HTTPS receiver, and an
// active channel on pnid with an org-scoped webhook.
func inboundEnv(t *testing.T) (*relayEnv, string, *testenv.Receiver) {
	e := newRelayEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	origin := e.caddyWith("", fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, testenv.CAFile(t, rc.Certificate())), "handle /webhooks/upstream {\n wabarelay_inbound\n}")
	e.channelOn(true, pnid)
	e.fix.Webhook(t, e.org, rc.URL+"/h", &testenv.WebhookOpts{Name: "r", Events: []string{"messages", "message_status"}})
	return e, origin + "/webhooks/upstream", rc
}

// deliveredWith returns the bodies of the deliveries rc got that contain sub.
func deliveredWith(rc *testenv.Receiver, sub []byte) [][]byte {
	var out [][]byte
	for _, d := range rc.Deliveries() {
		if bytes.Contains(d.Body, sub) {
			out = append(out, d.Body)
		}
	}
	return out
}

// messagePost is a signed-able upstream post carrying the raw message objects msgs for pnid.
func messagePost(number string, msgs ...string) string {
	return `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":{"messaging_product":"whatsapp",` +
		`"metadata":{"display_phone_number":"15550100","phone_number_id":"` + number + `"},"contacts":[{"profile":{"name":"Ann"},"wa_id":"15550001111"}],` +
		`"messages":[` + strings.Join(msgs, ",") + `]}}]}]}`
}

// TestInboundStoresAnyContent: content never makes the inbound handler answer 5xx. Messages holding
// \u0000 escapes or raw invalid UTF-8 — in their text, their ids, their media ids, their
// number — are stored and delivered with the upstream's bytes exactly (or, for an unknown
// number, dropped); re-sends are recognised; a signed post that is not a WhatsApp payload at
// all gets 200 and is counted as malformed.
func TestInboundStoresAnyContent(t *testing.T) {
	t.Parallel()
	e, url, rc := inboundEnv(t)
	msgs := []string{
		`{"from":"15550001111","id":"wamid.nul1","timestamp":"1700000000","type":"text","text":{"body":"a\u0000b <i>&amp;</i>"}}`,
		"{\"from\":\"15550001111\",\"id\":\"wamid.bad1\",\"timestamp\":\"1700000000\",\"type\":\"text\",\"text\":{\"body\":\"caf\xe9 \xff\xfe\"}}",
		`{"from":"15550001111","id":"wamid.\u0000id","timestamp":"1700000000","type":"text","text":{"body":"id with NUL"}}`,
		"{\"from\":\"15550001111\",\"id\":\"wamid.\xc3\x28\",\"timestamp\":\"1700000000\",\"type\":\"text\",\"text\":{\"body\":\"id not UTF-8\"}}",
		`{"from":"15550001111","id":"wamid.img9","timestamp":"1700000000","type":"image","image":{"id":"77\u000077","mime_type":"image/jpeg"}}`,
	}
	post := messagePost(pnid, msgs...)
	status, body := signedPost(t, url, testAppSecret, post)
	if status != 200 || !strings.Contains(body, `"events":5`) {
		t.Fatalf("post: %d %s", status, body)
	}
	for _, m := range msgs {
		testenv.Eventually(t, 10*time.Second, func() bool { return len(deliveredWith(rc, []byte(m))) == 1 }, "the message delivered")
		got := deliveredWith(rc, []byte(m))[0]
		var ev struct {
			Data struct {
				Message json.RawMessage `json:"message"`
			} `json:"data"`
		}
		// the delivered event carries the message as the upstream sent it, byte for byte
		if i := bytes.Index(got, []byte(`"data":{"message":`)); i < 0 || !bytes.HasPrefix(got[i+len(`"data":{"message":`):], []byte(m)) {
			t.Fatalf("delivered %q does not carry the message %q as sent", got, m)
		}
		_ = json.Unmarshal(got, &ev)
	}
	// re-sends are duplicates, also for ids that are not text
	if status, body := signedPost(t, url, testAppSecret, post); status != 200 || !strings.Contains(body, `"duplicates":5`) {
		t.Fatalf("re-send: %d %s", status, body)
	}
	// a number that is not text is no channel's: dropped, 200 (a raw NUL is not even JSON:
	// that post counts as malformed)
	if status, body := signedPost(t, url, testAppSecret, messagePost("10\u00001", msgs[0])); status != 200 {
		t.Fatalf("NUL number: %d %s", status, body)
	}
	if status, body := signedPost(t, url, testAppSecret, messagePost(`10\u00001`, msgs[0])); status != 200 {
		t.Fatalf("escaped NUL number: %d %s", status, body)
	}
	// account changes with ids that are not text
	for _, acct := range []string{
		`{"object":"whatsapp_business_account","entry":[{"id":"w\u00003","changes":[{"field":"account_update","value":{"event":"ACCOUNT_BANNED"}}]}]}`,
		"{\"object\":\"whatsapp_business_account\",\"entry\":[{\"id\":\"" + wabaID + "\",\"changes\":[{\"field\":\"account_update\",\"value\":{\"event\":\"PHONE_NUMBER_REMOVED\",\"phone_number\":\"1\xff\"}}]}]}",
	} {
		if status, body := signedPost(t, url, testAppSecret, acct); status != 200 {
			t.Fatalf("account change %q: %d %s", acct, status, body)
		}
	}
	// not a WhatsApp payload at all: 200, counted, nothing stored
	before := e.upstreamEvents()
	for _, junk := range []string{`not json`, `[1,2]`, `{"object":"page","entry":[]}`, "{\"object\":\"\xff\"}", ``} {
		if status, body := signedPost(t, url, testAppSecret, junk); status != 200 {
			t.Fatalf("malformed %q: %d %s", junk, status, body)
		}
	}
	if n := e.upstreamEvents(); n != before {
		t.Fatalf("malformed posts stored %d events", n-before)
	}
	m := call(t, "GET", strings.TrimSuffix(url, "/webhooks/upstream")+"/metrics", "", "")
	if !bytes.Contains(m.body, []byte("\ncaddy_wabarelay_inbound_malformed_total 6\n")) {
		i := bytes.Index(m.body, []byte("\ncaddy_wabarelay_inbound_malformed_total "))
		t.Errorf("malformed posts not counted: %q", m.body[max(i, 0):min(max(i, 0)+60, len(m.body))])
	}
}

// TestInboundBanStates: account_update DISABLED_UPDATE deactivates the account's channels only
// when its ban state is DISABLE (Meta: SCHEDULE_FOR_DISABLE warns ahead, REINSTATE lifts it).
func TestInboundBanStates(t *testing.T) {
	t.Parallel()
	e, url, _ := inboundEnv(t)
	ch := e.channelOn(true, pnid2)
	update := func(state string) {
		t.Helper()
		body := `{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","time":1700000000,"changes":[{"field":"account_update",` +
			`"value":{"event":"DISABLED_UPDATE","ban_info":{"waba_ban_state":"` + state + `","waba_ban_date":"2026-11-25"}}}]}]}`
		if status, b := signedPost(t, url, testAppSecret, body); status != 200 {
			t.Fatalf("%s: %d %s", state, status, b)
		}
	}
	for _, state := range []string{inbound.BanScheduleForDisable, inbound.BanReinstate, "SOMETHING_NEW"} {
		update(state)
		if c, _ := e.store.GetChannel(context.Background(), e.org, ch.ID); c.Status != "active" {
			t.Fatalf("after %s the channel is %s", state, c.Status)
		}
	}
	update(inbound.BanDisable)
	if c, _ := e.store.GetChannel(context.Background(), e.org, ch.ID); c.Status != "inactive" {
		t.Fatalf("after DISABLE the channel is %s", c.Status)
	}
}

// TestInboundMutations: 500 seeded mutations of a valid signed batch (byte flips, \u0000 and
// invalid UTF-8 inserted in strings, 256 KiB strings, truncation, type swaps, random bytes),
// each signed correctly: never a 5xx, never a dropped connection.
func TestInboundMutations(t *testing.T) {
	t.Parallel()
	_, url, _ := inboundEnv(t)
	rng := rand.New(rand.NewSource(7))
	inserts := []string{`\u0000`, "\x00", "\xff", "\xc3\x28", `\ud800`, `"`, `{}`, `[]`, `null`, `123`, `1e999`, `-`, strings.Repeat("9", 400),
		hugeString(rng, 256<<10)}
	client := &http.Client{}
	for i := 0; i < 500; i++ {
		b := []byte(upstreamBatch(map[string][2][]string{pnid: {{fmt.Sprint("m", i)}, {fmt.Sprint("s", i)}}}))
		for n := 1 + rng.Intn(3); n > 0 && len(b) > 0; n-- { // (a truncation may leave nothing to mutate)
			switch rng.Intn(5) {
			case 0:
				b[rng.Intn(len(b))] ^= byte(1 + rng.Intn(255))
			case 1: // inside a string
				j := bytes.IndexByte(b[rng.Intn(len(b)):], '"')
				if j >= 0 {
					j += len(b) - len(b[j:]) // absolute index of that quote
				}
				if j >= 0 && j+1 < len(b) {
					b = append(b[:j+1:j+1], append([]byte(inserts[rng.Intn(len(inserts))]), b[j+1:]...)...)
				}
			case 2:
				b = b[:rng.Intn(len(b))]
			case 3: // replace a value's opening quote by another type's start
				if j := bytes.Index(b, []byte(`":"`)); j >= 0 {
					b = append(b[:j+2:j+2], append([]byte(inserts[rng.Intn(len(inserts))]+","), b[j+2:]...)...)
				}
			default:
				j := rng.Intn(len(b))
				junk := make([]byte, 1+rng.Intn(5))
				rng.Read(junk)
				b = append(b[:j:j], append(junk, b[j:]...)...)
			}
		}
		req, _ := http.NewRequest("POST", url, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(inbound.SignatureHeader, inbound.Sign(testAppSecret, b))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("#%d %q: connection lost: %v", i, b, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("#%d %q: answer cut off: %v", i, b, err)
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("#%d %.300q: %d %s", i, b, resp.StatusCode, got)
		}
	}
}

// TestInboundHugeFields: every field of a full batch in turn holds a huge string (256 KiB,
// 1 MiB): 200, and the re-post is recognised as a duplicate (one event per item). Apart from
// TestInboundMutations so that the two run side by side. Each size, and each half of the
// fields, is a parallel subtest with an environment of its own (its own database and Caddy),
// so that the four share the cores instead of taking turns on one. It is one of make test's
// volume tests (VOLUME_TESTS in the Makefile), run without -race: under it the inbound handler
// parses a megabyte string many times slower.
func TestInboundHugeFields(t *testing.T) {
	t.Parallel()
	half := len(testenv.FullBatchFields) / 2
	for i, size := range []int{256 << 10, 1 << 20} {
		for j, fields := range [][]string{testenv.FullBatchFields[:half], testenv.FullBatchFields[half:]} {
			t.Run(fmt.Sprintf("%d-%d", size, j), func(t *testing.T) {
				t.Parallel()
				e, url, _ := inboundEnv(t)
				inboundHugeFields(t, e, url, size, fields, rand.New(rand.NewSource(int64(8+2*i+j))))
			})
		}
	}
}

// hugeString returns n random letters and digits (incompressible, like the fuzzer's strings:
// a repeated character would be compressed below the index row limit). One random byte per
// character, taken modulo 62 (a slight bias towards the first eight, which does not matter):
// rng.Intn per character cost the test seconds under -race.
func hugeString(rng *rand.Rand, n int) string {
	const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rng.Read(b)
	for i, c := range b {
		b[i] = abc[int(c)%len(abc)]
	}
	return string(b)
}

// inboundHugeFields posts testenv.FullBatch with each of fields in turn holding a string of
// size bytes, twice: the first post stores its three items (none for a number no channel has),
// the second is all duplicates, and the database holds one event per item.
func inboundHugeFields(t *testing.T, e *relayEnv, url string, size int, fields []string, rng *rand.Rand) {
	for i, field := range fields {
		n := fmt.Sprint(size, "-", i)
		vals := map[string]string{"waba": wabaID, "phone_number_id": pnid, "message_id": "wamid.m" + n, "context_id": "wamid.c" + n,
			"image_message_id": "wamid.i" + n, "media_id": "media" + n, "status_id": "wamid.s" + n, "conversation_id": "conv" + n}
		vals[field] = hugeString(rng, size)
		post := testenv.FullBatch(vals)
		want := 3
		if field == "phone_number_id" {
			want = 0 // no channel's number: dropped
		}
		before := e.upstreamEvents()
		status, body := signedPost(t, url, testAppSecret, post)
		if status != 200 || !strings.Contains(body, fmt.Sprintf(`"events":%d}`, want)) {
			t.Errorf("%s of %d bytes: %d %s, want 200 with %d events", field, size, status, body, want)
			continue
		}
		status, body = signedPost(t, url, testAppSecret, post)
		if status != 200 || !strings.Contains(body, fmt.Sprintf(`"duplicates":%d,`, want)) || !strings.Contains(body, `"events":0}`) {
			t.Errorf("%s of %d bytes, re-posted: %d %s, want 200 with %d duplicates", field, size, status, body, want)
		}
		if got := e.upstreamEvents() - before; got != want {
			t.Errorf("%s of %d bytes: %d events stored, want %d", field, size, got, want)
		}
	}
}
