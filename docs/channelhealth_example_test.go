package docs_test

import (
	"os"
	"strings"
	"testing"
)

// jsonBlockWith returns the first ```json block of a page that contains needle.
func jsonBlockWith(t *testing.T, page, needle string) string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range strings.Split(string(b), "```json\n")[1:] {
		block, _, ok := strings.Cut(part, "\n```")
		if ok && strings.Contains(block, needle) {
			return block
		}
	}
	t.Fatalf("%s has no json block with %s", page, needle)
	return ""
}

// TestChannelHealthExampleAgrees: the receiver guide's channel_health example is the payload
// Events documents, byte for byte.
func TestChannelHealthExampleAgrees(t *testing.T) {
	const needle = `"type":"channel_health"`
	if g, e := jsonBlockWith(t, "receiver-guide.md", needle), jsonBlockWith(t, "events.md", needle); g != e {
		t.Fatalf("receiver-guide.md's channel_health example:\n%s\nevents.md's:\n%s", g, e)
	}
}
