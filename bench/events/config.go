package main

import (
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/store"
)

const (
	wabaID      = "102290129340398"
	appSecret   = "bench-app-secret-0123456789"
	verifyToken = "bench-verify-token"
	inboundPath = "/webhooks/upstream"
)

type config struct {
	pgDSN         string
	caddyBin      string
	rates         []int
	channels      int
	perPost       int
	duration      time.Duration
	drain         time.Duration
	maxInflight   int
	poolMaxConns  int
	workers       int
	perWebhook    int
	webhooks      int
	receiverH2    bool
	showLogs      bool
	historyDays   int
	overload      int           // R of the overload step (2R offered); 0: no overload step
	overloadDur   time.Duration // the overload step's offered-load time
	fairness      int           // R of the fairness step; 0: no fairness step
	held          int           // held deliveries of the fairness step's paused webhook
	ordering      string        // "conversation": the ordering step (none, then conversation, at -rate's first rate); "": off
	conversations int           // customers (wa_ids) the messages are spread over, one conversation each per channel
	pgstat        int           // statements per step read from pg_stat_statements (-pgstat); 0: off
}

// deliveryTimeout is the delivery timeout the bench configures (the product's default); the
// fairness step's slow receiver answers a second after it.
const deliveryTimeout = 10 * time.Second

// parseFlags reads the flags and exits on a bad combination.
func parseFlags() config {
	var c config
	var rates string
	flag.StringVar(&c.pgDSN, "pg", benchkit.DefaultPG,
		"Postgres admin DSN (URL form); the run creates and drops its own database there")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (go build -o bin/caddy ./cmd/caddy)")
	flag.StringVar(&rates, "rate", "1000", "offered events/s; a comma-separated list runs one step per rate, in order (0: no such step, e.g. only -overload or -fairness)")
	flag.IntVar(&c.channels, "channels", 100, "active channels (phone number ids) the posts are spread over")
	flag.IntVar(&c.perPost, "per-post", 10, "messages (events) per upstream post")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "offered-load time per step (at most 30s)")
	flag.DurationVar(&c.drain, "drain", 60*time.Second, "longest wait for the backlog to drain after each step")
	flag.IntVar(&c.maxInflight, "max-inflight", 2000, "most posts outstanding at once; a post finding none free is skipped (counted)")
	flag.IntVar(&c.poolMaxConns, "pool-max-conns", 0, "pool_max_conns added to Caddy's database DSN (0: the pgxpool default, max(4, CPUs))")
	flag.IntVar(&c.workers, "workers", 0, "delivery workers (0: not set, the product's default)")
	flag.IntVar(&c.perWebhook, "per-webhook", 0, "delivery per_webhook cap (0: not set, the product's default)")
	flag.IntVar(&c.webhooks, "webhooks", 1, "org-scoped webhooks (each on its own receiver path); every event fans out into this many deliveries (at most 64)")
	flag.BoolVar(&c.receiverH2, "receiver-h2", false, "the receiver offers HTTP/2 (default HTTP/1.1)")
	flag.BoolVar(&c.showLogs, "v", false, "print Caddy's log at the end")
	flag.IntVar(&c.pgstat, "pgstat", 0, "report the bench database's N costliest statements of each step's offered load, per offered event, "+
		"from pg_stat_statements (the server must load it: shared_preload_libraries; the extension is created in the bench database); 0: off")
	flag.IntVar(&c.historyDays, "history-days", 30, "daily history partitions created back from today before the run (0: only the migration's), as a database in use for that long has them (the default retention is 30 days)")
	flag.IntVar(&c.overload, "overload", 0, "overload step after the others: offer 2 × this many events/s, then drain (0: off)")
	flag.DurationVar(&c.overloadDur, "overload-duration", 30*time.Second, "offered-load time of the overload step (at most 60s)")
	flag.IntVar(&c.fairness, "fairness", 0, "fairness step, last: this many events/s without, then with a slow webhook and a paused one holding -held deliveries (0: off)")
	flag.IntVar(&c.held, "held", 50000, "held deliveries the fairness step's paused webhook holds")
	flag.StringVar(&c.ordering, "ordering", "", `"conversation": after the -rate steps, the ordering step: -rate's first rate with the webhooks' ordering none, then conversation (ratio reported); "" or "none": off`)
	flag.IntVar(&c.conversations, "conversations", 1000, "customers (wa_ids) the messages are spread over, in turn")
	flag.Parse()
	if flag.NArg() > 0 {
		benchkit.Fatalf("unexpected arguments: %v", flag.Args())
	}
	if strings.TrimSpace(rates) != "0" {
		for _, s := range strings.Split(rates, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(s, "_", "")))
			if err != nil || r <= 0 {
				benchkit.Fatalf("-rate: invalid rate %q", s)
			}
			c.rates = append(c.rates, r)
		}
	}
	if len(c.rates) == 0 && c.overload == 0 && c.fairness == 0 {
		benchkit.Fatalf("-rate 0 runs no step: add -overload or -fairness")
	}
	if c.channels < 1 || c.perPost < 1 || c.maxInflight < 1 || c.poolMaxConns < 0 {
		benchkit.Fatalf("-channels, -per-post and -max-inflight must be positive")
	}
	if c.workers < 0 || c.perWebhook < 0 {
		benchkit.Fatalf("-workers and -per-webhook must be positive, or 0 for the product's default")
	}
	if c.overload < 0 || c.fairness < 0 || c.held < 1 {
		benchkit.Fatalf("-overload and -fairness must be 0 (off) or positive, -held positive")
	}
	if c.overloadDur <= 0 || c.overloadDur > 60*time.Second {
		benchkit.Fatalf("-overload-duration must be in (0, 60s]")
	}
	if c.ordering == store.OrderingNone {
		c.ordering = ""
	}
	if (c.ordering != "" && c.ordering != store.OrderingConversation) || c.conversations < 1 {
		benchkit.Fatalf("-ordering must be conversation, none or empty, -conversations positive")
	}
	if c.ordering != "" && len(c.rates) == 0 {
		benchkit.Fatalf("-ordering needs a -rate")
	}
	if c.webhooks < 1 || c.webhooks > 64 {
		benchkit.Fatalf("-webhooks must be in [1, 64]")
	}
	if c.duration <= 0 || c.duration > 30*time.Second || c.drain <= 0 || c.drain > 5*time.Minute {
		benchkit.Fatalf("-duration must be in (0, 30s] and -drain in (0, 5m]")
	}

	return c
}

// caddyfile is the Caddy configuration under test: wabarelay_inbound on port, delivery to the
// receiver whose CA is at caPath. workers and per_webhook are written only when set
// (-workers, -per-webhook); otherwise the product's defaults apply.
func caddyfile(c config, port int, caPath string) string {
	var tuning string
	if c.workers > 0 {
		tuning += fmt.Sprintf("\n\tworkers      %d", c.workers)
	}
	if c.perWebhook > 0 {
		tuning += fmt.Sprintf("\n\tper_webhook  %d", c.perWebhook)
	}
	return benchkit.Caddyfile("", fmt.Sprintf(`meta {
	app_secret   %s
	verify_token %s
}
delivery {
	retry_delays 1s 2s 5s
	timeout      %s
	lease        60s%s
	root_ca      %s
	allow_private_targets
}`, appSecret, verifyToken, deliveryTimeout, tuning, caPath), inboundSite(port))
}

// inboundSite is the site under test: wabarelay_inbound at inboundPath.
func inboundSite(port int) string {
	return fmt.Sprintf("http://127.0.0.1:%d {\n\thandle %s {\n\t\twabarelay_inbound\n\t}\n}\n", port, inboundPath)
}

// caddyDSN is the database DSN Caddy gets: dsn with -pool-max-conns, when set.
func caddyDSN(c config, dsn string) string {
	if c.poolMaxConns <= 0 {
		return dsn
	}
	if !strings.HasPrefix(dsn, "postgres") {
		return dsn + " pool_max_conns=" + strconv.Itoa(c.poolMaxConns)
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "pool_max_conns=" + strconv.Itoa(c.poolMaxConns)
}

// deliveryDesc says which delivery settings Caddy ran with.
func deliveryDesc(c config) string {
	set := func(name string, n int) string {
		if n == 0 {
			return name + " product default"
		}
		return fmt.Sprintf("%s %d (set by -%s)", name, n, strings.ReplaceAll(name, "_", "-"))
	}
	var s string
	if c.workers == 0 && c.perWebhook == 0 {
		s = "product defaults (workers, per_webhook not set)"
	} else {
		s = set("workers", c.workers) + ", " + set("per_webhook", c.perWebhook)
	}
	return s + "; retry_delays 1s 2s 5s, timeout " + deliveryTimeout.String() + ", lease 60s"
}

func poolDesc(n int) string {
	if n == 0 {
		return fmt.Sprintf("pgxpool default (%d conns)", max(4, runtime.NumCPU()))
	}
	return strconv.Itoa(n) + " conns"
}
