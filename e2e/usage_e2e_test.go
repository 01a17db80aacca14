package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestUsageEndToEnd: sends through the relay are counted in GET /v1/usage from the pricing of
// the fake upstream's status webhooks, which come back through the inbound endpoint — sent and
// delivered each carry one, and a message counts once: a template (hello_world, UTILITY) to a
// British number, billable; a text to a US number, a free service message; the CSV says the same.
func TestUsageEndToEnd(t *testing.T) {
	t.Parallel()
	w := startDemo(t)
	ch, su := w.connectChannel(t, "Support line")
	sendURL := w.origin + "/upstream-proxy/" + su.PhoneNumberID + "/messages"
	for _, body := range []string{
		`{"messaging_product":"whatsapp","to":"+44 20 7946 0958","type":"template","template":{"name":"hello_world","language":{"code":"en_US"}}}`,
		`{"messaging_product":"whatsapp","to":"12127365000","type":"text","text":{"body":"Your order shipped"}}`,
	} {
		if r := call(t, "POST", sendURL, ch.ChannelToken, body); r.status != 200 {
			t.Fatalf("send: %d %s", r.status, r.body)
		}
	}
	today := time.Now().UTC().Format("2006-01-02")
	want := []string{ // (by category: service before utility)
		fmt.Sprintf("%s %s service free_customer_service US 1 0", today, ch.ID),
		fmt.Sprintf("%s %s utility regular GB 1 1", today, ch.ID),
	}
	var got []string
	// each message's three statuses (two priced) have come once "read" is its latest
	testenv.Eventually(t, time.Minute, func() bool {
		r := w.api("GET", "/channels/"+ch.ID+"/messages", "")
		var ms []struct{ Status string }
		return r.status == 200 && json.Unmarshal(r.body, &ms) == nil && len(ms) == 2 && ms[0].Status == "read" && ms[1].Status == "read"
	}, "both messages read")
	r := w.api("GET", "/usage", "")
	var u struct {
		Rows []struct {
			Day, Category, Country string
			ChannelID              string `json:"channel_id"`
			PricingType            string `json:"pricing_type"`
			Messages, Billable     int
		}
		Totals struct{ Messages, Billable int }
	}
	if r.status != 200 || json.Unmarshal(r.body, &u) != nil {
		t.Fatalf("usage: %d %s", r.status, r.body)
	}
	for _, row := range u.Rows {
		got = append(got, fmt.Sprintf("%s %s %s %s %s %d %d", row.Day, row.ChannelID, row.Category, row.PricingType, row.Country, row.Messages, row.Billable))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || u.Totals.Messages != 2 || u.Totals.Billable != 1 {
		t.Fatalf("usage:\n%s\nwant\n%s\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), r.body)
	}
	r = w.api("GET", "/usage?format=csv&channel_id="+ch.ID, "")
	if r.status != 200 || !strings.HasPrefix(string(r.body), "day,channel_id,category,pricing_type,country,messages,billable,cost\n") ||
		!strings.Contains(string(r.body), today+","+ch.ID+",utility,regular,GB,1,1,\n") {
		t.Fatalf("csv: %d %s", r.status, r.body)
	}
}
