package dispatcher

import (
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// caughtUp waits until d's last claim found the queue drained: the claiming loop has claimed
// and is waiting for something to happen.
func caughtUp(t *testing.T, d *Dispatcher) {
	t.Helper()
	testenv.Eventually(t, patience, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.caughtUp
	}, "the dispatcher's claim to drain the queue")
}

// TestClockJumpWakesTheDispatcher: a delivery that falls due because the clock jumps, with no
// notification and the poll an hour away, is claimed and delivered at once: the dispatcher
// decides by its clock and a jump of the clock wakes its claiming loop.
func TestClockJumpWakesTheDispatcher(t *testing.T) {
	e := newEnv(t)
	clk := e.useClock()
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	id := e.events(1)[0]
	e.fix.Exec(t, `UPDATE delivery_queue SET next_attempt_at = $2 WHERE event_id = $1`, id, clk.Now().Add(time.Hour))
	cfg := e.config(rc)
	cfg.PollInterval, cfg.ProbeInterval = time.Hour, 2*time.Hour // (the loop's tickers: an hour away)
	d, _ := e.start(cfg)
	caughtUp(t, d)
	if row := e.delivery(id); row.status != "pending" || row.attempts != 0 {
		t.Fatalf("delivery due in an hour: %+v", row)
	}
	clk.Advance(time.Hour)
	testenv.Eventually(t, patience, e.statusIs(id, "delivered"), "delivered once due")
	if n := testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM delivery_attempts`); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}
