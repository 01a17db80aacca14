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
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	version := flag.String("version", fakegraph.DefaultVersion, "Graph API version segment served")
	token := flag.String("token", "EAAdemo-fake-access-token", "access token to accept")
	pnid := flag.String("pnid", "106540352242922", "phone number id the token may use")
	waba := flag.String("waba", "102290129340398", "WhatsApp Business Account id of the number")
	display := flag.String("display", "+1 555 0100", "display phone number")
	name := flag.String("name", "Wabarelay Demo", "verified name of the number")
	appID := flag.String("app-id", "", "app id checked as client_id by oauth/access_token (empty: any)")
	appSecret := flag.String("app-secret", "", "app secret checked as client_secret (empty: any)")
	code := flag.String("code", "", "an Embedded Signup code to accept once (exchanged for -token)")
	codeTTL := flag.Duration("code-ttl", time.Hour, "lifetime of -code")
	latency := flag.Duration("latency", 0, "delay added to every response")
	quiet := flag.Bool("quiet", false, "do not log requests")
	flag.Parse()

	var logw io.Writer = os.Stderr
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
	g := fakegraph.New(opts...)
	g.AddNumber(*pnid, *waba, *display, *name)
	g.AddToken(*token, []string{*pnid}, []string{*waba})
	g.AddTemplates(*waba,
		fakegraph.Template{Name: "hello_world", Language: "en_US", Status: "APPROVED", Category: "UTILITY",
			Components: []any{
				map[string]any{"type": "HEADER", "format": "TEXT", "text": "Hello World"},
				map[string]any{"type": "BODY", "text": "Welcome and congratulations!! This message demonstrates your ability to send a WhatsApp message notification from the Cloud API, hosted by Meta. Thank you for taking the time to test with us."},
				map[string]any{"type": "FOOTER", "text": "WhatsApp Business Platform sample message"},
			}},
		fakegraph.Template{Name: "order_update", Language: "en_US", Status: "APPROVED", Category: "UTILITY",
			Components: []any{
				map[string]any{"type": "BODY", "text": "Hi {{1}}, your order {{2}} has shipped.",
					"example": map[string]any{"body_text": [][]string{{"Ana", "A-1042"}}}},
			}},
		fakegraph.Template{Name: "seasonal_promo", Language: "en_US", Status: "PENDING", Category: "MARKETING",
			Components: []any{map[string]any{"type": "BODY", "text": "Our sale starts {{1}}!"}}},
	)
	if *code != "" {
		g.AddCode(*code, *token, *codeTTL)
	}
	g.SetLatency(*latency)

	base, err := g.Listen(*addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakegraph:", err)
		os.Exit(1)
	}
	fmt.Println(base)
	fmt.Fprintf(os.Stderr, "fakegraph: serving %s/%s (token %q, phone number %s, WABA %s)\n", base, *version, *token, *pnid, *waba)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	g.Close()
}
