package store

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.uber.org/zap"
)

// RetentionPolicy is how long the history is kept and how long a paused webhook's deliveries
// are held (the `delivery` options retention and max_hold). Zero fields take their defaults.
type RetentionPolicy struct {
	// Retention is how long events, their deliveries and attempts, the relay log and the
	// messages are kept: whole days are dropped (daily partitions) once every delivery of the
	// day has finished; messages are deleted by their creation time. At least
	// MinRetention, because the events are also the record of upstream items already seen.
	// Default (zero): 720h (30 days).
	Retention time.Duration
	// MaxHold is how long a paused webhook's deliveries are held: older ones fail, with the
	// reason in the delivery log. Must be shorter than Retention. Default (zero): 168h, or a day
	// less than Retention if that is shorter, so that a failed held delivery stays in the log a
	// while.
	MaxHold time.Duration
}

// Defaults of RetentionPolicy (see its fields).
const (
	defaultRetention = 720 * time.Hour
	defaultMaxHold   = 7 * 24 * time.Hour
)

// MinRetention is the shortest RetentionPolicy.Retention: the upstream re-sends an item for up
// to 7 days, and the stored events are how a re-send is recognised (DedupeWindow).
const MinRetention = DedupeWindow

// MediaRetention is how long a media id stays in its channel's relay scope: the upstream keeps
// media for 30 days.
const MediaRetention = 30 * 24 * time.Hour

// MaintenanceInterval is how often an instance should call Maintain.
const MaintenanceInterval = 10 * time.Minute

// Effective returns the retention and hold limit p stands for, defaults applied (see the
// fields of RetentionPolicy). hold is 0 when MaxHold is no shorter than the retention (Check
// reports it).
func (p RetentionPolicy) Effective() (retention, hold time.Duration) {
	retention, hold = defaultRetention, defaultMaxHold
	if p.Retention > 0 {
		retention = p.Retention
	}
	if p.MaxHold > 0 {
		hold = p.MaxHold
	} else if hold > retention-24*time.Hour {
		hold = retention - 24*time.Hour
	}
	if hold >= retention {
		return retention, 0
	}
	return retention, hold
}

// Check reports a policy Maintain cannot follow: a retention shorter than MinRetention, or a
// hold limit no shorter than the retention. The errors name the options (retention, max_hold).
func (p RetentionPolicy) Check() error {
	if p.Retention > 0 && p.Retention < MinRetention {
		return errors.New("retention must be at least 168h")
	}
	if _, hold := p.Effective(); hold <= 0 {
		return errors.New("max_hold must be shorter than retention")
	}
	return nil
}

// Maintain runs one round of history and queue maintenance under policy: partitions created
// ahead; paused webhooks' deliveries written pending during the pause held; held deliveries
// past the hold limit failed; ordered conversations left waiting behind
// no head promoted; deliveries of deleted webhooks removed (in
// batches) and queue rows of webhooks that raced their deletion too;
// days past the retention dropped (the relay log's too) and messages and health changes created
// before it deleted; media ids the upstream has forgotten removed from the relay scope; usage
// deltas folded into the daily rollup. Each step's failure is logged and does not stop the others. Call it at start and then
// every MaintenanceInterval; any number of instances may run it at once (partition changes take
// an advisory lock, the rest is idempotent). Its days and limits are counted from the store's
// clock (SetClock). A nil logger logs nothing.
func (s *Store) Maintain(ctx context.Context, policy RetentionPolicy, logger *zap.Logger) {
	if logger == nil {
		logger = zap.NewNop()
	}
	retention, hold := policy.Effective()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	now := s.now()
	if err := s.EnsurePartitions(ctx, now.AddDate(0, 0, -1), now.AddDate(0, 0, PartitionsAhead)); err != nil {
		logger.Error("creating history partitions failed; inbound webhooks fail once today's is missing", zap.Error(err))
	}
	if n, err := s.HoldPausedPending(ctx); err != nil {
		logger.Warn("holding pending deliveries of paused webhooks failed", zap.Error(err))
	} else if n > 0 {
		logger.Info("held deliveries of paused webhooks written pending while they were being paused", zap.Int("deliveries", n))
	}
	reason := "held longer than " + strings.TrimSuffix(hold.String(), "0m0s") + " while the webhook was paused (delivery max_hold)"
	if n, err := s.FailHeld(ctx, now.Add(-hold), reason); err != nil {
		logger.Warn("failing held deliveries past max_hold failed", zap.Error(err))
	} else if n > 0 {
		logger.Warn("held deliveries of paused webhooks failed: past max_hold", zap.Int("deliveries", n), zap.Duration("max_hold", hold))
	}
	if n, err := s.PromoteStranded(ctx); err != nil {
		logger.Warn("promoting ordered deliveries left waiting failed", zap.Error(err))
	} else if n > 0 {
		logger.Warn("ordered conversations had deliveries waiting behind no head (an older release ended their heads): promoted", zap.Int("conversations", n))
	}
	if n, err := s.SweepDeletedWebhooks(ctx); err != nil {
		logger.Warn("removing deliveries of deleted webhooks failed", zap.Error(err))
	} else if n > 0 {
		logger.Info("removed deliveries of deleted webhooks", zap.Int("deliveries", n))
	}
	if n, err := s.DropOrphanedQueue(ctx); err != nil {
		logger.Warn("removing queued deliveries of deleted webhooks failed", zap.Error(err))
	} else if n > 0 {
		logger.Info("removed queued deliveries of deleted webhooks", zap.Int("deliveries", n))
	}
	dropped, kept, err := s.DropPartitions(ctx, now.Add(-retention))
	if err != nil {
		logger.Warn("retention: dropping history partitions failed", zap.Error(err))
	}
	if len(dropped) > 0 {
		logger.Info("retention: history partitions dropped", zap.Strings("partitions", dropped), zap.Duration("retention", retention))
	}
	if len(kept) > 0 {
		logger.Info("retention: days kept past the retention for deliveries still live", zap.Int("days", len(kept)))
	}
	if n, err := s.PruneMessages(ctx, now.Add(-retention)); err != nil {
		logger.Warn("retention: deleting old messages failed", zap.Error(err))
	} else if n > 0 {
		logger.Info("retention: messages deleted", zap.Int64("messages", n), zap.Duration("retention", retention))
	}
	if n, err := s.PruneHealthChanges(ctx, now.Add(-retention)); err != nil {
		logger.Warn("retention: deleting old health changes failed", zap.Error(err))
	} else if n > 0 {
		logger.Info("retention: health changes deleted", zap.Int64("changes", n), zap.Duration("retention", retention))
	}
	if err := s.letGoPendingMessages(ctx, now.Add(-RelayPendingFor)); err != nil { // (with the relay log off no writer settles them)
		logger.Warn("letting go of messages waiting for relay calls failed", zap.Error(err))
	}
	if _, err := s.FoldUsage(ctx); err != nil { // (store/usage.go)
		logger.Warn("folding usage deltas into the daily rollup failed", zap.Error(err))
	}
	if n, err := s.PruneMediaObjects(ctx, now.Add(-MediaRetention)); err != nil {
		logger.Warn("media scope clean-up failed", zap.Error(err))
	} else if n > 0 {
		logger.Info("media scope clean-up", zap.Int64("media_ids_forgotten", n))
	}
}
