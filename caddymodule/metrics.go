package caddymodule

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wabarelay/wabarelay/store"
)

// metrics are wabarelay's collectors. They are created once per process and registered into
// every config's registry (Caddy makes a new registry per config load), keeping their values
// across reloads. No label carries a token or a channel id.
type metrics struct {
	relayRequests   *prometheus.CounterVec
	rateLimited     prometheus.Counter
	replays         prometheus.Counter
	upstreamLatency prometheus.Histogram
	mediaBytes      *prometheus.CounterVec
	mediaFirstByte  prometheus.Histogram
	relayLogWritten prometheus.Counter
	relayLogDropped prometheus.Counter

	inboundEvents     *prometheus.CounterVec
	inboundDuplicates prometheus.Counter
	inboundUnknown    prometheus.Counter
	inboundRejected   prometheus.Counter
	inboundMalformed  prometheus.Counter
	inboundOverflow   prometheus.Counter

	deliveries     *prometheus.CounterVec
	attemptLatency prometheus.Histogram
	healthChanges  *prometheus.CounterVec
	replayBacklog  prometheus.Counter

	channelsByQuality *prometheus.GaugeVec
}

var (
	metricsOnce sync.Once
	theMetrics  *metrics
)

func registerMetrics(reg *prometheus.Registry) *metrics {
	metricsOnce.Do(func() {
		const ns, sub = "caddy", "wabarelay"
		theMetrics = &metrics{
			relayRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_requests_total", Help: "Relay requests by outcome."}, []string{"outcome"}),
			rateLimited: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_rate_limited_total", Help: "Relay requests refused by the per-channel rate limit."}),
			replays: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_idempotent_replays_total", Help: "Sends answered from a stored response (idempotency_key)."}),
			upstreamLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_upstream_duration_seconds", Help: "Time from forwarding a relay call to the upstream's answer.",
				Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}),
			mediaBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_media_bytes_total", Help: "Media bytes relayed, by direction (download, upload)."}, []string{"direction"}),
			mediaFirstByte: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_media_first_byte_seconds", Help: "Time from a media download request to the media host's answer.",
				Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
			relayLogWritten: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_log_written_total", Help: "Relay calls written to the relay log."}),
			relayLogDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "relay_log_dropped_total", Help: "Relay calls dropped from the relay log: its buffer was full or their batch failed."}),
			inboundEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "inbound_events_total", Help: "Events stored from upstream webhooks, by type."}, []string{"type"}),
			inboundDuplicates: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "inbound_duplicates_total", Help: "Upstream webhook items dropped as re-sends of stored ones."}),
			inboundUnknown: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "inbound_unknown_number_total", Help: "Upstream webhook items for phone numbers, and health changes for business accounts, no channel has (dropped)."}),
			inboundRejected: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "inbound_rejected_total", Help: "Upstream webhook posts refused for a bad signature."}),
			inboundMalformed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "inbound_malformed_total", Help: "Signed upstream webhook posts that are not a WhatsApp payload (answered 200, dropped)."}),
			inboundOverflow: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "inbound_overflow_total", Help: "Upstream webhook posts stored outside the inbound handler's concurrency limit after waiting for a slot (the instance is overloaded)."}),
			deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "delivery_attempts_total", Help: "Webhook delivery attempts by outcome (delivered, retrying, failed)."}, []string{"outcome"}),
			attemptLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
				Name: "delivery_attempt_duration_seconds", Help: "Duration of webhook delivery attempts.",
				Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
			healthChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "webhook_health_changes_total", Help: "Webhook health changes by kind: failing (receiver failing, deliveries held), recovered (a 2xx ended it), paused (failing for disable_after)."}, []string{"change"}),
			replayBacklog: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "replay_backlog_refused_total", Help: "Replays refused because the webhook's queued deliveries would exceed the replay backlog limit (200,000)."}),
			channelsByQuality: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
				Name: "channels_by_quality", Help: "Active channels by the quality rating the upstream gives their number (refreshed after each round of reads and every minute; unknown ratings not counted)."}, []string{"quality_rating"}),
		}
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{theMetrics.relayRequests, theMetrics.rateLimited, theMetrics.replays, theMetrics.upstreamLatency,
			theMetrics.mediaBytes, theMetrics.mediaFirstByte, theMetrics.relayLogWritten, theMetrics.relayLogDropped,
			theMetrics.inboundEvents, theMetrics.inboundDuplicates, theMetrics.inboundUnknown, theMetrics.inboundRejected,
			theMetrics.inboundMalformed, theMetrics.inboundOverflow,
			theMetrics.deliveries, theMetrics.attemptLatency,
			theMetrics.healthChanges, theMetrics.replayBacklog, theMetrics.channelsByQuality} {
			var are prometheus.AlreadyRegisteredError
			if err := reg.Register(c); err != nil && !errors.As(err, &are) {
				panic(err)
			}
		}
	}
	return theMetrics
}

// queueCollector reports the delivery queue at scrape time: deliveries due now (pending and due,
// or in flight with an expired lease) and the age of the oldest due one. It is registered per
// config, with that config's pool. It reads the queue shared by all instances, so an instance
// that runs no dispatcher (delivery { workers 0 }) reports it too.
type queueCollector struct {
	queue      *store.Queue
	depth, age *prometheus.Desc
}

func newQueueCollector(pool *pgxpool.Pool) queueCollector {
	return queueCollector{queue: store.NewQueue(pool),
		depth: prometheus.NewDesc("caddy_wabarelay_delivery_queue_depth", "Deliveries due now (active webhooks).", nil, nil),
		age:   prometheus.NewDesc("caddy_wabarelay_delivery_oldest_due_seconds", "Age of the oldest delivery due now.", nil, nil)}
}

// Describe implements prometheus.Collector.
func (c queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.depth; ch <- c.age }

// Collect implements prometheus.Collector. A database that does not answer in 2 s yields no
// samples rather than a stalled scrape.
func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, age, err := c.queue.Depth(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
}
