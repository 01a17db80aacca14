package connect

import (
	"html/template"
	"strings"
	"testing"
)

// TestTemplates renders the templates with the handler's data (no browser): every field is
// used where it should be and escaped.
func TestTemplates(t *testing.T) {
	parse := func(name string) *template.Template {
		t.Helper()
		return template.Must(template.ParseFS(templates, "templates/"+name))
	}
	pageT := parse("page.html")
	var b strings.Builder
	err := pageT.Execute(&b, pageData{
		ChannelName: `Bob's <Shop> & "Co"`, AppID: "111", ConfigID: "222",
		SDKURL: "https://connect.facebook.net/en_US/sdk.js", GraphVersion: "v26.0",
		PostURL: "/connect/complete", CSPNonce: "n0nce", AssetBase: "/connect/assets/", OriginSuffix: "facebook.com",
	})
	if err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{
		`data-app-id="111"`, `data-config-id="222"`, `data-sdk-url="https://connect.facebook.net/en_US/sdk.js"`,
		`data-graph-version="v26.0"`, `data-post-url="/connect/complete"`, `data-origin-suffix="facebook.com"`,
		`src="/connect/assets/connect.js" defer nonce="n0nce"`, `href="/connect/assets/connect.css" nonce="n0nce"`,
		`Bob&#39;s &lt;Shop&gt; &amp; &#34;Co&#34;`, `>Connect WhatsApp</button>`, `<noscript>`, `role="status"`, `aria-live="polite"`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("page.html output lacks %s", want)
		}
	}
	if strings.Contains(html, "<script>") || strings.Contains(html, "style=") {
		t.Errorf("page.html has inline script or style")
	}

	// Without a nonce no empty nonce attribute appears.
	b.Reset()
	if err := pageT.Execute(&b, pageData{AssetBase: "/a/", OriginSuffix: "facebook.com"}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "nonce") {
		t.Errorf("page.html without a nonce still renders one")
	}

	for _, name := range []string{"expired.html"} {
		b.Reset()
		data := struct{ AssetBase, ChannelName string }{"/connect/assets/", "Acme"}
		if err := parse(name).Execute(&b, data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// expired.html needs nothing but AssetBase.
	b.Reset()
	if err := parse("expired.html").Execute(&b, struct{ AssetBase string }{"/x/"}); err != nil {
		t.Errorf("expired.html with only AssetBase: %v", err)
	}
}
