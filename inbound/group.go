package inbound

import (
	"context"
	"sync"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

// GroupStore is a Store that stores the items of several posts in one transaction
// (*store.Store implements it). With one, the Handler commits the posts that wait for their
// turn together (group commit): see the package documentation.
type GroupStore interface {
	Store
	// StoreEventsGroup stores each post's items as StoreEvents would, all in one transaction,
	// and returns each post's result in the order of posts; on an error nothing is stored.
	StoreEventsGroup(ctx context.Context, posts []store.Post) ([]store.InboundResult, error)
}

// maxGroupItems bounds the items of one group: a group takes waiting posts, in arrival order,
// until it holds that many items (at least one post, whatever its size).
const maxGroupItems = 1000

// pending is a post waiting for its group's transaction.
type pending struct {
	ctx   context.Context
	items []store.IncomingItem
	disp  HandOff // nil: no hand-off
	claim store.Claim
	taken bool // in a group (under grouper.mu)
	res   store.InboundResult
	err   error
	done  chan struct{} // closed when res and err are set
}

// grouper runs the transactions of grouped posts: at most limit at once, each taking every
// post waiting at its start (up to maxGroupItems).
type grouper struct {
	st      GroupStore
	limit   int
	mu      sync.Mutex
	queue   []*pending
	running int // transactions running, each on a runner (≤ limit)
}

// storeGrouped stores items in a group with the posts waiting beside it. It waits at most
// MaxWait for a group to take it; past that it is stored alone, outside the limit
// (Observer.Overflow). ok is false when ctx ended before a group took it (the caller gave up).
func (h *Handler) storeGrouped(ctx context.Context, items []store.IncomingItem, disp HandOff) (res store.InboundResult, ok bool, err error) {
	g := h.group
	p := &pending{ctx: ctx, items: items, disp: disp, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, p)
	if g.running < g.limit {
		g.running++
		g.mu.Unlock()
		h.run(p)
		<-p.done // (another runner may have taken it)
		return p.res, true, p.err
	}
	g.mu.Unlock()
	select {
	case <-p.done: // (no timer while a runner is free: checked above)
		return p.res, true, p.err
	default:
	}
	wait := time.NewTimer(h.cfg.MaxWait)
	defer wait.Stop()
	select {
	case <-p.done:
		return p.res, true, p.err
	case <-wait.C:
		if g.withdraw(p) {
			h.cfg.Observer.Overflow()
			h.storeGroup([]*pending{p})
		}
	case <-ctx.Done():
		if g.withdraw(p) {
			return store.InboundResult{}, false, nil
		}
	}
	<-p.done // taken by a group meanwhile: its answer stands
	return p.res, true, p.err
}

// withdraw takes p out of the queue unless a group has taken it, and reports whether it did.
func (g *grouper) withdraw(p *pending) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.taken {
		return false
	}
	for i, q := range g.queue {
		if q == p {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			break
		}
	}
	return true
}

// run runs groups on a runner slot until own (nil: none) is stored, then leaves the slot to a goroutine
// when posts are still waiting (or frees it).
func (h *Handler) run(own *pending) {
	g := h.group
	var ownDone chan struct{} // (nil, never ready, without own: run until nothing waits)
	if own != nil {
		ownDone = own.done
	}
	for {
		group := g.next()
		if group == nil {
			return // (the slot was freed)
		}
		h.storeGroup(group)
		select {
		case <-ownDone:
			g.mu.Lock()
			if len(g.queue) == 0 {
				g.running--
				g.mu.Unlock()
				return
			}
			g.mu.Unlock()
			go h.run(nil)
			return
		default:
		}
	}
}

// next takes the waiting posts of the next group, or frees the runner's slot and returns nil
// when none waits.
func (g *grouper) next() []*pending {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.running--
		return nil
	}
	n, items := 0, 0
	for n < len(g.queue) && (n == 0 || items+len(g.queue[n].items) <= maxGroupItems) {
		items += len(g.queue[n].items)
		g.queue[n].taken = true
		n++
	}
	group := make([]*pending, n)
	copy(group, g.queue)
	g.queue = append(g.queue[:0], g.queue[n:]...)
	return group
}

// storeGroup stores the posts of group in one transaction, with the hand-off protocol of
// HandOff for each of them (reserved just before the transaction, delivered after it, after
// the channels handed new objects are invalidated), and answers each.
func (h *Handler) storeGroup(group []*pending) {
	posts := make([]store.Post, len(group))
	var instance string
	var lease time.Duration
	for i, p := range group {
		if p.disp != nil {
			c := store.Claim{Instance: p.disp.InstanceID(), Lease: p.disp.Lease()}
			if instance == "" {
				instance, lease = c.Instance, c.Lease
			}
			if c.Instance == instance && c.Lease == lease { // (one dispatcher: always)
				c.Max = p.disp.Reserve(maxHandOff * len(p.items))
			}
			p.claim = c
		}
		posts[i] = store.Post{Items: p.items, Claim: p.claim}
	}
	ctx, cancel := groupContext(group)
	results, err := h.group.st.StoreEventsGroup(ctx, posts)
	cancel()
	for i, p := range group {
		if err != nil {
			p.err = err
		} else {
			p.res = results[i]
		}
		if h.cfg.Invalidate != nil {
			for _, id := range p.res.ObjectChannels {
				h.cfg.Invalidate(id)
			}
		}
		if p.disp != nil {
			p.disp.Deliver(p.claim.Max, p.res.Claimed, p.res.Queued > 0)
		}
		close(p.done)
	}
}

// groupContext returns the context of a group's transaction: the post's own for a group of
// one; else one with the values of the first post's that ends only when every post's has
// ended (a client that gives up does not abort the others' transaction).
func groupContext(group []*pending) (context.Context, context.CancelFunc) {
	if len(group) == 1 {
		return group[0].ctx, func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(group[0].ctx))
	var mu sync.Mutex
	left := len(group)
	stops := make([]func() bool, len(group))
	for i, p := range group {
		stops[i] = context.AfterFunc(p.ctx, func() {
			mu.Lock()
			left--
			if left == 0 {
				cancel()
			}
			mu.Unlock()
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// Interface guard.
var _ GroupStore = (*store.Store)(nil)
