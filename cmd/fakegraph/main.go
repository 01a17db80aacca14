// Command fakegraph runs the project's fake Graph API (internal/fakegraph) for local demos, so the
// relay can be exercised without reaching graph.facebook.com.
//
// Usage:
//
//	go run ./cmd/fakegraph -addr 127.0.0.1:8090 -token EAAdemo -pnid 106540352242922 -waba 102290129340398
//
// It seeds one access token (-token) allowed to use one phone number (-pnid, display number
// "+1 555 0100") of one WhatsApp Business Account (-waba), with a few templates: hello_world
// (APPROVED, no parameters), order_update (APPROVED, two body parameters), seasonal_promo (PENDING).
// With -code it also accepts that Embedded Signup code once at GET /<version>/oauth/access_token
// (client_id -app-id, client_secret -app-secret), issuing -token. It prints its base URL, e.g.
// "http://127.0.0.1:8090"; point the relay's upstream at "<base>/v26.0". One log line per request
// goes to stderr (disable with -quiet). Stop it with Ctrl-C.
//
// Try it:
//
//	curl -s -H 'Authorization: Bearer EAAdemo' -H 'Content-Type: application/json' \
//	  -d '{"messaging_product":"whatsapp","to":"+16505551234","type":"text","text":{"body":"hi"}}' \
//	  http://127.0.0.1:8090/v26.0/106540352242922/messages
//	curl -s -H 'Authorization: Bearer EAAdemo' \
//	  'http://127.0.0.1:8090/v26.0/102290129340398/message_templates?fields=name,status&limit=2'
//
// Media, the whole path (what the relay does for a channel token, here with the upstream token):
// upload, read the media object, download from its url (on a separate path of the fake that
// answers only to a token allowed for the medium's number; byte ranges work), delete.
//
//	id=$(curl -s -H 'Authorization: Bearer EAAdemo' -F messaging_product=whatsapp -F type=image/png \
//	  -F file=@photo.png http://127.0.0.1:8090/v26.0/106540352242922/media | jq -r .id)
//	url=$(curl -s -H 'Authorization: Bearer EAAdemo' http://127.0.0.1:8090/v26.0/$id | jq -r .url)
//	curl -s -H 'Authorization: Bearer EAAdemo' -H 'Range: bytes=0-99' "$url" | wc -c     # 100
//	curl -s -X DELETE -H 'Authorization: Bearer EAAdemo' http://127.0.0.1:8090/v26.0/$id
//
// Through the relay (upstream <base>/v26.0), the same with a channel token against {proxy_url}:
// the media object's url is then {proxy_url}/<id>/download.
//
// The demo (`make run` without a Meta app starts it so) adds what the real upstream does outside
// its API:
//
//   - Embedded Signup (-demo-sdk, on by default): GET /sdk.js is a stand-in for Meta's JS SDK;
//     point the connect page's `meta { sdk_url }` at it (and `wabarelay_connect { origin_suffix
//     localhost }`, as the stand-in posts its messages from the page itself). Each fetch makes up
//     a phone number ("+1 555 0101", "+1 555 0102", ...) of a new business account and a one-time
//     code, valid -signup-code-ttl, that exchanges (with -app-id and -app-secret) for a token
//     allowed to use them; "Connect WhatsApp" on the page shows a small demo dialog instead of
//     Meta's window. POST /_fake/signup makes up the same as JSON, for a completion without a
//     browser:
//
//     curl -s -X POST http://127.0.0.1:8090/_fake/signup |
//     curl -s -X POST http://localhost:8080/connect/$CHANNEL_TOKEN -H 'Content-Type: application/json' -d @-
//
//   - Webhooks (-callback, the app's callback URL, e.g. http://localhost:8080/webhooks/upstream):
//     POST /_fake/inbound sends an incoming message there, as the upstream's "messages" webhook
//     signed with -app-secret, and answers with the callback's status. JSON body, every member
//     optional: phone_number_id (default: the number of the last signup completed), from (the
//     sender's digits), name, text (default "Hello"), type ("text" or "image": a small PNG the
//     business can download through the relay, text as its caption). Every message sent through
//     the fake is also followed by its "sent", "delivered" and "read" status webhooks, one every
//     -status-delay (1s by default, so that a message's timeline fills in as one watches); a
//     message to a made-up recipient whose number starts with 999 (a country calling code no
//     one has, e.g. "+999 555 0100") is accepted, then reported "failed" with error 131026
//     (Message undeliverable), as the upstream reports a number that is not on WhatsApp.
//
//     curl -s http://127.0.0.1:8090/_fake/inbound -d '{"text":"Hello"}'
//
//     "timestamp" (unix seconds) or "age" (e.g. "25h") sets when the customer sent it, as a
//     late webhook carries it: a message 25 hours old leaves its customer's window closed.
//
//     POST /_fake/account_webhook sends one of the four account webhooks after which the relay
//     reads a number's health, signed like the others, after changing what the number's GET
//     answers. JSON body, every member optional: phone_number_id (default: the last signup's),
//     field (phone_number_quality_update, the default; phone_number_name_update,
//     account_update, business_capability_update), event (FLAGGED by default for a quality
//     update, which makes the number's quality_rating YELLOW; UNFLAGGED makes it GREEN; the
//     decision of a name update), quality_rating, messaging_limit, name_status, throughput
//     (the number's new values):
//
//     curl -s http://127.0.0.1:8090/_fake/account_webhook -d '{"event":"FLAGGED"}'
//     curl -s http://127.0.0.1:8090/_fake/account_webhook -d '{"quality_rating":"RED"}'
//
//     POST /_fake/script makes the next sends to a recipient answer upstream errors, one per
//     send and in order, each in the upstream's envelope for its code; the sends after them
//     succeed again (the demo broadcast's retried and failed recipients):
//
//     curl -s http://127.0.0.1:8090/_fake/script -d '{"to":"16505550101","errors":[130429,131047]}'
//
//   - A webhook receiver (-receiver 127.0.0.1:8091): HTTPS, any path, with a certificate from a
//     CA made up at start and written to -receiver-ca (give that file to Caddy's `delivery {
//     root_ca }`, and `allow_private_targets`). It logs every delivery to stderr, answers 204,
//     and GET lists the last 50. It does not verify signatures.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

// demoTemplates are the templates of the seeded business account and of every signup's.
var demoTemplates = []fakegraph.Template{
	{Name: "hello_world", Language: "en_US", Status: "APPROVED", Category: "UTILITY",
		Components: []any{
			map[string]any{"type": "HEADER", "format": "TEXT", "text": "Hello World"},
			map[string]any{"type": "BODY", "text": "Welcome and congratulations!! This message demonstrates your ability to send a WhatsApp message notification from the Cloud API, hosted by Meta. Thank you for taking the time to test with us."},
			map[string]any{"type": "FOOTER", "text": "WhatsApp Business Platform sample message"},
		}},
	{Name: "order_update", Language: "en_US", Status: "APPROVED", Category: "UTILITY",
		Components: []any{
			map[string]any{"type": "BODY", "text": "Hi {{1}}, your order {{2}} has shipped.",
				"example": map[string]any{"body_text": [][]string{{"Ana", "A-1042"}}}},
		}},
	{Name: "seasonal_promo", Language: "en_US", Status: "PENDING", Category: "MARKETING",
		Components: []any{map[string]any{"type": "BODY", "text": "Our sale starts {{1}}!"}}},
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	version := flag.String("version", fakegraph.DefaultVersion, "Graph API version segment served")
	token := flag.String("token", "EAAdemo-fake-access-token", "access token to accept")
	pnid := flag.String("pnid", "106540352242922", "phone number id the token may use")
	waba := flag.String("waba", "102290129340398", "WhatsApp Business Account id of the number")
	display := flag.String("display", "+1 555 0100", "display phone number")
	name := flag.String("name", "Wabarelay Demo", "verified name of the number")
	appID := flag.String("app-id", "", "app id checked as client_id by oauth/access_token (empty: any)")
	appSecret := flag.String("app-secret", "", "app secret checked as client_secret, and signing webhooks (empty: any; no webhooks)")
	code := flag.String("code", "", "an Embedded Signup code to accept once (exchanged for -token)")
	codeTTL := flag.Duration("code-ttl", time.Hour, "lifetime of -code")
	demoSDK := flag.Bool("demo-sdk", true, "serve the demo Embedded Signup: GET /sdk.js and POST /_fake/signup")
	signupTTL := flag.Duration("signup-code-ttl", fakegraph.DefaultSignupCodeTTL, "lifetime of the codes /sdk.js and /_fake/signup make up")
	callback := flag.String("callback", "", "the app's callback URL: enables POST /_fake/inbound and status webhooks (needs -app-secret)")
	statusDelay := flag.Duration("status-delay", time.Second, "wait before each status webhook of a sent message")
	receiverAddr := flag.String("receiver", "", "also serve a webhook receiver over HTTPS on this address, e.g. 127.0.0.1:8091")
	receiverCA := flag.String("receiver-ca", "", "write the receiver's CA certificate (PEM) to this file")
	logFile := flag.String("log", "", "write the request log to this file instead of stderr")
	latency := flag.Duration("latency", 0, "delay added to every response")
	quiet := flag.Bool("quiet", false, "do not log requests")
	flag.Parse()

	if *callback != "" && *appSecret == "" {
		fail(errors.New("-callback needs -app-secret (webhooks are signed with it)"))
	}
	var logw io.Writer = os.Stderr
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fail(err)
		}
		defer func() {
			if err := f.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "fakegraph: request log:", err)
			}
		}()
		logw = f
	}
	if *quiet {
		logw = nil
	}
	opts := []fakegraph.Option{fakegraph.WithVersion(*version), fakegraph.WithMaxRecorded(1000)}
	if logw != nil {
		opts = append(opts, fakegraph.WithLog(logw))
	}
	if *appID != "" {
		opts = append(opts, fakegraph.WithAppID(*appID))
	}
	if *appSecret != "" {
		opts = append(opts, fakegraph.WithAppSecret(*appSecret))
	}
	if *demoSDK {
		opts = append(opts, fakegraph.WithDemoSDK(*signupTTL, demoTemplates...))
	}
	if *callback != "" {
		opts = append(opts, fakegraph.WithCallback(*callback), fakegraph.WithStatusDelay(*statusDelay))
	}
	g := fakegraph.New(opts...)
	g.AddNumber(*pnid, *waba, *display, *name)
	g.AddToken(*token, []string{*pnid}, []string{*waba})
	g.AddTemplates(*waba, demoTemplates...)
	if *code != "" {
		g.AddCode(*code, *token, *codeTTL)
	}
	g.SetLatency(*latency)

	var recv *http.Server
	recvURL := ""
	if *receiverAddr != "" {
		var err error
		if recvURL, recv, err = fakegraph.ListenTLS(*receiverAddr, *receiverCA, &fakegraph.Receiver{Log: os.Stderr}); err != nil {
			fail(err)
		}
	}
	base, err := g.Listen(*addr)
	if err != nil {
		fail(err)
	}
	fmt.Println(base)
	fmt.Fprintf(os.Stderr, "fakegraph: serving %s/%s (token %q, phone number %s, WABA %s)\n", base, *version, *token, *pnid, *waba)
	if *demoSDK {
		fmt.Fprintf(os.Stderr, "fakegraph: demo Embedded Signup SDK at %s/sdk.js (each fetch makes up a number; codes live %s)\n", base, *signupTTL)
	}
	if *callback != "" {
		fmt.Fprintf(os.Stderr, "fakegraph: POST %s/_fake/inbound sends an incoming message to %s\n", base, *callback)
		fmt.Fprintf(os.Stderr, "fakegraph: POST %s/_fake/account_webhook sends an account webhook (health) to %s\n", base, *callback)
		fmt.Fprintf(os.Stderr, "fakegraph: POST %s/_fake/script scripts upstream errors for a recipient's next sends\n", base)
		fmt.Fprintf(os.Stderr, "fakegraph: sent messages are reported sent, delivered, read (every %s); to +999... failed (131026)\n", *statusDelay)
	}
	if recvURL != "" {
		fmt.Fprintf(os.Stderr, "fakegraph: webhook receiver at %s/ (CA certificate: %s)\n", recvURL, *receiverCA)
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	g.Close()
	if recv != nil {
		_ = recv.Close() // shutting down: the process exits next
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fakegraph:", err)
	os.Exit(1)
}
