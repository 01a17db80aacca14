package connect_test

import (
	"testing"

	"github.com/wabarelay/wabarelay/connect"
	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/store"
)

// TestUnsubscriber: the deleted channel's business account loses the app's subscription
// upstream, called with the channel's token; a failure (an unknown token) leaves it as it was.
func TestUnsubscriber(t *testing.T) {
	fake := fakegraph.New()
	base := fake.Start()
	t.Cleanup(fake.Close)
	fake.AddToken("tok", nil, []string{"W1"})
	fake.SetSubscribed("W1", true)
	unsubscribe := connect.Unsubscriber(graph.New(base+"/"+fake.Version(), nil), nil)

	unsubscribe(store.DeletedChannel{WabaID: "W1", UpstreamToken: "not-a-token"})
	if sub, _ := fake.Subscribed("W1"); !sub {
		t.Fatal("unsubscribed with a token the upstream refuses")
	}
	unsubscribe(store.DeletedChannel{WabaID: "W1", UpstreamToken: "tok"})
	if sub, _ := fake.Subscribed("W1"); sub {
		t.Fatal("the business account is still subscribed")
	}
}
