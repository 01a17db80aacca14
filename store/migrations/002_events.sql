-- Events and their deliveries. The deliveries table is both the delivery queue and the delivery
-- log; delivery_attempts keeps one row per HTTP attempt. (Filled by the inbound intake and the
-- dispatcher.)

CREATE TABLE events (
	id              uuid PRIMARY KEY,
	org_id          uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	-- no foreign key: an event outlives the channel it came from
	channel_id      uuid NOT NULL,
	type            text NOT NULL CHECK (type IN ('messages', 'message_status')),
	-- identifies the upstream item (message id, or status id + state) to drop upstream re-sends
	dedupe_key      text NOT NULL,
	payload         jsonb NOT NULL,
	created_at      timestamptz NOT NULL DEFAULT now(),
	UNIQUE (channel_id, dedupe_key)
);
CREATE INDEX events_created ON events (created_at);

CREATE TABLE deliveries (
	id               uuid PRIMARY KEY,
	event_id         uuid NOT NULL REFERENCES events (id) ON DELETE CASCADE,
	webhook_id       uuid NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
	status           text NOT NULL DEFAULT 'pending'
	                 CHECK (status IN ('pending', 'in_flight', 'delivered', 'failed', 'cancelled')),
	attempts         int NOT NULL DEFAULT 0,
	next_attempt_at  timestamptz NOT NULL DEFAULT now(),
	locked_by        text,
	locked_until     timestamptz,
	last_status_code int,
	last_error       text,
	created_at       timestamptz NOT NULL DEFAULT now(),
	updated_at       timestamptz NOT NULL DEFAULT now(),
	UNIQUE (event_id, webhook_id)
);
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status IN ('pending', 'in_flight');
CREATE INDEX deliveries_webhook ON deliveries (webhook_id, created_at, id);

CREATE TABLE delivery_attempts (
	id               uuid PRIMARY KEY,
	delivery_id      uuid NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
	attempt          int NOT NULL,
	started_at       timestamptz NOT NULL,
	duration_ms      int NOT NULL,
	status_code      int,
	error            text,
	response_body    text
);
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id, attempt);
