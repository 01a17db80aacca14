package main

// The fairness and ordering steps: the load of each part, and the webhooks they change between
// parts.

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/store"
)

// fairness is the fairness step: the healthy webhooks' deliveries without (base) and with
// (loaded) a slow webhook and a paused one holding held deliveries.
type fairness struct {
	rate         int
	base, loaded *stepResult
	held         int           // events posted for the paused webhook alone (accepted)
	heldQueued   int64         // its queued deliveries before (c) (held; pending rows before the queue table)
	heldTook     time.Duration // time to post them
	heldAtEnd    int64         // its queued deliveries at the end of (c)
	heldAtEndQ   int64         // … of which in status held (queue table only)
	paused, slow uuid.UUID
	slowOwed     int   // deliveries owed to the slow webhook: events accepted in (c)
	slowAttempts int64 // requests received at the slow path during (c) and its drain
	slowAnswered int64 // … answered (after the timeout: too late for the dispatcher)
	slowQueued   int64 // its queued deliveries at the end of (c)
	pausedRcpts  int64 // receipts at the paused path, whole run (must be 0)
	queueTable   bool  // held deliveries are delivery_queue rows in status held
}

func (f *fairness) ratio() float64 {
	if f.base == nil || f.loaded == nil || f.base.runRate() == 0 {
		return 0
	}
	return f.loaded.runRate() / f.base.runRate()
}

// runFairness runs the fairness step's three parts (see the package comment). The webhooks
// are created with the store's own methods (CreateWebhook, SetWebhookStatus, DeleteWebhook),
// as the management API would. It deletes the healthy webhooks it is given (their IDs are
// stale afterwards), which is why it runs last.
func runFairness(ctx context.Context, c config, ld *loader, st *store.Store, orgID uuid.UUID, healthy []uuid.UUID, receiverBase string) (*fairness, error) {
	f := &fairness{rate: c.fairness, queueTable: ld.q.table}
	hooks := plural(c.webhooks, "webhook", "webhooks")

	// (a) baseline: the healthy webhooks alone
	benchkit.Logf("fairness (a) baseline: %d events/s × %d healthy %s for %s", c.fairness, c.webhooks, hooks, c.duration)
	f.base = ld.step(ctx, stepSpec{name: "fairness-a", kind: kindFairBase, rate: c.fairness, d: c.duration, drain: c.drain})
	if err := ctx.Err(); err != nil {
		return f, err
	}
	benchkit.Logf("  healthy deliveries/s %.0f, e2e p99 %.1f ms, lost %d", f.base.runRate(), f.base.e2e.p99, f.base.lost())
	if err := ld.q.truncate(ctx); err != nil {
		return f, err
	}

	// (b) the paused webhook alone, and its held deliveries. The healthy webhooks have no
	// deliveries left (truncated): deleting them only keeps (b)'s events from reaching them.
	for _, id := range healthy {
		if err := st.DeleteWebhook(ctx, orgID, id); err != nil {
			return f, fmt.Errorf("fairness: delete healthy webhook: %w", err)
		}
	}
	pw, _, err := st.CreateWebhook(ctx, orgID, store.NewWebhook{Name: "bench paused", URL: receiverBase + pausedPath,
		Events: []string{store.EventMessages, store.EventMessageStatus}})
	if err != nil {
		return f, fmt.Errorf("fairness: create paused webhook: %w", err)
	}
	if _, err := st.SetWebhookStatus(ctx, orgID, pw.ID, store.WebhookPaused); err != nil {
		return f, fmt.Errorf("fairness: pause webhook: %w", err)
	}
	f.paused = pw.ID
	benchkit.Logf("fairness (b): %d events for the paused webhook alone, as fast as the inbound handler takes them", c.held)
	start := time.Now()
	n, err := ld.fill(ctx, c.held)
	f.held, f.heldTook = n, time.Since(start)
	if err != nil {
		return f, fmt.Errorf("fairness: held deliveries: %w", err)
	}
	byHook, err := ld.q.byHook(ctx)
	if err != nil {
		return f, err
	}
	f.heldQueued = byHook[pw.ID].total
	benchkit.Logf("  %d events accepted in %s (%.0f/s); the paused webhook holds %d deliveries",
		n, f.heldTook.Round(time.Millisecond), float64(n)/f.heldTook.Seconds(), f.heldQueued)

	// (c) the healthy webhooks again, the slow one, the paused one holding. The step's backlog
	// leaves out the slow and the paused webhook by ID and the receiver counts the healthy ones
	// by path, so the new healthy ones' IDs are not needed.
	if _, err := createWebhooks(ctx, st, orgID, receiverBase+hookPrefix, c.webhooks); err != nil {
		return f, err
	}
	sw, _, err := st.CreateWebhook(ctx, orgID, store.NewWebhook{Name: "bench slow", URL: receiverBase + slowPath,
		Events: []string{store.EventMessages, store.EventMessageStatus}})
	if err != nil {
		return f, fmt.Errorf("fairness: create slow webhook: %w", err)
	}
	f.slow = sw.ID
	benchkit.Logf("fairness (c): %d events/s × %d healthy %s, with the slow webhook (answers after %s) and the paused one holding %d",
		c.fairness, c.webhooks, hooks, ld.rc.slowDelay, f.heldQueued)
	slow0 := ld.rc.slowReceipts.Load()
	slowAns0 := ld.rc.slowAnswered.Load()
	f.loaded = ld.step(ctx, stepSpec{name: "fairness-c", kind: kindFairLoaded, rate: c.fairness, d: c.duration, drain: c.drain,
		exclude: []uuid.UUID{sw.ID, pw.ID}})
	if err := ctx.Err(); err != nil {
		return f, err
	}
	f.slowOwed = f.loaded.accepted
	f.slowAttempts = ld.rc.slowReceipts.Load() - slow0
	f.slowAnswered = ld.rc.slowAnswered.Load() - slowAns0
	f.pausedRcpts = ld.rc.pausedReceipts.Load()
	if byHook, err = ld.q.byHook(ctx); err != nil {
		return f, err
	}
	f.slowQueued = byHook[sw.ID].total
	f.heldAtEnd, f.heldAtEndQ = byHook[pw.ID].total, byHook[pw.ID].held
	benchkit.Logf("  healthy deliveries/s %.0f (%.2f × baseline), e2e p99 %.1f ms, lost %d; slow: %d owed, %d attempts, %d queued; paused holds %d",
		f.loaded.runRate(), f.ratio(), f.loaded.e2e.p99, f.loaded.lost(), f.slowOwed, f.slowAttempts, f.slowQueued, f.heldAtEnd)
	return f, nil
}

// runOrdering runs the ordering step: -rate's first rate for -duration to the healthy webhooks
// with ordering none, then again with ordering conversation (messages spread over
// -conversations customers), each drained; the webhooks are set back to none after it.
func runOrdering(ctx context.Context, c config, ld *loader, st *store.Store, orgID uuid.UUID, healthy []uuid.UUID, q *queue) ([]*stepResult, error) {
	set := func(ordering string) error {
		for _, id := range healthy {
			if _, err := st.SetWebhookOrdering(ctx, orgID, id, ordering); err != nil {
				return err
			}
		}
		return nil
	}
	rate := c.rates[0]
	var out []*stepResult
	for _, ordering := range []string{store.OrderingNone, store.OrderingConversation} {
		if err := set(ordering); err != nil {
			return out, err
		}
		benchkit.Logf("ordering %s: %d events/s × %d %s over %d conversations per channel for %s", ordering, rate, c.webhooks,
			plural(c.webhooks, "webhook", "webhooks"), c.conversations, c.duration)
		r := ld.step(ctx, stepSpec{name: "ordering " + ordering, rate: rate, d: c.duration, drain: c.drain})
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = append(out, r)
		if err := q.truncate(ctx); err != nil {
			return out, err
		}
	}
	return out, set(store.OrderingNone)
}
