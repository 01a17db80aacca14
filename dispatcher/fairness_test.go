package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// hangingListener accepts connections and never answers (nor closes them): a receiver that
// holds every attempt until its timeout, or until gone is called (also at the end of the test),
// which closes the listener and every connection: the attempts held end at once, and new ones
// find nothing listening.
func hangingListener(t *testing.T) (url string, gone func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				_ = c.Close()
			} else {
				conns = append(conns, c)
			}
			mu.Unlock()
		}
	}()
	gone = sync.OnceFunc(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
	})
	t.Cleanup(gone)
	return "http://" + ln.Addr().String() + "/hook", gone
}

// tenant is another org with a connected channel, in e's database.
func (e *env) tenant(name string) (org uuid.UUID, phone string) {
	e.t.Helper()
	o := e.fix.Org(e.t, &testenv.OrgOpts{Name: name})
	conn := e.fix.Connection()
	e.fix.Channel(e.t, o.ID, &testenv.ChannelOpts{Connection: conn})
	return o.ID, conn.PhoneNumberID
}

// handIn stores one event for phone the way wabarelay_inbound does: the deliveries d can start
// at once are created claimed and handed to it (Reserve, StoreEvents, Deliver).
func (e *env) handIn(d *Dispatcher, phone, key string) {
	e.t.Helper()
	items := []store.IncomingItem{{Type: "messages", PhoneNumberID: phone, DedupeKey: key,
		Data: json.RawMessage(fmt.Sprintf(`{"message": {"id": "wamid.%s"}}`, key))}}
	claim := store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: d.Reserve(8)}
	res, err := e.st.StoreEvents(context.Background(), items, claim)
	d.Deliver(claim.Max, res.Claimed, res.Queued > 0)
	if err != nil {
		e.t.Errorf("store events: %v", err)
	}
}

// TestNeverAnsweringTenantDoesNotStarveOthers: org B has 500 webhooks whose receiver accepts
// connections and never answers, and a stream of events; org A's events arrive at about 100/s
// meanwhile. Workers are shared per org first (B can hold at most its per-org share; the claim
// gives A an equal share of what frees up), so A's deliveries go out at once: their p99 stays
// under a second, and no lease expires (B's hanging attempts end at the timeout and are
// recorded under their claims). The property is A's, whatever B's timeout: the timeout here is
// the product's default, longer than the whole stream. B's receiver goes away once the stream
// has ended, so that its attempts end then instead of at their timeout.
func TestNeverAnsweringTenantDoesNotStarveOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("streams for several seconds")
	}
	e := newEnv(t)
	ctx := context.Background()

	var mu sync.Mutex
	arrived := map[string]time.Time{}
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, r *http.Request) {
		var ev struct {
			Data struct {
				Message struct{ ID string } `json:"message"`
			} `json:"data"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			t.Errorf("receiver: decode the event: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		if _, ok := arrived[ev.Data.Message.ID]; !ok {
			arrived[ev.Data.Message.ID] = time.Now()
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}})
	e.webhook(rc.URL)

	orgB, phoneB := e.tenant("b")
	hang, bGone := hangingListener(t)
	for i := range 500 {
		e.fix.Webhook(t, orgB, hang, &testenv.WebhookOpts{Name: fmt.Sprintf("b%d", i)})
	}

	cfg := e.config(rc)
	cfg.Workers, cfg.PerWebhook = 0, 0 // the defaults
	cfg.Timeout, cfg.Lease = 10*time.Second, 30*time.Second
	d, stop := e.launch(e.st.WebhookSecret, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	testenv.Eventually(t, patience, func() bool {
		if n := d.Reserve(1); n > 0 {
			d.Deliver(n, nil, false)
			return true
		}
		return false
	}, "the dispatcher's first claim")

	// B: an event every 500 ms (500 deliveries each: 1,000 a second, always more than B may
	// run) from the start; A: 10 events every 100 ms for 5 s, starting once B's first events
	// hold the workers they can get.
	bDone := make(chan struct{})
	var bWG sync.WaitGroup
	stopB := sync.OnceFunc(func() { close(bDone); bWG.Wait() })
	t.Cleanup(stopB) // (before the pool closes)
	bWG.Add(1)
	go func() {
		defer bWG.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			e.handIn(d, phoneB, fmt.Sprintf("b%d", i))
			select {
			case <-bDone:
				return
			case <-tick.C:
			}
		}
	}()
	testenv.Eventually(t, patience, func() bool { return d.free() < DefaultWorkers-32 }, "B's attempts to hold workers")

	sent := map[string]time.Time{}
	tick := time.NewTicker(100 * time.Millisecond)
	for i := range 50 {
		for k := range 10 {
			key := fmt.Sprintf("a%d-%d", i, k)
			sent[key] = time.Now()
			e.handIn(d, e.phone, key)
		}
		<-tick.C
	}
	tick.Stop()
	// (a deadline for a failing run: the events that have not arrived by then count as late)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(arrived)
		mu.Unlock()
		if n >= len(sent) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopB()
	bGone()

	var lat []time.Duration
	missing := 0
	mu.Lock()
	for key, at := range sent {
		got, ok := arrived["wamid."+key]
		if !ok {
			missing++
			got = deadline
		}
		lat = append(lat, got.Sub(at))
	}
	mu.Unlock()
	if missing > 0 {
		t.Errorf("%d of org A's %d events had not arrived 20s after the stream ended", missing, len(sent))
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("org A: %d events, delivery latency p50 %v, p99 %v, max %v (org B: 500 never-answering webhooks)", len(lat), p50, p99, lat[len(lat)-1])
	if p99 >= time.Second {
		t.Errorf("org A's delivery p99 %v beside a never-answering org B, want under 1s", p99)
	}

	// B's attempts, ended when its receiver went away, are recorded under their own claims: none
	// was lost (its lease expired and the delivery reclaimed) and no lease has expired.
	stop()
	if n, r := d.lostClaims.Load(), d.reclaimed.Load(); n != 0 || r != 0 {
		t.Errorf("%d outcomes of lost claims, %d expired leases reclaimed", n, r)
	}
	var expired int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM delivery_queue WHERE status = 'in_flight' AND locked_until < now()`).Scan(&expired); err != nil {
		t.Fatal(err)
	}
	if expired != 0 {
		t.Errorf("%d deliveries in flight with an expired lease", expired)
	}
}

// TestUnrecordedOutcomesExplained: an outcome that comes back after its claim was lost (the
// lease expired and the delivery was reclaimed) counts as a lost claim; one whose webhook was
// deleted meanwhile does not (the lost-claims count is the signal that leases are too short).
func TestUnrecordedOutcomesExplained(t *testing.T) {
	for _, c := range []struct {
		name string
		lost int64
	}{{"webhook deleted", 0}, {"lease expired", 1}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			clk := e.useClock()
			release := make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					<-release
				}
			}})
			hook, _ := e.webhook(rc.URL)
			core, logs := observer.New(zapcore.DebugLevel)
			cfg := e.config(rc)
			d, _ := e.launch(e.st.WebhookSecret, cfg, zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core())))
			ids := e.events(1)
			testenv.Eventually(t, patience, func() bool { return len(rc.Deliveries()) == 1 }, "the first attempt")
			if c.lost == 0 {
				if err := e.st.DeleteWebhook(context.Background(), e.org, hook); err != nil {
					t.Fatal(err)
				}
				// its queue row goes with the maintenance's sweep (the delete only marks it)
				if _, err := e.st.SweepDeletedWebhooks(context.Background()); err != nil {
					t.Fatal(err)
				}
			} else {
				clk.Advance(cfg.Lease + time.Microsecond) // the first attempt outlives its lease
				testenv.Eventually(t, patience, e.statusIs(ids[0], "delivered"), "the reclaim's delivery")
			}
			free()
			testenv.Eventually(t, patience, func() bool {
				return logs.FilterMessageSnippet("not recorded").Len() > 0
			}, "the outcome's explanation")
			if got := d.lostClaims.Load(); got != c.lost {
				t.Fatalf("lost claims %d, want %d", got, c.lost)
			}
			if got := d.reclaimed.Load(); got != c.lost {
				t.Fatalf("reclaimed %d, want %d", got, c.lost)
			}
		})
	}
}
