-- Failing receivers (DESIGN §5b): a webhook's health lives on its row, so that it
-- survives a restart and every instance sees it (store/health.go).
--
-- consecutive_failures counts failed attempts across the webhook's deliveries since its last
-- 2xx. At delivery { failure_threshold } the webhook is failing: failing_since is set, and the
-- claims (store/queue.go) take none of its deliveries except one probe when next_probe_at has
-- come (ClaimProbes); probe_interval_ms is the current gap between probes (doubling up to the
-- dispatcher's maximum). The first 2xx clears all three. paused_reason says why a webhook is
-- paused: 'failing' when it was paused automatically after delivery { disable_after }, null
-- for a pause by its owner (and whenever it is active).
ALTER TABLE webhooks
	ADD COLUMN consecutive_failures int NOT NULL DEFAULT 0,
	ADD COLUMN failing_since timestamptz,
	ADD COLUMN next_probe_at timestamptz,
	ADD COLUMN probe_interval_ms bigint,
	ADD COLUMN paused_reason text CHECK (paused_reason IN ('failing'));

-- The probe claim reads the failing webhooks whose probe is due.
CREATE INDEX webhooks_probe_due ON webhooks (next_probe_at) WHERE failing_since IS NOT NULL;
