package e2e

import (
	"context"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

var broadcastActionRe = regexp.MustCompile(`action="/dashboard/broadcasts/([0-9a-f-]{36})/pause"`)

// TestDemoBroadcast: on the repo's Caddyfile as `make run` runs the demo, the Demo page's "Send
// a demo broadcast" creates a broadcast of hello_world to ten made-up customers and opens its
// page; the sender sends each through the relay to the fake upstream, which answers one 130429
// once (the sender retries it after its backoff, then it is accepted: two sends) and another
// 131047 (failed, one send); every other recipient is sent once. The broadcast completes with
// one failed recipient, shown on its page with its error explained.
func TestDemoBroadcast(t *testing.T) {
	t.Parallel()
	w := startDemo(t)
	_, su := w.connectChannel(t, "Support line")
	c := w.signIn(t)

	st, page := c.do("GET", "/dashboard/demo", nil)
	m := batchRe.FindStringSubmatch(page)
	if st != 200 || m == nil || !strings.Contains(page, "Send a demo broadcast") {
		t.Fatalf("demo page: %d %.2000s", st, page)
	}
	st, page = c.do("POST", "/dashboard/demo/broadcast", url.Values{"phone_number_id": {su.PhoneNumberID}, "batch": {m[1]}})
	bm := broadcastActionRe.FindStringSubmatch(page)
	if st != 200 || bm == nil || !strings.Contains(page, "Demo broadcast created.") {
		t.Fatalf("demo broadcast: %d %.3000s", st, page)
	}
	bid := uuid.MustParse(bm[1])

	// waiting reads the store (polling the dashboard would meet the key's rate limit)
	var b store.Broadcast
	testenv.Eventually(t, testenv.Patience, func() bool {
		var err error
		if b, err = w.store.GetBroadcast(context.Background(), w.org, bid); err != nil {
			t.Fatal(err)
		}
		return b.Status == store.BroadcastCompleted
	}, "the demo broadcast completed")
	if b.Counts.Total != 10 || b.Counts.Queued != 0 || b.Counts.Unknown != 0 || b.Counts.Failed != 1 {
		t.Fatalf("counts %+v", b.Counts)
	}
	rs, err := w.store.BroadcastRecipients(context.Background(), w.org, bid, "", -1, 100)
	if err != nil || len(rs) != 10 {
		t.Fatalf("%d recipients: %v", len(rs), err)
	}
	for i, r := range rs {
		sends, want := len(w.fake.MessagesTo(r.To)), 1
		switch i {
		case 2: // 130429, then accepted
			want = 2
			if r.WAMID == "" || !slices.Contains([]string{"accepted", "sent", "delivered", "read"}, r.Status) || r.Attempts != 2 {
				t.Errorf("the retried recipient %s: %s after %d attempts", r.To, r.Status, r.Attempts)
			}
		case 6:
			if r.Status != "failed" || r.ErrorCode != 131047 {
				t.Errorf("the refused recipient %s: %s, error %d", r.To, r.Status, r.ErrorCode)
			}
		}
		if sends != want {
			t.Errorf("recipient %d (%s): %d sends reached the fake, want %d", i, r.To, sends, want)
		}
	}
	st, page = c.do("GET", "/dashboard/broadcasts/"+bid.String(), nil)
	if st != 200 || !strings.Contains(page, `<span class="badge completed">completed</span>`) ||
		!strings.Contains(page, "<code>"+rs[6].To+"</code>") || !strings.Contains(page, "Outside the 24-hour window") ||
		!regexp.MustCompile(`<code>`+rs[2].To+`</code></td>\s*<td>[a-z]+</td>\s*<td>2 \(retried\)</td>`).MatchString(page) {
		t.Fatalf("the broadcast's page: %d %.4000s", st, page)
	}
}
