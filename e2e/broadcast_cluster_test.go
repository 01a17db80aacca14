package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
)

// TestBroadcastSurvivesKill: a broadcast of 60 recipients is being sent (the upstream holds
// each send 300 ms, so the instance's four workers all have one in flight) when its Caddy is
// killed with SIGKILL; once the killed claims' lease has passed (aged in the database), another
// Caddy on the same database finishes the broadcast. Nothing is sent twice (each recipient
// reaches the upstream at most once), nothing is lost (every recipient accepted or unknown, and
// unknown only for the killed instance's sends in flight — at most its workers — none of them
// sent again), and the API's counts and recipients match the upstream's record: each accepted
// recipient's wamid is the one the upstream answered its single send with.
func TestBroadcastSurvivesKill(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	front := newSendFront(t, e.fake)
	front.hold.Store(int64(300 * time.Millisecond))
	const workers = 4
	opts := fmt.Sprintf("workers %d", workers)
	origin := e.broadcastCaddy(front.upstream("first"), "", "6000 1m", opts)
	ch := e.channel(true)
	_, key := e.fix.APIKey(t, e.org)
	const n = 60
	tos := phones(1, n)
	b := createBroadcast(t, origin, key, ch.ID.String(), broadcastBody("kill", "hello_world", tos, false, 1200, ""))

	testenv.Eventually(t, 30*time.Second, func() bool { return front.answered() >= 15 && front.inFlight.Load() > 0 },
		"15 sends answered and one in flight")
	e.caddies[origin].Kill()
	killedAt := time.Now()
	// The killed instance's connections are closed: the sends held for it end unanswered.
	testenv.Eventually(t, 30*time.Second, func() bool { return front.inFlight.Load() == 0 }, "the killed instance's sends to end")
	atKill := front.got()
	sendingAtKill := e.countWhere("broadcast_recipients", "status", "sending")
	queuedAtKill := e.countWhere("broadcast_recipients", "status", "queued")
	t.Logf("killed with %d sends made, %d answered, %d recipients sending, %d queued", len(atKill), front.answered(), sendingAtKill, queuedAtKill)
	if sendingAtKill < 1 || sendingAtKill > workers {
		t.Fatalf("%d recipients sending at the kill, want 1 to %d (the workers' claims)", sendingAtKill, workers)
	}
	// The lease of the killed claims passes; the restarted instance finds them expired.
	e.fix.Exec(t, `UPDATE broadcast_recipients SET locked_until = locked_until - interval '1 day' WHERE status = 'sending'`)
	front.hold.Store(int64(20 * time.Millisecond))
	origin = e.broadcastCaddy(front.upstream("second"), "", "6000 1m", opts)
	testenv.Eventually(t, time.Minute, func() bool { return getBroadcast(t, origin, key, b.ID).Status == "completed" }, "the broadcast completed after the restart")

	final := getBroadcast(t, origin, key, b.ID)
	rs, _ := allRecipients(t, origin, key, b.ID, "", 100)
	sends := front.byRecipient()
	c := final.Counts
	t.Logf("counts %+v; %d sends upstream", c, len(front.got()))
	if len(rs) != n || c.Total != n || c.Queued != 0 || c.Failed != 0 || c.Accepted+c.Unknown != n || c.Unknown > workers || c.Unknown != sendingAtKill {
		t.Fatalf("counts %+v over %d recipients, want %d accepted or unknown, unknown the %d sending at the kill", c, len(rs), n, sendingAtKill)
	}
	answeredUnknown, secondSent := 0, 0
	for i, r := range rs {
		if r.To != tos[i] {
			t.Fatalf("recipient %d is %s, want %s", i, r.To, tos[i])
		}
		got := sends[r.To]
		if len(got) > 1 {
			t.Fatalf("%s was sent %d times: %+v", r.To, len(got), got)
		}
		switch r.Status {
		case "accepted":
			if len(got) != 1 || got[0].status != 200 || r.WAMID == nil || got[0].wamid != *r.WAMID || r.Attempts != 1 {
				t.Fatalf("accepted %+v, upstream record %+v: want its one send answered with its wamid", r, got)
			}
			if got[0].instance == "second" {
				secondSent++
			}
		case "unknown":
			// in flight at the kill: sent by the killed instance (or claimed, not yet sent), never again
			if len(got) == 1 && (got[0].instance != "first" || got[0].at.After(killedAt)) {
				t.Fatalf("unknown %s sent by the %s instance at %v (killed at %v)", r.To, got[0].instance, got[0].at, killedAt)
			}
			if len(got) == 1 && got[0].status != 0 {
				answeredUnknown++ // answered, its outcome lost with the instance
			}
		default:
			t.Fatalf("recipient %+v", r)
		}
	}
	for _, s := range atKill {
		if s.status == 0 && !slices.ContainsFunc(rs, func(r recipientJSON) bool { return r.To == s.to && r.Status == "unknown" }) {
			t.Fatalf("the send to %s cut by the kill is not unknown", s.to)
		}
	}
	// The record matches: every answered send is an accepted recipient, or an unknown one
	// whose answer the killed instance did not live to store.
	if a := front.answered(); a != c.Accepted+answeredUnknown {
		t.Fatalf("the upstream answered %d sends; accepted %d + answered-but-unknown %d", a, c.Accepted, answeredUnknown)
	}
	if secondSent != queuedAtKill || len(front.got())-len(atKill) != queuedAtKill {
		t.Fatalf("the restarted instance sent %d (%d accepted), want the %d queued at the kill", len(front.got())-len(atKill), secondSent, queuedAtKill)
	}
}

// TestBroadcastTwoInstancesKeepPace: two Caddy processes on the same Postgres and Redis, each
// with broadcast workers, send one broadcast of 30 recipients at 300 a minute (one send every
// 200 ms) together: both send some, each recipient is sent once, and the pace holds across
// them — no window holds more than one send beyond the pace. Checked twice: on the claims'
// times in the database (one clock: to the microsecond), and on the sends' arrival times at
// the upstream, which add each send's path from its claim (commit, token lookup, the shared
// limit in Redis, the HTTP call) — jitter on a loaded 2-core machine with the race detector,
// allowed up to 150 ms (a burst of a second extra send would arrive a whole interval, 200 ms,
// early).
func TestBroadcastTwoInstancesKeepPace(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	redisURL := testenv.Redis(t)
	front := newSendFront(t, e.fake)
	a := e.broadcastCaddy(front.upstream("a"), redisURL, "6000 1m", "workers 4")
	b := e.broadcastCaddy(front.upstream("b"), redisURL, "6000 1m", "workers 4")
	ch := e.channel(true)
	_, key := e.fix.APIKey(t, e.org)
	const n, rate = 30, 300
	const interval = time.Minute / rate
	tos := phones(1, n)
	bc := createBroadcast(t, a, key, ch.ID.String(), broadcastBody("pace", "hello_world", tos, false, rate, ""))
	testenv.Eventually(t, time.Minute, func() bool { return getBroadcast(t, b, key, bc.ID).Status == "completed" }, "the broadcast completed")
	if c := getBroadcast(t, a, key, bc.ID).Counts; c.Accepted != n || c.Total != n {
		t.Fatalf("counts %+v, want %d accepted", c, n)
	}

	sends := front.got()
	per := map[string]int{}
	for to, ss := range front.byRecipient() {
		if len(ss) != 1 {
			t.Fatalf("%s sent %d times", to, len(ss))
		}
	}
	for _, s := range sends {
		per[s.instance]++
	}
	t.Logf("sends per instance: %v", per)
	if len(sends) != n || per["a"] == 0 || per["b"] == 0 {
		t.Fatalf("%d sends, by instance %v: want %d, both instances sending", len(sends), per, n)
	}

	// The claims: first_attempt_at is the claim's transaction time.
	var claims []time.Time
	rows, err := e.pool.Query(t.Context(), `SELECT first_attempt_at FROM broadcast_recipients WHERE broadcast_id = $1 ORDER BY first_attempt_at`, bc.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		claims = append(claims, at)
	}
	if rows.Err() != nil || len(claims) != n {
		t.Fatalf("%d claims (%v)", len(claims), rows.Err())
	}
	arrivals := make([]time.Time, len(sends))
	for i, s := range sends {
		arrivals[i] = s.at
	}
	slices.SortFunc(arrivals, func(x, y time.Time) int { return x.Compare(y) })
	checkPace(t, "claims", claims, interval, time.Millisecond)
	checkPace(t, "arrivals", arrivals, interval, 150*time.Millisecond)
	t.Logf("claims over %v, arrivals over %v (pace: %v)", claims[n-1].Sub(claims[0]), arrivals[n-1].Sub(arrivals[0]), time.Duration(n-1)*interval)
}

// checkPace fails the test when any window of the sorted times ts holds more than one send
// beyond the pace: for every i > j, ts[i] − ts[j] ≥ (i − j − 1) × interval − tolerance.
func checkPace(t *testing.T, what string, ts []time.Time, interval, tolerance time.Duration) {
	t.Helper()
	for j := range ts {
		for i := j + 1; i < len(ts); i++ {
			if min := time.Duration(i-j-1)*interval - tolerance; ts[i].Sub(ts[j]) < min {
				t.Fatalf("%s: %d sends within %v (from send %d to %d), pace allows at most %d (+1)", what, i-j+1, ts[i].Sub(ts[j]), j, i,
					int(ts[i].Sub(ts[j])/interval)+1)
			}
		}
	}
}
