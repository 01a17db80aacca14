// Command floor measures, on this machine, what the least an event can cost is when it is
// stored durably and delivered by one signed HTTPS POST — without wabarelay: a plain Go HTTP
// client posting to a receiver, and plain batched INSERTs into a durable table. It puts the
// CPU-per-event row of bench/events (issue 35) into proportion: the product does this and more
// (duplicates, the queue, the delivery log, outcomes, windows) for every event.
//
//	go run ./bench/floor [-rate 2000] [-per-post 10] [-duration 10s]
//
// Two phases, each open-loop at -rate events/s in posts of -per-post events (as bench/events
// offers them):
//
//   - http: every post's events are POSTed at once, one request each, by a Go client (keep-alive
//     HTTP/1.1 over TLS, an HMAC-SHA256 signature header per request, as the dispatcher sends)
//     to a receiver in a process of its own answering 204. CPU of this process per event.
//   - pg: every post is one transaction inserting its events (id, 600-byte payload) into a
//     table with a primary key, committed synchronously (the server's settings: fsync and
//     synchronous_commit as they are). CPU of this process and of the database's backends per
//     event.
//
// The receiver is this program run again (-receive); the database is created and dropped on
// the Postgres of -pg.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

func main() {
	pgDSN := flag.String("pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "admin DSN of the Postgres to create the bench database on")
	rate := flag.Int("rate", 2000, "events per second offered")
	perPost := flag.Int("per-post", 10, "events per post (one transaction, one burst of requests)")
	duration := flag.Duration("duration", 10*time.Second, "length of each phase")
	receive := flag.String("receive", "", "internal: run as the receiver, listening on this address")
	flag.Parse()
	if *receive != "" {
		serveReceiver(*receive)
		return
	}
	ctx := benchkit.SignalContext()
	var cl benchkit.Cleanups
	defer cl.Run()
	benchkit.Exit(ctx, run(ctx, &cl, *pgDSN, *rate, *perPost, *duration))
}

// serveReceiver answers every POST 204 over TLS (a self-signed certificate) on addr.
func serveReceiver(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		benchkit.Fatalf("receiver: %v", err)
	}
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})}}
	srv.StartTLS()
	select {}
}

func run(ctx context.Context, cl *benchkit.Cleanups, adminDSN string, rate, perPost int, duration time.Duration) error {
	if rate <= 0 || perPost <= 0 || rate%perPost != 0 {
		return fmt.Errorf("-rate must be a positive multiple of -per-post")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", benchkit.FreePort())
	dir, err := benchkit.TempDir(cl, "wabarelay-floor-")
	if err != nil {
		return err
	}
	rcv, err := benchkit.StartSelf("receiver", dir+"/receiver.log", nil, "-receive", addr)
	if err != nil {
		return err
	}
	cl.Add(rcv.Stop)
	if err := benchkit.WaitPort(ctx, addr, 10*time.Second, rcv); err != nil {
		return err
	}
	db := "wabarelay_floor_" + benchkit.RandHex(4)
	dsn, err := benchkit.NewDatabase(ctx, adminDSN, db, cl)
	if err != nil {
		return err
	}
	pool, err := benchkit.Pool(ctx, dsn, cl)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE floor_events (id uuid PRIMARY KEY, payload bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	settings := benchkit.Settings(ctx, dsn, "fsync", "synchronous_commit")

	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, // the receiver's self-signed certificate, on loopback
		MaxIdleConnsPerHost: 64,
		DisableCompression:  true,
	}, Timeout: 10 * time.Second}
	payload := make([]byte, 600)
	_, _ = rand.Read(payload)
	body := []byte(`{"type":"messages","data":"` + base64.StdEncoding.EncodeToString(payload)[:560] + `"}`)
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	var failed atomic.Int64
	post := func() {
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/hook", bytes.NewReader(body))
		id := uuid.NewString()
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(body)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Webhook-Id", id)
		req.Header.Set("Webhook-Timestamp", ts)
		req.Header.Set("Webhook-Signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		resp, err := client.Do(req)
		if err != nil {
			failed.Add(1)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			failed.Add(1)
		}
	}
	insert := func() {
		ids := make([]uuid.UUID, perPost)
		payloads := make([][]byte, perPost)
		for i := range ids {
			ids[i], payloads[i] = uuid.New(), payload
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO floor_events (id, payload) SELECT * FROM unnest($1::uuid[], $2::bytea[])`, ids, payloads)
			return err
		})
		if err != nil {
			failed.Add(int64(perPost))
		}
	}
	// warm: connections open, statements prepared
	paced(ctx, 200, perPost, time.Second, func() { fanOut(perPost, post) })
	paced(ctx, 200, perPost, time.Second, insert)

	self := os.Getpid()
	events := float64(rate) * duration.Seconds()
	c0 := benchkit.ThreadCPU(self)
	sentHTTP := paced(ctx, rate, perPost, duration, func() { fanOut(perPost, post) })
	httpCPU := benchkit.ThreadCPU(self) - c0

	c0 = benchkit.ThreadCPU(self)
	pg0, _ := benchkit.PostgresCPU(db)
	sentPG := paced(ctx, rate, perPost, duration, insert)
	pgGo := benchkit.ThreadCPU(self) - c0
	pg1, _ := benchkit.PostgresCPU(db)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d requests or inserts failed", n)
	}
	us := func(d time.Duration, n float64) float64 { return float64(d.Microseconds()) / n }
	fmt.Printf("\n## Floor: one HTTPS POST and a share of one batched durable INSERT per event\n\n")
	fmt.Printf("%s; Postgres fsync %s, synchronous_commit %s; %d events/s in posts of %d, %s per phase.\n\n",
		benchkit.Machine(benchkit.LoadAvg()), settings[0], settings[1], rate, perPost, duration)
	fmt.Printf("| phase | events | CPU µs per event |\n|:--|--:|--:|\n")
	fmt.Printf("| http: Go client (this process) | %d | %.0f |\n", sentHTTP, us(httpCPU, events))
	fmt.Printf("| pg: Go client (this process) | %d | %.0f |\n", sentPG, us(pgGo, events))
	fmt.Printf("| pg: Postgres backends | %d | %.0f |\n", sentPG, us(pg1-pg0, events))
	fmt.Printf("| **together** | | **%.0f** |\n", us(httpCPU+pgGo+pg1-pg0, events))
	fmt.Printf("\nFLOOR_US %.0f\n", us(httpCPU+pgGo+pg1-pg0, events))
	return nil
}

// paced calls f once per post, posts at rate/perPost a second, for d (each call in a goroutine
// of its own, as posts arrive independently), waits for the calls and returns the events sent.
func paced(ctx context.Context, rate, perPost int, d time.Duration, f func()) int {
	interval := time.Second * time.Duration(perPost) / time.Duration(rate)
	t := time.NewTicker(interval)
	defer t.Stop()
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	posts := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		<-t.C
		posts++
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	wg.Wait()
	return posts * perPost
}

// fanOut runs f n times at once and waits for them.
func fanOut(n int, f func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	wg.Wait()
}
