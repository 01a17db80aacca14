package dispatcher

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/store"
)

// Receiver health defaults (DESIGN §5b "Failing receivers"): after DefaultFailureThreshold
// failed attempts in a row across a webhook's deliveries, the webhook is failing; one probe goes
// out after DefaultProbeInterval, then at double the gap each time up to
// DefaultProbeIntervalMax; a webhook failing for DefaultDisableAfter is paused.
const (
	DefaultFailureThreshold = 10
	DefaultProbeInterval    = 30 * time.Second
	DefaultProbeIntervalMax = 5 * time.Minute
	DefaultDisableAfter     = 120 * time.Hour
)

// Health changes reported to HealthObserver.HealthChange.
const (
	HealthFailing   = store.HealthBecameFailing // the webhook became failing
	HealthRecovered = store.HealthRecovered     // a 2xx ended failing
	HealthPaused    = store.HealthPaused        // failing for DisableAfter: paused
)

// HealthObserver is told about every change of a webhook's health that this instance records
// (for metrics), when Config.Observer implements it too. It must not block.
type HealthObserver interface {
	HealthChange(change string)
}

// healthDefaults fills in and checks the health fields of cfg.
func (cfg *Config) healthDefaults() error {
	if cfg.FailureThreshold <= 0 {
		cfg.FailureThreshold = DefaultFailureThreshold
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.ProbeIntervalMax <= 0 {
		cfg.ProbeIntervalMax = max(DefaultProbeIntervalMax, cfg.ProbeInterval)
	}
	if cfg.ProbeIntervalMax < cfg.ProbeInterval {
		return fmt.Errorf("dispatcher: longest probe interval %v is shorter than the first %v", cfg.ProbeIntervalMax, cfg.ProbeInterval)
	}
	if cfg.DisableAfter <= 0 {
		cfg.DisableAfter = DefaultDisableAfter
	}
	return nil
}

// noteAttempt counts r in its webhook's failed attempts in a row on this instance. At
// FailureThreshold the webhook is held here (heldLocally) for a moment: the attempts that a fast
// refusing receiver would otherwise get before the writer has recorded the webhook as failing
// (after which the claims hold it) are handed back instead of made. A 2xx ends the hold.
func (d *Dispatcher) noteAttempt(r result) {
	if r.release || r.final {
		return
	}
	id := r.job.WebhookID
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.ok {
		delete(d.localFails, id)
		delete(d.holdUntil, id)
		return
	}
	if len(d.localFails) > 10000 {
		clear(d.localFails)
		clear(d.holdUntil)
	}
	if d.localFails[id]++; d.localFails[id] >= d.cfg.FailureThreshold {
		d.holdUntil[id] = d.now().Add(localHold(d.cfg))
	}
}

// localHold is how long a webhook that reached the threshold on this instance is held here
// before the store's state (failing, or not after all) governs it again.
func localHold(cfg Config) time.Duration { return min(cfg.ProbeInterval, time.Second) }

// heldLocally returns how much longer j's webhook is held on this instance (0: not held; a
// probe never is), at most localHold. Called with d.mu held.
//
// now may have been read before the hold was set (start reads it once per claim, before the
// lock): by a clock that jumps meanwhile (a Stub set ahead, or a clock set back), until - now
// would then be the jump and not what is left of the hold, and the delivery handed back with it
// would be due that long after the hand-back instead of within localHold.
func (d *Dispatcher) heldLocally(j job, now time.Time) time.Duration {
	until, ok := d.holdUntil[j.WebhookID]
	if !ok || j.Probe {
		return 0
	}
	if !now.Before(until) {
		delete(d.holdUntil, j.WebhookID)
		return 0
	}
	return min(until.Sub(now), localHold(d.cfg))
}

// healthPolicy is the store's form of the health settings.
func (d *Dispatcher) healthPolicy() store.HealthPolicy {
	return store.HealthPolicy{Threshold: d.cfg.FailureThreshold, ProbeInterval: d.cfg.ProbeInterval,
		ProbeIntervalMax: d.cfg.ProbeIntervalMax, DisableAfter: d.cfg.DisableAfter}
}

// probeEvery is how often the claiming loop looks for due probes: often enough that a probe
// goes out within a fraction of its interval, and no more often than the backstop poll.
func (d *Dispatcher) probeEvery() time.Duration {
	return max(min(d.cfg.PollInterval, d.cfg.ProbeInterval/2), 10*time.Millisecond)
}

// claimProbes claims and starts the due probes of failing webhooks (store.Queue.ClaimProbes),
// at most once per probeEvery. Called by the claiming goroutine only.
func (d *Dispatcher) claimProbes(ctx, attemptCtx context.Context) {
	now := time.Now()
	if now.Before(d.nextProbeCheck) {
		return
	}
	d.nextProbeCheck = now.Add(d.probeEvery())
	free := d.free()
	if free <= 0 {
		return
	}
	cctx, cancel := claimContext(ctx, d.claimTimeout())
	probes, err := d.queue.ClaimProbes(cctx, d.cfg.InstanceID, d.cfg.Lease, min(free, d.cfg.BatchSize))
	cancel()
	if ctx.Err() != nil {
		d.handBack(probes)
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("claiming probes of failing webhooks", zap.Error(err))
		}
		return
	}
	for _, p := range probes {
		d.log.Info("probing failing webhook", zap.Stringer("webhook_id", p.WebhookID), zap.Stringer("org_id", p.OrgID),
			zap.Stringer("delivery_id", p.ID), zap.Int("attempt", p.Attempt))
	}
	d.start(attemptCtx, probes, now)
}

// recordHealth sums up the attempts of batch per webhook, records them
// (store.Queue.RecordHealth), logs and reports each change, and returns the webhooks that are
// failing (or were paused for failing) after the batch: their failed attempts are held with the
// others, not failed for good. A probe's webhook counts as failing unless the batch ended it.
func (d *Dispatcher) recordHealth(batch []result) map[uuid.UUID]bool {
	sums := map[uuid.UUID]*store.HealthOutcome{}
	var order []uuid.UUID
	failing := map[uuid.UUID]bool{}
	for _, r := range batch {
		if r.release || r.final { // no attempt, or not the receiver's doing
			continue
		}
		s := sums[r.job.WebhookID]
		if s == nil {
			s = &store.HealthOutcome{WebhookID: r.job.WebhookID}
			sums[r.job.WebhookID] = s
			order = append(order, r.job.WebhookID)
		}
		if r.ok {
			s.Delivered, s.Failures = true, 0
		} else {
			s.Failures++
			s.ProbeFailed = s.ProbeFailed || r.job.Probe
		}
		if r.job.Probe {
			failing[r.job.WebhookID] = !r.ok
		}
	}
	if len(order) == 0 {
		return failing
	}
	outs := make([]store.HealthOutcome, len(order))
	for i, id := range order {
		outs[i] = *sums[id]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	states, err := d.queue.RecordHealth(ctx, d.healthPolicy(), outs)
	if err != nil {
		d.log.Warn("recording webhook health (this batch's attempts are not counted)", zap.Error(err))
		return failing
	}
	ho, _ := d.cfg.Observer.(HealthObserver)
	for _, s := range states {
		failing[s.WebhookID] = s.Failing
		fields := []zap.Field{zap.Stringer("webhook_id", s.WebhookID), zap.Stringer("org_id", s.OrgID),
			zap.Int("consecutive_failures", s.ConsecutiveFailures)}
		if s.FailingSince != nil {
			fields = append(fields, zap.Time("failing_since", *s.FailingSince))
		}
		if s.NextProbeAt != nil {
			fields = append(fields, zap.Time("next_probe_at", *s.NextProbeAt), zap.Duration("probe_interval", s.ProbeInterval))
		}
		for _, c := range s.Changes {
			switch c {
			case HealthFailing:
				d.log.Warn("webhook failing: its deliveries are held, one probe goes out per probe interval", fields...)
			case HealthRecovered:
				d.log.Info("webhook recovered: a probe or attempt succeeded, its held deliveries flow again", fields...)
				signal(d.wake)
			case HealthPaused:
				d.log.Warn("webhook paused: failing for longer than disable_after (resume it to deliver again)",
					append(fields, zap.Duration("disable_after", d.cfg.DisableAfter))...)
			}
			if ho != nil {
				ho.HealthChange(c)
			}
		}
		if len(s.Changes) == 0 && sums[s.WebhookID].ProbeFailed && s.Failing {
			d.log.Info("probe of failing webhook failed", fields...)
		}
	}
	return failing
}

// ProbesWithin returns the most probes a failing webhook gets within elapsed of becoming
// failing, with the first probe first after it and each gap doubling up to longest: the bound
// on the attempts a down receiver sees once failing (counting the probe due at the edge).
func ProbesWithin(first, longest, elapsed time.Duration) int {
	n, at, gap := 1, first, first
	for at <= elapsed && gap > 0 {
		n++
		gap = min(2*gap, longest)
		at += gap
	}
	return n
}

// AttemptsWhileDown bounds the attempts a receiver that fails every one gets, within elapsed
// of its webhook becoming failing: threshold failures, the attempts in flight when the
// threshold was reached and those started before its outcome was recorded (at most
// perWebhook each, per instance), then the probes (ProbesWithin).
func AttemptsWhileDown(threshold, perWebhook int, first, longest, elapsed time.Duration) int {
	return threshold + 2*perWebhook + ProbesWithin(first, longest, elapsed)
}
