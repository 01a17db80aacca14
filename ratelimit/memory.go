package ratelimit

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// numShards is the number of independently locked key maps.
const numShards = 64

// MemoryLimiter is an exact sliding-window limiter for one process: the same
// algorithm as [RedisLimiter], with a per-key ring buffer of accepted
// timestamps (monotonic clock) behind sharded mutexes.
//
// A background janitor forgets keys that have had no accepted request for a
// whole window (such a key is indistinguishable from a new one), so memory
// stays proportional to the keys active in the last window. Call Close to stop
// the janitor.
type MemoryLimiter struct {
	cfg    atomic.Pointer[config]
	now    func() time.Time // injectable clock (tests)
	epoch  time.Time        // timestamps are nanoseconds since epoch
	seed   maphash.Seed
	shards [numShards]shard

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ Limiter = (*MemoryLimiter)(nil)

type shard struct {
	mu   sync.Mutex
	logs map[string]*ring
	_    [48]byte // keep shards on separate cache lines
}

// ring is a FIFO of accepted timestamps, oldest at head. Its buffer grows on
// demand up to the limit, so idle-ish keys stay small.
type ring struct {
	buf  []int64
	head int
	n    int
}

// at returns the i-th oldest timestamp (0 <= i < n).
func (r *ring) at(i int) int64 {
	return r.buf[(r.head+i)%len(r.buf)]
}

// expire drops timestamps at or before cutoff.
func (r *ring) expire(cutoff int64) {
	for r.n > 0 && r.buf[r.head] <= cutoff {
		r.head++
		if r.head == len(r.buf) {
			r.head = 0
		}
		r.n--
	}
}

// push appends ts; the caller guarantees r.n < limit.
func (r *ring) push(ts int64, limit int) {
	if r.n == len(r.buf) {
		nb := make([]int64, min(max(2*len(r.buf), 4), limit))
		for i := 0; i < r.n; i++ {
			nb[i] = r.at(i)
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = ts
	r.n++
}

// NewMemory returns an in-process limiter allowing at most limit requests per
// key in any rolling window of length window. A limit of 0 (or less) rejects
// every request; window must be positive (NewMemory panics otherwise).
func NewMemory(limit int, window time.Duration) *MemoryLimiter {
	return newMemory(limit, window, time.Now, janitorInterval(window))
}

// janitorInterval sweeps about once per window, between 1 s and 1 min.
func janitorInterval(window time.Duration) time.Duration {
	return min(max(window, time.Second), time.Minute)
}

// newMemory is NewMemory with an injectable clock and janitor interval; a
// non-positive interval starts no janitor.
func newMemory(limit int, window time.Duration, now func() time.Time, sweepEvery time.Duration) *MemoryLimiter {
	m := &MemoryLimiter{
		now:   now,
		epoch: now(),
		seed:  maphash.MakeSeed(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	m.cfg.Store(newConfig(limit, window))
	for i := range m.shards {
		m.shards[i].logs = make(map[string]*ring)
	}
	if sweepEvery > 0 {
		go m.janitor(sweepEvery)
	} else {
		close(m.done)
	}
	return m
}

// SetLimit changes the limit and window for subsequent calls. Accepted
// timestamps are kept, so lowering the limit rejects until enough of them have
// left the window. It panics if window is not positive.
func (m *MemoryLimiter) SetLimit(limit int, window time.Duration) {
	m.cfg.Store(newConfig(limit, window))
}

// Allow records and accepts one request for key if fewer than limit requests
// were accepted for it in the last window, and reports the decision. It never
// returns an error and does not look at ctx.
func (m *MemoryLimiter) Allow(_ context.Context, key string) (Decision, error) {
	cfg := m.cfg.Load()
	if cfg.limit <= 0 {
		return cfg.denyAll(), nil
	}
	now := m.elapsed()
	w := int64(cfg.window)

	sh := &m.shards[maphash.String(m.seed, key)%numShards]
	sh.mu.Lock()
	r := sh.logs[key]
	if r == nil {
		r = &ring{}
		sh.logs[key] = r
	}
	r.expire(now - w)
	d := Decision{Limit: cfg.limit}
	if r.n < cfg.limit {
		r.push(now, cfg.limit)
		d.Allowed = true
		d.Remaining = cfg.limit - r.n
	} else {
		// The slot frees when the entry that keeps the window at the limit
		// leaves it: the oldest one, unless the limit was lowered.
		d.RetryAfter = max(time.Duration(r.at(r.n-cfg.limit)+w-now), 1)
	}
	d.Reset = time.Duration(r.at(0) + w - now)
	sh.mu.Unlock()
	return d, nil
}

// Close stops the janitor. The limiter keeps working (without forgetting idle
// keys). Close is idempotent.
func (m *MemoryLimiter) Close() {
	m.closeOnce.Do(func() { close(m.stop) })
	<-m.done
}

// elapsed is the clock reading in nanoseconds since the limiter was created.
func (m *MemoryLimiter) elapsed() int64 {
	return int64(m.now().Sub(m.epoch))
}

func (m *MemoryLimiter) janitor(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sweep()
		}
	}
}

// sweep forgets every key whose newest accepted request has left the window.
func (m *MemoryLimiter) sweep() {
	cutoff := m.elapsed() - int64(m.cfg.Load().window)
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		before := len(sh.logs)
		for k, r := range sh.logs {
			if r.n == 0 || r.at(r.n-1) <= cutoff {
				delete(sh.logs, k)
			}
		}
		// Go maps never shrink: rebuild one that lost most of its keys.
		if after := len(sh.logs); before >= 1024 && after < before/4 {
			nm := make(map[string]*ring, after)
			for k, r := range sh.logs {
				nm[k] = r
			}
			sh.logs = nm
		}
		sh.mu.Unlock()
	}
}

// keys returns the number of keys currently tracked.
func (m *MemoryLimiter) keys() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.logs)
		sh.mu.Unlock()
	}
	return n
}
