package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/wabarelay/wabarelay/store"
)

// hangingListener accepts connections and never answers (nor closes them): a receiver that
// holds every attempt until its timeout.
func hangingListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String() + "/hook"
}

// tenant is a second org with a connected channel, in e's database.
func (e *env) tenant(name string) (org uuid.UUID, phone string) {
	e.t.Helper()
	ctx := context.Background()
	o, err := e.st.CreateOrg(ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	ch, err := e.st.CreateChannel(ctx, o.ID, "c", time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	phone = "1666" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
	if err := e.st.ConnectChannel(ctx, ch.ID, store.Connection{PhoneNumberID: phone, WabaID: "waba" + phone, UpstreamToken: "tok"}); err != nil {
		e.t.Fatal(err)
	}
	return o.ID, phone
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
// the product's default, longer than the whole stream.
func TestNeverAnsweringTenantDoesNotStarveOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("streams for several seconds")
	}
	e := newEnv(t)
	ctx := context.Background()

	var mu sync.Mutex
	arrived := map[string]time.Time{}
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		var ev struct {
			Data struct {
				Message struct{ ID string } `json:"message"`
			} `json:"data"`
		}
		json.NewDecoder(r.Body).Decode(&ev)
		mu.Lock()
		if _, ok := arrived[ev.Data.Message.ID]; !ok {
			arrived[ev.Data.Message.ID] = time.Now()
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	e.webhook(rc.URL)

	orgB, phoneB := e.tenant("b")
	hang := hangingListener(t)
	for i := range 500 {
		if _, _, err := e.st.CreateWebhook(ctx, orgB, store.NewWebhook{Name: fmt.Sprintf("b%d", i), URL: hang, Events: []string{"messages"}}); err != nil {
			t.Fatal(err)
		}
	}

	cfg := e.config(rc)
	cfg.Workers, cfg.PerWebhook = 0, 0 // the defaults
	cfg.Timeout, cfg.Lease = 10*time.Second, 30*time.Second
	d, err := New(e.pool, e.st.WebhookSecret, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(runCtx, e.dsn) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	waitFor(t, "the dispatcher's first claim", patience, func() bool {
		if n := d.Reserve(1); n > 0 {
			d.Deliver(n, nil, false)
			return true
		}
		return false
	})

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
	waitFor(t, "B's attempts to hold workers", patience, func() bool { return d.free() < DefaultWorkers-32 })

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

	// B's attempts end at their timeout and are recorded under their own claims: none was lost
	// (its lease expired and the delivery reclaimed) and no lease has expired.
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
			release := make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					<-release // the first attempt waits; any other answers at once
				}
			})
			hook, _ := e.webhook(rc.URL)
			core, logs := observer.New(zapcore.DebugLevel)
			cfg := e.config(rc)
			d, err := New(e.pool, e.st.WebhookSecret, cfg, zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core())))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); d.Run(ctx, e.dsn) }()
			t.Cleanup(func() { cancel(); <-done })
			ids := e.events(1)
			waitFor(t, "the first attempt", patience, func() bool { return len(rc.Deliveries()) == 1 })
			if c.lost == 0 {
				if err := e.st.DeleteWebhook(context.Background(), e.org, hook); err != nil {
					t.Fatal(err)
				}
			} else {
				e.expireLease(ids[0])
				waitFor(t, "the reclaim's delivery", patience, e.statusIs(ids[0], "delivered"))
			}
			free()
			waitFor(t, "the outcome's explanation", patience, func() bool {
				return logs.FilterMessageSnippet("not recorded").Len() > 0
			})
			if got := d.lostClaims.Load(); got != c.lost {
				t.Fatalf("lost claims %d, want %d", got, c.lost)
			}
			if got := d.reclaimed.Load(); got != c.lost {
				t.Fatalf("reclaimed %d, want %d", got, c.lost)
			}
		})
	}
}
