package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/internal/autopipe"
)

// Redis is a [Store] shared by every instance that uses the same Redis (7.0 or later).
//
// Each key is one Redis string, Prefix + key, holding a JSON record:
//
//	in flight: {"s":"p","f":<fingerprint>,"o":<owner token>}          expires after Options.Lease
//	           the same ending ,"w":1} once a duplicate waits for it
//	completed: {"s":"d","f":<fingerprint>,"c":<status>,"h":<header>,"b":<base64 body>}  after Options.TTL (earlier releases wrote "f" first; read alike)
//
// Begin claims a key in one round trip (SET key <in flight> NX PX lease GET): a nil reply means
// the caller owns it, otherwise the reply is the record to judge. The token Begin returns is the
// owner token ("o") and the fingerprint, "<owner>.<fingerprint>", so that Complete can rebuild
// the in-flight record it claimed and the completed record whole. Complete and Release are Lua
// scripts that act only if the owner token still matches (fencing). Complete's first check is
// one string comparison: the record is exactly the one its Begin wrote (with or without a
// waiter's mark), and the completed record, built by the caller, is stored as sent; any other
// record is checked as Release checks it, with string operations on a record in the form Begin
// writes (no JSON decoding) or else by decoding, and then keeps its own fingerprint (Complete
// costs 6.8–7.0 instead of 9.4–9.6 µs of Redis CPU: bench/README.md, "Figures behind the
// defaults (relay admission)"). Release then PUBLISHes on
// the channel Prefix + "done:" + key; Complete does only when a duplicate waits (the record
// carries "w"), so that a send nobody repeats costs no PUBLISH (which Redis Cluster broadcasts
// to every node). Completions of concurrent sends go to Redis together (see Complete).
//
// Waiting duplicates register in-process and are woken by one PSUBSCRIBE Prefix + "done:*"
// connection per Redis value (that is, per instance), fanned out to them. A waiter registers
// before it re-reads the key, and that re-read (a script: SET NX GET, and "w" added to an
// in-flight record in the same step) marks the record as waited for: a completion before the
// re-read is seen by it, one after it publishes, so no completion is missed while that
// connection is subscribed. A waiter also re-reads every 250 ms in case a message was lost (or
// was not sent: a waiter of a release before the mark does not mark, so during a rolling upgrade
// it may wait for this re-read), and at its deadline. The listener
// starts with the first Begin (nothing is dialled before). Whenever it becomes subscribed (at
// start and after every reconnect) it wakes every waiter to re-read its key, which covers
// whatever was published while it was not. It reconnects by itself, with backoff up to 2 s,
// after Redis comes back, and pings an idle connection every 15 s to notice a dead one. Close
// stops it.
//
// Errors from Redis are returned at once (wrapping [ErrUnavailable]); how long a call takes to
// fail with Redis down is governed by the client's DialTimeout, ReadTimeout and MaxRetries.
type Redis struct {
	client redis.UniversalClient
	opt    Options
	log    *zap.Logger

	chanPrefix string // Prefix + "done:"; channel of key k = chanPrefix + k
	pattern    string // PSUBSCRIBE pattern matching every channel of this store

	waiters waiters

	// Tunables, changed by tests only before first use.
	poll      time.Duration // safety re-read interval of a waiting Begin
	pingEvery time.Duration // idle time after which the listener pings its connection

	calls *autopipe.Pipeliner // the completions of concurrent callers, one pipeline per round trip

	startOnce  sync.Once
	ctx        context.Context // cancelled by Close; the listener's context
	cancel     context.CancelFunc
	done       chan struct{} // closed when the listener has returned (or was never started)
	mu         sync.Mutex    // guards closed and ps
	closed     bool
	ps         *redis.PubSub // the listener's current pub/sub connection
	subscribed atomic.Bool   // the listener is subscribed right now
}

var _ Store = (*Redis)(nil)

// NewRedis returns a Store on client (a *redis.Client or *redis.ClusterClient; it is borrowed,
// and Close does not close it). It dials nothing: the pub/sub listener starts with the first
// Begin. logger (may be nil) gets the listener's connection losses and recoveries. Call Close
// when done.
func NewRedis(client redis.UniversalClient, opt Options, logger *zap.Logger) *Redis {
	opt = opt.withDefaults()
	if logger == nil {
		logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Redis{
		client:     client,
		calls:      autopipe.New(client),
		opt:        opt,
		log:        logger,
		chanPrefix: opt.Prefix + "done:",
		poll:       defaultPoll,
		pingEvery:  15 * time.Second,
		ctx:        ctx,
		cancel:     cancel,
		done:       make(chan struct{}),
	}
	s.pattern = escapeGlob(s.chanPrefix) + "*"
	return s
}

// Close stops the pub/sub listener and waits for it. It does not close the client. Begin still
// works after Close but waiting duplicates are then woken only by polling.
func (s *Redis) Close() error {
	s.mu.Lock()
	s.closed = true
	ps := s.ps
	s.mu.Unlock()
	s.cancel()
	if ps != nil {
		_ = ps.Close() // unblocks the listener's read; the store is closing either way
	}
	s.startOnce.Do(func() { close(s.done) }) // never started: nothing to wait for
	<-s.done
	return nil
}

// defaultPoll is how often a waiting Begin re-reads the key even without a wake-up, in case a
// wake-up was lost (pub/sub reconnecting) or the owner's lease ended.
const defaultPoll = 250 * time.Millisecond

// record is the JSON stored under a key.
type record struct {
	State  string      `json:"s"`           // "p" in flight, "d" completed
	FP     string      `json:"f"`           // request fingerprint
	Owner  string      `json:"o,omitempty"` // owner token, in flight only
	Status int         `json:"c,omitempty"`
	Header http.Header `json:"h,omitempty"`
	Body   []byte      `json:"b,omitempty"`
}

const (
	statePending = "p"
	stateDone    = "d"
)

// ownedLua defines, for the scripts below, the owner check of an in-flight record:
//
//	owned(record, token) -> the fingerprint as JSON and whether a waiter marked the record, or nil
//
// nil unless record is in flight and owned by token. A record exactly as [Redis.PrepareClaim]
// encodes it ({"s":"p","f":"<fp>","o":"<token>"}, marked or not by a waiter's ,"w":1) is
// checked with string operations; any other (a fingerprint or token that JSON escapes, a
// record written otherwise) is decoded with cjson, and then counts as marked.
const ownedLua = `
local function owned(v, tok)
  local head = '{"s":"p","f":"'
  if string.sub(v, 1, #head) == head and not string.find(tok, '["\\]') then
    for w = 0, 1 do
      local tail = '","o":"' .. tok .. (w == 1 and '","w":1}' or '"}')
      local n = #v - #tail
      if n >= #head and string.sub(v, n + 1) == tail then
        local fp = string.sub(v, #head + 1, n)
        if not string.find(fp, '["\\]') then return '"' .. fp .. '"', w == 1 end
      end
    end
  end
  local ok, r = pcall(cjson.decode, v)
  if ok and type(r) == 'table' and r.s == 'p' and r.o == tok then return cjson.encode(r.f), true end
  return nil
end
`

// completeScript stores a completed record with PX ARGV[3] if KEYS[1] is in flight and owned by
// ARGV[1], then publishes on ARGV[4] if a waiter marked the record (waitClaimScript). ARGV[2] is
// the completed record whole, as the caller built it from the token's fingerprint; ARGV[5] is the
// in-flight record its Begin wrote. When KEYS[1] holds exactly that record (or that record marked by
// a waiter), ARGV[2] is stored as it is. Otherwise the owner is checked by owned() and the record
// stored keeps the in-flight record's own fingerprint: '{"s":"d","f":' .. fp, then ARGV[2] from
// byte ARGV[6] (where its members after "f" start), so that a token whose fingerprint part was
// altered can never change a key's fingerprint. It returns 1 if it stored, 0 if the token is not
// the owner.
var completeScript = redis.NewScript(ownedLua + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local waited = false
if v ~= ARGV[5] then
  if v == string.sub(ARGV[5], 1, -2) .. ',"w":1}' then
    waited = true
  else
    local fp
    fp, waited = owned(v, ARGV[1])
    if not fp then return 0 end
    redis.call('SET', KEYS[1], '{"s":"d","f":' .. fp .. string.sub(ARGV[2], tonumber(ARGV[6])), 'PX', ARGV[3])
    if waited then redis.call('PUBLISH', ARGV[4], 'd') end
    return 1
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if waited then redis.call('PUBLISH', ARGV[4], 'd') end
return 1
`)

// waitClaimScript is the claim of a duplicate that waits (registered for wake-ups): SET KEYS[1]
// ARGV[1] NX PX ARGV[2] GET and, when the key is in flight in the form PrepareClaim encodes,
// marks it as waited for (,"w":1 added, TTL kept) unless it is marked already, so that its
// Complete publishes. It returns what SET NX GET returns.
var waitClaimScript = redis.NewScript(`
local v = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if v and string.sub(v, 1, 14) == '{"s":"p","f":"' and string.sub(v, -2) == '"}' then
  redis.call('SET', KEYS[1], string.sub(v, 1, -2) .. ',"w":1}', 'KEEPTTL')
end
return v
`)

// releaseScript deletes KEYS[1] if it is in flight and owned by ARGV[1], then publishes on
// ARGV[2]. It returns 1 if it deleted, 0 if the token is not the owner.
var releaseScript = redis.NewScript(ownedLua + `
local v = redis.call('GET', KEYS[1])
if not v or not owned(v, ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'r')
return 1
`)

// Begin implements [Store.Begin].
func (s *Redis) Begin(ctx context.Context, key, fp string) (Result, error) {
	c, err := s.PrepareClaim(key, fp)
	if err != nil {
		return Result{}, err
	}
	return s.begin(ctx, c, nil)
}

// ClaimLua defines the claim of [Redis.Begin] as a Lua function, for a script that claims a key
// in the same round trip as other work (package admission counts the rate limit with it):
//
//	claim(key, record, lease_ms) -> the record held before, or false when the caller now owns key
//
// It is SET key record NX PX lease_ms GET. A script that embeds it claims a [Claim] c with
// claim(c.Key, c.Record, c.Lease), c.Key among its KEYS, and hands the reply to
// [Redis.ContinueClaim].
const ClaimLua = `
local function claim(key, record, lease)
  return redis.call('SET', key, record, 'NX', 'PX', lease, 'GET')
end
`

// Claim is one claim of a key, prepared by [Redis.PrepareClaim] for a script that embeds
// [ClaimLua]; [Redis.ContinueClaim] finishes it as Begin would.
type Claim struct {
	// Key is the Redis key of the claim (the store's prefix + the caller's key).
	Key string
	// Record is the in-flight record set when the key is free (it holds the owner token).
	Record string
	// Lease is the claim's lease in milliseconds.
	Lease int64

	key, fp, token string
	deadline       time.Time // the end of a duplicate's wait
}

// PrepareClaim returns the claim of key for a request with fingerprint fp, as [Redis.Begin]
// makes it, and starts the pub/sub listener if it was not running. The wait of a duplicate
// (Options.Wait) counts from now.
func (s *Redis) PrepareClaim(key, fp string) (Claim, error) {
	s.start()
	owner := rand.Text()
	return Claim{Key: s.opt.Prefix + key, Record: pendingRecord(fp, owner), Lease: millis(s.opt.Lease),
		key: key, fp: fp, token: owner + tokenSep + fp, deadline: time.Now().Add(s.opt.Wait)}, nil
}

// tokenSep separates the owner token ("o" of the record; rand.Text, which never holds it) from
// the fingerprint in the token Begin returns.
const tokenSep = "."

// pendingRecord is the in-flight record of fingerprint fp owned by owner, exactly as Begin
// writes it (Complete rebuilds it with this function and compares it whole).
func pendingRecord(fp, owner string) string {
	b := make([]byte, 0, len(`{"s":"p","f":,"o":}`)+len(fp)+len(owner)+4)
	b = appendQuoted(append(b, `{"s":"p","f":`...), fp)
	b = appendQuoted(append(b, `,"o":`...), owner)
	return string(append(b, '}'))
}

// appendQuoted appends s as a JSON string, as encoding/json writes it.
func appendQuoted(b []byte, s string) []byte {
	if !plainJSON(s) {
		q, _ := json.Marshal(s) // a string always encodes
		return append(b, q...)
	}
	return append(append(append(b, '"'), s...), '"')
}

// quotedLen is the length of s as a JSON string, as encoding/json writes it.
func quotedLen(s string) int {
	if !plainJSON(s) {
		q, _ := json.Marshal(s)
		return len(q)
	}
	return len(s) + 2
}

// plainJSON reports whether encoding/json writes s as it is, between quotes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// ContinueClaim finishes the Begin of c after a script made its first claim: reply is that
// claim's reply as go-redis returns it (nil when the caller now owns the key, else the record
// held). It answers exactly as Begin: a wait for an in-flight owner re-reads with plain claims.
// A reply of any other type is an error wrapping [ErrUnavailable].
func (s *Redis) ContinueClaim(ctx context.Context, c Claim, reply any) (Result, error) {
	return s.begin(ctx, c, &reply)
}

// begin runs the claim loop of c. first, when set, is the reply of a first claim already made
// (by ContinueClaim's caller); else the first claim is the plain one.
func (s *Redis) begin(ctx context.Context, c Claim, first *any) (Result, error) {
	key, fp := c.key, c.fp
	var (
		wake  chan struct{} // set once registered as a waiter
		timer *time.Timer   // fires at the deadline
		poll  *time.Ticker
		final bool // the deadline passed: this is the last read
	)
	defer func() {
		if wake != nil {
			s.waiters.remove(key, wake)
			timer.Stop()
			poll.Stop()
		}
	}()
	for {
		// SET NX GET claims the key if it is free and otherwise reads it, in one round trip.
		var (
			old string
			err error
		)
		switch {
		case first != nil:
			old, err = claimReply(*first)
			first = nil
		case wake != nil: // registered: mark the record, so that its completion wakes us
			old, err = waitClaimScript.Run(ctx, s.client, []string{c.Key}, c.Record, c.Lease).Text()
		default:
			old, err = s.client.Do(ctx, "SET", c.Key, c.Record, "NX", "PX", c.Lease, "GET").Text()
		}
		if errors.Is(err, redis.Nil) {
			return Result{Outcome: Acquired, Token: c.token}, nil
		}
		if err != nil {
			return Result{}, s.wrap(ctx, "claiming", key, err)
		}
		var rec record
		if err := json.Unmarshal([]byte(old), &rec); err != nil {
			return Result{}, fmt.Errorf("%w: idempotency: key %q holds an unreadable record: %v", ErrUnavailable, key, err)
		}
		switch {
		case rec.FP != fp:
			return Result{Outcome: Mismatch}, nil
		case rec.State == stateDone:
			h := rec.Header
			if h == nil {
				h = http.Header{}
			}
			return Result{Outcome: Replay, Response: &Response{Status: rec.Status, Header: h, Body: rec.Body}}, nil
		case final || s.opt.Wait <= 0:
			return Result{Outcome: InProgress}, nil
		}
		if wake == nil {
			// Register first, then read again at once, marking the record as waited for: a
			// completion after that read publishes and wakes us, one before it is seen by the
			// read.
			wake = s.waiters.add(key)
			timer = time.NewTimer(time.Until(c.deadline))
			poll = time.NewTicker(s.poll)
			continue
		}
		select {
		case <-wake:
		case <-poll.C:
		case <-timer.C:
			final = true
		case <-ctx.Done():
			return Result{}, fmt.Errorf("idempotency: waiting for key %q: %w", key, ctx.Err())
		}
	}
}

// claimReply decodes the reply of claim (ClaimLua) as SET NX GET's: the record held, or
// redis.Nil when the caller now owns the key.
func claimReply(reply any) (string, error) {
	switch v := reply.(type) {
	case nil:
		return "", redis.Nil
	case string:
		return v, nil
	}
	return "", fmt.Errorf("unexpected claim reply %v", reply)
}

// Complete implements [Store.Complete].
//
// Concurrent completions are grouped: those that arrive while one is on its way to Redis go
// together in the next round trip, one pipeline of the fenced script (package
// internal/autopipe; no timer: a lone completion is sent at once). Each caller still gets its
// own result and returns only once its record is stored, so a replay that starts after Complete
// returned finds it.
func (s *Redis) Complete(ctx context.Context, key, token string, resp Response) error {
	owner, fp, ok := strings.Cut(token, tokenSep)
	if !ok {
		return ErrNotOwner // not a token of Begin: it owns nothing
	}
	h := resp.Header
	if len(h) == 0 {
		h = nil
	}
	full, err := json.Marshal(record{State: stateDone, FP: fp, Status: resp.Status, Header: h, Body: resp.Body})
	if err != nil {
		return fmt.Errorf("idempotency: encoding response: %w", err)
	}
	// {"s":"d","f":<fp>,"c":...}: the members after "f" start at byte head+1 (Lua counts from 1).
	head := len(`{"s":"d","f":`) + quotedLen(fp)
	n, err := s.calls.Run(ctx, completeScript, []string{s.opt.Prefix + key}, owner, full, millis(s.opt.TTL),
		s.chanPrefix+key, pendingRecord(fp, owner), head+1).Int()
	if err != nil {
		return s.wrap(ctx, "completing", key, err)
	}
	if n != 1 {
		return ErrNotOwner
	}
	return nil
}

// Release implements [Store.Release].
func (s *Redis) Release(ctx context.Context, key, token string) error {
	owner, _, ok := strings.Cut(token, tokenSep)
	if !ok {
		return ErrNotOwner
	}
	n, err := releaseScript.Run(ctx, s.client, []string{s.opt.Prefix + key}, owner, s.chanPrefix+key).Int()
	if err != nil {
		return s.wrap(ctx, "releasing", key, err)
	}
	if n != 1 {
		return ErrNotOwner
	}
	return nil
}

// wrap turns a Redis error into the error Begin, Complete and Release return: ctx.Err() if ctx
// ended, else ErrUnavailable.
func (s *Redis) wrap(ctx context.Context, op, key string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("idempotency: %s key %q: %w", op, key, ctx.Err())
	}
	return fmt.Errorf("%w: %s key %q: %w", ErrUnavailable, op, key, err)
}

// start starts the pub/sub listener, once, unless Close came first.
func (s *Redis) start() {
	s.startOnce.Do(func() { go s.listen() })
}

// listen keeps one PSUBSCRIBE connection up until Close, fanning messages out to waiters.
func (s *Redis) listen() {
	defer close(s.done)
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	lost := false // the connection was lost and that was logged
	for s.ctx.Err() == nil {
		wasSubscribed, err := s.session(&lost)
		s.subscribed.Store(false)
		if s.ctx.Err() != nil {
			return
		}
		if wasSubscribed {
			backoff = minBackoff
		}
		if !lost {
			lost = true
			s.log.Warn("idempotency: pub/sub connection to Redis lost; waiting duplicates fall back to polling until it is back",
				zap.Error(err))
		}
		select {
		case <-time.After(backoff):
		case <-s.ctx.Done():
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session runs one pub/sub connection until it fails or Close. It reports whether it got as
// far as being subscribed.
func (s *Redis) session(lost *bool) (wasSubscribed bool, err error) {
	ps := s.client.PSubscribe(s.ctx) // no pattern yet: dials nothing
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ps.Close() // never subscribed: nothing to lose
		return false, errors.New("closed")
	}
	s.ps = ps
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.ps = nil
		s.mu.Unlock()
		_ = ps.Close() // the session is over; the next one dials a new connection
	}()

	if err := ps.PSubscribe(s.ctx, s.pattern); err != nil {
		return false, err
	}
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(s.ctx, s.pingEvery)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				// Idle: make sure the connection is still alive. No answer by the next
				// timeout means it is not.
				if err := ps.Ping(s.ctx); err != nil {
					return wasSubscribed, err
				}
				pinged = true
				continue
			}
			return wasSubscribed, err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "psubscribe" {
				wasSubscribed = true
				s.subscribed.Store(true)
				if *lost {
					*lost = false
					s.log.Info("idempotency: pub/sub connection to Redis is back")
				}
				// Completions published while we were not subscribed were missed: have every
				// waiter read its key again.
				s.waiters.notifyAll()
			}
		case *redis.Message:
			if key, ok := strings.CutPrefix(m.Channel, s.chanPrefix); ok {
				s.waiters.notify(key)
			}
		}
	}
}

// millis returns d in whole milliseconds, at least 1 (Redis refuses PX 0).
func millis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// escapeGlob escapes the characters that are special in Redis glob patterns.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// waiters is the in-process registry of Begin calls waiting for a key, by key.
type waiters struct {
	mu sync.Mutex
	m  map[string]map[chan struct{}]struct{}
}

// add registers a waiter for key and returns its wake-up channel (buffered, never closed).
func (w *waiters) add(key string) chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = make(map[string]map[chan struct{}]struct{})
	}
	set := w.m[key]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		w.m[key] = set
	}
	set[ch] = struct{}{}
	return ch
}

// remove unregisters the waiter ch of key.
func (w *waiters) remove(key string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.m[key]
	delete(set, ch)
	if len(set) == 0 {
		delete(w.m, key)
	}
}

// notify wakes every waiter of key.
func (w *waiters) notify(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.m[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// notifyAll wakes every waiter.
func (w *waiters) notifyAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, set := range w.m {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}
