// Package dispatcher delivers events to customers' webhooks.
//
// The queue is the store's (store.Queue: table delivery_queue; this package runs no SQL). A
// Dispatcher claims due deliveries, fairly across orgs and then their webhooks, under a lease
// longer than the attempt timeout, POSTs each event with its signatures, and records the
// outcomes in fenced, batched statements. An attempt is counted when its outcome is recorded: a lease
// that expires unrecorded (a crashed or stuck instance) is reclaimed under the same attempt
// number, so a delivery gets exactly len(RetryDelays)+1 recorded attempts, numbered from 1.
// It wakes on LISTEN wabarelay_deliveries and polls as a backstop. Any number of instances may
// share a database; an instance that dies leaves in_flight rows that are reclaimed once their
// lease has passed (delivery is at least once).
package dispatcher

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"code.dny.dev/ssrf"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/store"
	"github.com/wabarelay/wabarelay/traces"
)

// NotifyChannel is the Postgres channel that announces new due deliveries; the store, which
// inserts them, owns its name.
const NotifyChannel = store.DeliveriesNotifyChannel

// Default concurrency. One webhook's deliveries reach about per_webhook ÷ (the receiver's
// answer time) per second and instance: 64 is what one busy webhook needs of a fast receiver,
// 256 workers keep four such webhooks busy at once, and a webhook whose receiver hangs ties up
// at most a quarter of them ([figures]).
//
// [figures]: https://github.com/wabarelay/wabarelay/blob/main/bench/README.md#figures-behind-the-defaults-inbound-delivery
const (
	DefaultWorkers    = 256
	DefaultPerWebhook = 64
)

// DefaultTimeout is an attempt's timeout and DefaultLease a claim's lease when Config leaves
// them zero; a lease must exceed the timeout.
const (
	DefaultTimeout = 10 * time.Second
	DefaultLease   = 60 * time.Second
)

// DefaultUserAgent is sent when Config.UserAgent is empty.
const DefaultUserAgent = "wabarelay/1 (+https://github.com/wabarelay/wabarelay)"

// ResponseBodyLimit is how much of a receiver's response body is kept in the attempt log.
const ResponseBodyLimit = 4 << 10

// Outcomes reported to Observer.Attempt.
const (
	OutcomeDelivered = "delivered" // 2xx within the timeout
	OutcomeRetrying  = "retrying"  // failed; another attempt is scheduled
	OutcomeFailed    = "failed"    // failed; no attempts left, the delivery is failed
)

// Observer receives one call per finished HTTP attempt (for metrics). It must be safe for
// concurrent use and must not block.
type Observer interface {
	Attempt(outcome string, d time.Duration)
}

// Config tunes a Dispatcher. Zero values take the documented defaults.
type Config struct {
	// RetryDelays are the delays after failed attempts 1..n, counted from the end of the failed
	// attempt; a delivery gets len(RetryDelays)+1 attempts. Default 30s, 2m, 10m.
	RetryDelays []time.Duration
	// Timeout bounds one attempt; success is a 2xx status within it. Default DefaultTimeout.
	Timeout time.Duration
	// Lease is how long a claim holds a delivery; it must exceed Timeout. Default DefaultLease.
	Lease time.Duration
	// Workers is the number of concurrent attempts per instance. Default DefaultWorkers.
	Workers int
	// PerWebhook caps concurrent attempts to one webhook per instance (connections to one
	// receiver). Default DefaultPerWebhook.
	PerWebhook int
	// PerOrg caps concurrent attempts to all the webhooks of one org per instance. Default: half
	// of Workers (128 of the default 256), at least 1. Claims share the free workers equally
	// among the orgs with due work whatever their number of webhooks, but slots held by a
	// receiver that never answers stay held until Timeout: the cap keeps one tenant (any number
	// of never-answering webhooks) from holding more than half of the workers, so the other
	// tenants' deliveries always find free ones. Half, not less: one org may need two webhooks
	// at their full PerWebhook (or one slow webhook at its cap beside a busy one, see
	// bench/events -fairness) at the default sizes, and most deployments serve few orgs. Each
	// further never-answering tenant takes at most its equal share of what is left.
	PerOrg int
	// HandOffWaitPerWebhook is how many of one webhook's handed-off deliveries (Deliver) may wait
	// in memory for a slot when the webhook or its org is at its cap, and HandOffWait how many of
	// all webhooks' may; beyond either, a delivery goes back to the queue as before. Defaults:
	// PerWebhook (64: one more round of the receiver's connections, ready the moment one frees,
	// without a hand-back and a claim) and Workers (256: one more round of every worker, so the
	// payloads held beside the attempts' own at most double them). A waiting delivery stays
	// claimed in the queue under its hand-off's lease, so a crash loses none (the lease brings it
	// back); it is handed back if no slot frees within a quarter of what the lease leaves beyond
	// Timeout (maxHandOffWait). Issue 35, decision 3.
	HandOffWaitPerWebhook int
	HandOffWait           int
	// PollInterval is the backstop poll when no notification arrives. Default 1s.
	PollInterval time.Duration
	// BatchSize is the most rows one claim takes. Default 100.
	BatchSize int
	// AllowPrivateTargets allows private, loopback, link-local and other special-purpose
	// addresses; otherwise they are refused at dial time (code.dny.dev/ssrf).
	AllowPrivateTargets bool
	// RootCAs are trusted in addition to the system pool.
	RootCAs *x509.CertPool
	// InstanceID identifies this instance in deliveries.locked_by. Default host name + random.
	InstanceID string
	// UserAgent is sent with every attempt. Default DefaultUserAgent.
	UserAgent string
	// Observer, if set, is told about every attempt (and, if it is a HealthObserver, about
	// every change of a webhook's health).
	Observer Observer
	// PreviousSecrets, if set, gives a webhook's previous secret during a secret rotation's
	// grace: every attempt is then signed with the current secret and, until the grace ends,
	// the previous one too. Nil: the current secret only.
	PreviousSecrets PreviousSecrets

	// FailureThreshold is the number of consecutive failed attempts, across a webhook's
	// deliveries, that makes the webhook failing: its deliveries are then held and one probe
	// goes out per probe interval (see health.go). Default DefaultFailureThreshold.
	FailureThreshold int
	// ProbeInterval is the gap before a failing webhook's first probe; each failed probe doubles
	// it, up to ProbeIntervalMax. Defaults DefaultProbeInterval and DefaultProbeIntervalMax.
	ProbeInterval, ProbeIntervalMax time.Duration
	// DisableAfter is how long a webhook may stay failing before it is paused (paused_reason
	// "failing"). Default DefaultDisableAfter.
	DisableAfter time.Duration

	// Traces, if set, holds the TracerProvider the spans of traced attempts go to (Caddy's,
	// remembered by the inbound handler from a traced post). An attempt of an event stored
	// with a traceparent carries a traceparent header, and with a provider remembered a
	// "wabarelay.delivery.claim" and a "wabarelay.delivery.attempt" span continue the event's
	// trace. Default (nil): no spans; the header carries the event's own traceparent.
	Traces *traces.Provider

	// Clock is the time the dispatcher and its queue decide by: when deliveries, retries and
	// probes fall due, when leases end, how long a webhook is held here, until when a secret
	// rotation's previous secret signs and how long a secret is cached (see package clock).
	// Default (nil): the real time, the database's own in the queue's statements. A clock that
	// tells when it jumps (clock.Notifier: a test's clock.Stub) wakes the claiming loop, since a
	// jump may make deliveries due. Attempts and their timeouts, the signatures' timestamps and
	// the loop's own pacing (polls, batching, backoff after errors) keep the real time.
	Clock clock.Clock

	// secretRetry is how long a delivery whose secret could not be read waits (tests).
	secretRetry time.Duration
}

// Secrets returns the signing secret ("whsec_…") of a webhook (store.Store.WebhookSecret). An
// error that no retry can cure wraps ErrSecretUnusable or secretbox.ErrOpen (a stored secret
// that no encryption key opens).
type Secrets func(ctx context.Context, webhookID uuid.UUID) (string, error)

// PreviousSecrets returns the secret a webhook's last rotation replaced and when it stops
// signing, or "" when there is none (store.Store.PreviousWebhookSecret). An error that no
// retry can cure wraps ErrSecretUnusable or secretbox.ErrOpen, as with Secrets.
type PreviousSecrets func(ctx context.Context, webhookID uuid.UUID) (secret string, until time.Time, err error)

// Dispatcher claims and delivers due deliveries. Create it with New and start it with Run.
type Dispatcher struct {
	queue   *store.Queue
	current Secrets // the current signing secret of a webhook
	cfg     Config
	log     *zap.Logger
	client  *http.Client

	failures *failureLog // failed attempts, for the operator

	wake     chan struct{} // new work may be due (notification, own retry timer)
	slotFree chan struct{} // a saturated worker pool or webhook has a free slot again
	results  chan result   // finished attempts and releases for the completion writer

	mu         sync.Mutex
	active     int               // attempts running or reserved (Reserve) on this instance
	running    bool              // Run is claiming: Reserve may hand out slots
	caughtUp   bool              // the last claim drained the queue (store.Claimed.Drained)
	attemptCtx context.Context   // the context of attempts, set by Run
	perHook    map[uuid.UUID]int // attempts running per webhook
	perOrg     map[uuid.UUID]int // attempts running per org
	// waiting holds the handed-off deliveries over their webhook's or org's cap, by webhook,
	// oldest first (Config.HandOffWait); waitingN counts them all. Each is still claimed in the
	// queue for this instance.
	waiting  map[uuid.UUID][]job
	waitingN int

	secretTTL time.Duration
	cache     map[uuid.UUID]cachedSecret
	// secretFails counts, per delivery, the attempts that found the webhook's secret unusable
	// (see maxSecretFailures).
	secretFails map[uuid.UUID]int

	cursors map[uuid.UUID]uuid.UUID // round-robin cursors of the claims, per org (store.QueueClaim.After)
	// nextProbeCheck is when the claiming loop looks for due probes next (claimProbes).
	nextProbeCheck time.Time
	// localFails counts each webhook's failed attempts in a row on this instance; holdUntil
	// holds a webhook that reached FailureThreshold here until its health is recorded (health.go).
	localFails map[uuid.UUID]int
	holdUntil  map[uuid.UUID]time.Time

	// lostClaims counts attempts whose outcome could not be recorded because their claim was
	// lost (the lease expired and the delivery was reclaimed, or the delivery was deleted);
	// reclaimed counts the deliveries this instance claimed because their lease had expired.
	lostClaims, reclaimed atomic.Int64

	attempts sync.WaitGroup
}

type cachedSecret struct {
	secret  string
	expires time.Time
	// rotated is the claim's PreviousSecretExpiresAt when the entry was read: a job whose
	// differs (a rotation since) reads the secrets again.
	rotated *time.Time
	// previous signs beside secret until previousUntil (a rotation's grace); "" when none.
	previous      string
	previousUntil time.Time
}

// signingSecrets returns the secrets to sign with at now: the current one, then the previous
// one while its grace lasts.
func (c cachedSecret) signingSecrets(now time.Time) []string {
	if c.previous != "" && now.Before(c.previousUntil) {
		return []string{c.secret, c.previous}
	}
	return []string{c.secret}
}

// sameTime reports whether a and b are both nil or the same instant.
func sameTime(a, b *time.Time) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Equal(*b)
}

// Validate reports the first problem New would find in cfg, its defaults applied (among them
// the lease rule: a lease must exceed the attempt timeout). The Caddy app calls it so that
// `caddy validate` fails as `caddy run` would.
func (cfg Config) Validate() error {
	_, err := cfg.withDefaults()
	return err
}

// withDefaults returns cfg with its defaults filled in, or the first problem.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.RetryDelays == nil {
		cfg.RetryDelays = []time.Duration{30 * time.Second, 2 * time.Minute, 10 * time.Minute}
	}
	for _, d := range cfg.RetryDelays {
		if d < 0 {
			return cfg, fmt.Errorf("dispatcher: negative retry delay %v", d)
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease <= cfg.Timeout {
		return cfg, fmt.Errorf("dispatcher: lease %v must exceed the attempt timeout %v", cfg.Lease, cfg.Timeout)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.PerWebhook <= 0 {
		cfg.PerWebhook = DefaultPerWebhook
	}
	if cfg.PerOrg <= 0 {
		cfg.PerOrg = max(cfg.Workers/2, 1)
	}
	if cfg.HandOffWaitPerWebhook <= 0 {
		cfg.HandOffWaitPerWebhook = cfg.PerWebhook
	}
	if cfg.HandOffWait <= 0 {
		cfg.HandOffWait = cfg.Workers
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.secretRetry <= 0 {
		cfg.secretRetry = 5 * time.Second
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if err := cfg.healthDefaults(); err != nil {
		return cfg, err
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = DefaultUserAgent
	}
	if cfg.InstanceID == "" {
		host, _ := os.Hostname()
		cfg.InstanceID = host + "-" + uuid.NewString()[:8]
	}
	return cfg, nil
}

// New checks cfg, fills in defaults and returns a Dispatcher.
func New(pool *pgxpool.Pool, secrets Secrets, cfg Config, logger *zap.Logger) (*Dispatcher, error) {
	if pool == nil || secrets == nil {
		return nil, errors.New("dispatcher: pool and secrets are required")
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		queue:     store.NewQueue(pool).WithClock(cfg.Clock),
		current:   secrets,
		cfg:       cfg,
		log:       logger,
		client:    newClient(cfg),
		failures:  &failureLog{log: logger},
		wake:      make(chan struct{}, 1),
		slotFree:  make(chan struct{}, 1),
		results:   make(chan result, cfg.Workers+cfg.BatchSize),
		perHook:   map[uuid.UUID]int{},
		perOrg:    map[uuid.UUID]int{},
		waiting:   map[uuid.UUID][]job{},
		cursors:   map[uuid.UUID]uuid.UUID{},
		secretTTL: time.Minute,
		cache:     map[uuid.UUID]cachedSecret{},

		secretFails: map[uuid.UUID]int{},
		localFails:  map[uuid.UUID]int{},
		holdUntil:   map[uuid.UUID]time.Time{},
	}
	if n, ok := cfg.Clock.(clock.Notifier); ok {
		n.OnChange(func() { signal(d.wake) })
	}
	return d, nil
}

// now returns the time the dispatcher decides by (Config.Clock).
func (d *Dispatcher) now() time.Time { return clock.Now(d.cfg.Clock) }

// InstanceID returns the id this dispatcher writes to deliveries.locked_by.
func (d *Dispatcher) InstanceID() string { return d.cfg.InstanceID }

// Lease returns how long a claim holds a delivery.
func (d *Dispatcher) Lease() time.Duration { return d.cfg.Lease }

// Job is a delivery that the inbound handler of this instance inserted already claimed for it
// (status in_flight, attempts 0 — no attempt recorded yet —, claim_seq 0, locked_by
// InstanceID, locked_until now + Lease), to be started by Deliver without a claim query. Its
// attempt is attempt 1, fenced on claim 0 (a dispatcher's claim, a reclaim of its expired lease
// too, is claim_seq 1 or more).
type Job = store.ClaimedDelivery

// The Dispatcher is the inbound handler's hand-off: Reserve, then Deliver (the protocol is
// inbound.HandOff's).
var _ inbound.HandOff = (*Dispatcher)(nil)

// Reserve takes up to n free worker slots for deliveries the inbound handler is about to insert
// already claimed (inbound.HandOff). It hands out nothing while Run is not claiming. While the
// queue has a backlog (the last claim did not drain it), reservations stop at three quarters of
// the workers: slots reserved for an inbound transaction are idle until it commits, and under
// load they would otherwise leave the claims that work off the backlog no free worker. Every
// Reserve must be followed by one Deliver with the same n, whatever happens to the transaction.
func (d *Dispatcher) Reserve(n int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.running || n <= 0 {
		return 0
	}
	limit := d.cfg.Workers
	if !d.caughtUp {
		limit -= d.cfg.Workers / 4
	}
	n = min(n, limit-d.active)
	if n <= 0 {
		return 0
	}
	d.active += n
	d.attempts.Add(n) // Run's shutdown waits for the slots until Deliver
	return n
}

// Deliver starts jobs (at most reserved) on the slots taken by Reserve(reserved) and frees
// the rest. A job over its webhook's or its org's per-instance cap, or behind older ones of its
// webhook already waiting, waits in memory for a slot, still claimed (Config.HandOffWait; the
// claiming loop starts it once the claim that follows a freed slot has taken its share, see
// startWaiting), within the bounds per webhook and in all; beyond them, or while its webhook is
// held here, it is handed back to the queue (due at once: a claim takes it when its webhook and
// org have room, fairly among the others). A waiting job holds no worker slot.
// queued reports that the inbound transaction also queued due deliveries it did not hand over:
// a claim is started for them.
func (d *Dispatcher) Deliver(reserved int, jobs []Job, queued bool) {
	if queued {
		d.mu.Lock()
		d.caughtUp = false
		d.mu.Unlock()
		// The claim that the transaction's notification started may have finished before this call
		// (and found the queue drained): claim again rather than leave them to the next poll.
		signal(d.wake)
	}
	if reserved <= 0 {
		return
	}
	if len(jobs) > reserved {
		jobs = jobs[:reserved] // cannot happen with a correct caller; the rest waits for its lease
	}
	d.mu.Lock()
	ctx := d.attemptCtx
	var run, back []job
	behind := false // a job waits behind older ones of its webhook that have room now
	now := d.now()
	for _, j := range jobs { // (StoreEvents made them attempt 1 under claim 0)
		if d.heldLocally(j, now) > 0 {
			back = append(back, j)
			continue
		}
		if len(d.waiting[j.WebhookID]) == 0 && d.perHook[j.WebhookID] < d.cfg.PerWebhook && d.perOrg[j.OrgID] < d.cfg.PerOrg {
			d.perHook[j.WebhookID]++
			d.perOrg[j.OrgID]++
			run = append(run, j)
			continue
		}
		if d.running && len(d.waiting[j.WebhookID]) < d.cfg.HandOffWaitPerWebhook && d.waitingN < d.cfg.HandOffWait {
			behind = behind || d.perHook[j.WebhookID] < d.cfg.PerWebhook && d.perOrg[j.OrgID] < d.cfg.PerOrg
			d.waiting[j.WebhookID] = append(d.waiting[j.WebhookID], j)
			d.waitingN++
			continue
		}
		back = append(back, j)
	}
	unused := reserved - len(run)
	wasFull := d.active >= d.cfg.Workers
	d.active -= unused
	d.mu.Unlock()
	d.handBack(back)
	for _, j := range run {
		d.launch(ctx, j, j.CreatedAt) // (claimed by the inbound transaction, at its time)
	}
	for range unused {
		d.attempts.Done()
	}
	if unused > 0 && wasFull {
		signal(d.slotFree) // the loop may be waiting for a slot
	}
	if behind {
		signal(d.wake) // the loop starts them (startWaiting)
	}
}

// maxHandOffWait is how long a handed-off delivery may wait in memory for a slot (Deliver),
// counted from its hand-off's claim: a quarter of what the lease leaves beyond the attempt's
// timeout (12.5 s at the defaults). The secret look-up may take up to half of that margin and
// the attempt its timeout, which leaves the outcome a quarter to be recorded before the lease
// ends; a claim that outlives its lease would be reclaimed and its delivery sent twice.
func (d *Dispatcher) maxHandOffWait() time.Duration { return (d.cfg.Lease - d.cfg.Timeout) / 4 }

// startWaiting starts the waiting hand-offs (Deliver) that have a slot now, oldest first per
// webhook, and hands back those that waited maxHandOffWait. It is called by the claiming loop
// after each claim has started its deliveries: the queue's due rows (retries, older work, other
// webhooks' and orgs' shares) take the freed slots first, so waiting hand-offs never take
// workers the fair claim would give to others, and they take no more than the caps allow, nor,
// while the queue has a backlog, more than the three quarters of the workers that Reserve
// allows the hand-off.
func (d *Dispatcher) startWaiting(ctx context.Context) {
	now := d.now()
	d.mu.Lock()
	limit := d.cfg.Workers
	if !d.caughtUp {
		limit -= d.cfg.Workers / 4
	}
	var run, back []job
	for hook, js := range d.waiting {
		k := 0
		for ; k < len(js); k++ {
			j := js[k]
			if held := d.heldLocally(j, now); held > 0 || !now.Before(j.CreatedAt.Add(d.maxHandOffWait())) {
				back = append(back, j)
				continue
			}
			if d.active >= limit || d.perHook[hook] >= d.cfg.PerWebhook || d.perOrg[j.OrgID] >= d.cfg.PerOrg {
				break
			}
			d.perHook[hook]++
			d.perOrg[j.OrgID]++
			d.active++
			run = append(run, j)
		}
		d.waitingN -= k
		if k == len(js) {
			delete(d.waiting, hook)
		} else {
			d.waiting[hook] = js[k:]
		}
	}
	d.mu.Unlock()
	d.handBack(back)
	d.attempts.Add(len(run))
	for _, j := range run {
		d.launch(ctx, j, j.CreatedAt)
	}
}

// dropWaiting hands every waiting hand-off back to the queue (at shutdown).
func (d *Dispatcher) dropWaiting() {
	d.mu.Lock()
	var back []job
	for hook, js := range d.waiting {
		back = append(back, js...)
		delete(d.waiting, hook)
	}
	d.waitingN = 0
	d.mu.Unlock()
	d.handBack(back)
}

// newClient builds the delivery HTTP client: no proxy (the SSRF check must see the target's
// address), SSRF guard on every dial unless private targets are allowed, no redirects.
func newClient(cfg Config) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if !cfg.AllowPrivateTargets {
		// Ports are not restricted: receivers may listen on any port; addresses are.
		dialer.Control = ssrf.New(ssrf.WithAnyPort()).Safe
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConns:          cfg.Workers * 2,
		// Several webhooks may share a host (and so its connections): keep as many idle as can be
		// busy, or every request beyond the idle limit pays a TLS handshake on both sides.
		MaxIdleConnsPerHost:    cfg.Workers,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	if cfg.RootCAs != nil {
		extra := cfg.RootCAs
		// A CertPool cannot be merged into the system pool, so the TLS connection is made here
		// and its chain is verified against the system roots, then against the extra ones.
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, &tls.Config{
				ServerName:         host,
				NextProtos:         []string{"h2", "http/1.1"},
				MinVersion:         tls.VersionTLS12,
				InsecureSkipVerify: true, // verified by VerifyConnection below
				VerifyConnection: func(cs tls.ConnectionState) error {
					return verifyChain(cs, host, extra)
				},
			})
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = raw.Close() // the handshake's error is the one to report
				return nil, err
			}
			return tc, nil
		}
	}
	return &http.Client{
		Transport: tr,
		Timeout:   cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

func verifyChain(cs tls.ConnectionState, host string, extra *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: server sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{DNSName: host, Intermediates: inter} // nil Roots: system pool
	_, errSystem := cs.PeerCertificates[0].Verify(opts)
	if errSystem == nil {
		return nil
	}
	opts.Roots = extra
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}

// Sign returns the X-Svc-Signature value and the Standard Webhooks headers (webhook-id,
// webhook-timestamp, webhook-signature) for one attempt of the event eventID with body at t,
// signed with secret and, during a secret rotation's grace, with each of older too.
//
// X-Svc-Signature is "t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>", keyed with the
// whole secret string, and one more ",v1=<hex>" per older secret. webhook-signature is
// "v1,<base64 HMAC-SHA256(key, "<id>.<t>.<body>")>" keyed with the base64-decoded part of the
// secret after "whsec_" (the raw string if it does not decode), and one more space-separated
// "v1,<base64>" per older secret (as Standard Webhooks allows). The current secret's come first.
func Sign(secret string, eventID uuid.UUID, t time.Time, body []byte, older ...string) (svc string, webhookID, webhookTimestamp, webhookSignature string) {
	ts := strconv.FormatInt(t.Unix(), 10)
	id := eventID.String()
	svc = "t=" + ts
	for i, s := range append([]string{secret}, older...) {
		m := hmac.New(sha256.New, []byte(s))
		m.Write([]byte(ts))
		m.Write([]byte{'.'})
		m.Write(body)
		svc += ",v1=" + hex.EncodeToString(m.Sum(nil))

		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil {
			key = []byte(s)
		}
		m = hmac.New(sha256.New, key)
		m.Write([]byte(id))
		m.Write([]byte{'.'})
		m.Write([]byte(ts))
		m.Write([]byte{'.'})
		m.Write(body)
		if i > 0 {
			webhookSignature += " "
		}
		webhookSignature += "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	return svc, id, ts, webhookSignature
}
