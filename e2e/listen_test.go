package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestChannelListenerWithPoolParams: a `database` DSN carrying pool parameters (accepted by the
// pool) also works for the channel cache's LISTEN connection, so a channel deleted elsewhere is
// refused by another instance at once — by notification, far inside the cache's 30 s TTL.
func TestChannelListenerWithPoolParams(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	if strings.Contains(dsn, "?") {
		dsn += "&pool_max_conns=4"
	} else if strings.Contains(dsn, "://") {
		dsn += "?pool_max_conns=4"
	} else {
		dsn += " pool_max_conns=4"
	}
	e := newRelayEnvOn(t, dsn)
	b := e.caddy("")
	ch := e.channel(true)
	if r := call(t, "POST", b+"/"+pnid+"/messages", ch.ChannelToken, textBody); r.status != 200 {
		t.Fatalf("before: %d %s", r.status, r.body)
	}
	if _, err := e.store.DeleteChannel(context.Background(), e.org, ch.ID, true); err != nil {
		t.Fatal(err)
	}
	// generous for a loaded machine, and still far below the cache's TTL backstop (relay.DefaultTTL)
	took := testenv.Eventually(t, 10*time.Second, func() bool {
		return call(t, "POST", b+"/"+pnid+"/messages", ch.ChannelToken, textBody).status == 401
	}, "the deleted channel refused")
	t.Logf("deleted channel refused after %v", took)
}
