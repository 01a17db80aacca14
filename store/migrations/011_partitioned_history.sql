-- Delivery at scale: history partitioned by day, live work in a queue of its own.
--
-- events, deliveries and delivery_attempts become declaratively partitioned by day (UTC): the
-- retention drops whole partitions instead of deleting rows in batches (store/partitions.go
-- creates the partitions ahead, under an advisory lock, on any instance). deliveries is now the
-- delivery log only; its rows change when an attempt is recorded (a HOT update: no indexed
-- column changes, fillfactor 80 on every partition).
--
-- delivery_queue holds the live deliveries — pending, in flight, or held for a paused webhook —
-- and nothing else: a row is deleted when its delivery is delivered or failed, so the queue's
-- size is the backlog, not the history. Claims read it per webhook (store/queue.go): one
-- tenant's backlog or paused webhook is never scanned by a claim for another.
--
-- Upstream duplicates: a unique index on (channel_id, dedupe_key) in every events partition
-- (a unique index of the partitioned table would have to include created_at), plus a look at
-- the previous days' partitions at intake (StoreEvents), for the 7 days DESIGN §5 asks.
--
-- Existing rows are copied into one partition per table covering everything up to the last day
-- that has rows (named after that day, as the app names a daily partition; the app creates days
-- after it only); it is dropped like any other once the retention has passed its upper bound.

ALTER TABLE events RENAME TO events_old;
ALTER TABLE deliveries RENAME TO deliveries_old;
ALTER TABLE delivery_attempts RENAME TO delivery_attempts_old;

CREATE TABLE events (
	id          uuid NOT NULL,
	org_id      uuid NOT NULL,
	-- no foreign key: an event outlives the channel it came from
	channel_id  uuid NOT NULL,
	type        text NOT NULL CHECK (type IN ('messages', 'message_status')),
	-- identifies the upstream item (message id, or status id + state) to drop upstream re-sends
	dedupe_key  text NOT NULL,
	-- the JSON delivered to webhooks, as sent (migration 008)
	payload     bytea NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (created_at);

-- A delivery's created_at is its event's: both rows live in the same day's partitions.
CREATE TABLE deliveries (
	id               uuid NOT NULL,
	event_id         uuid NOT NULL,
	webhook_id       uuid NOT NULL,
	-- pending: live (its state is in delivery_queue); delivered and failed are final
	status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
	attempts         int NOT NULL DEFAULT 0,
	last_status_code int,
	last_error       text,
	created_at       timestamptz NOT NULL DEFAULT now(),
	updated_at       timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (created_at);

CREATE TABLE delivery_attempts (
	id            uuid NOT NULL,
	delivery_id   uuid NOT NULL,
	attempt       int NOT NULL,
	started_at    timestamptz NOT NULL,
	duration_ms   int NOT NULL,
	status_code   int,
	error         text,
	response_body text
) PARTITION BY RANGE (started_at);

DO $$
DECLARE
	last date := (SELECT max(x)::date FROM (
		SELECT max(created_at AT TIME ZONE 'UTC') AS x FROM events_old
		UNION ALL SELECT max(started_at AT TIME ZONE 'UTC') FROM delivery_attempts_old) m);
	day text := to_char(last, 'YYYYMMDD');
	upper text := quote_literal((last + 1)::text || ' 00:00:00+00');
BEGIN
	IF last IS NULL THEN
		RETURN; -- nothing to copy: the app creates the daily partitions
	END IF;
	EXECUTE format('CREATE TABLE events_p%s PARTITION OF events FOR VALUES FROM (MINVALUE) TO (%s)', day, upper);
	EXECUTE format('CREATE UNIQUE INDEX events_p%s_dedupe ON events_p%s (channel_id, dedupe_key)', day, day);
	EXECUTE format('CREATE TABLE deliveries_p%s PARTITION OF deliveries FOR VALUES FROM (MINVALUE) TO (%s) WITH (fillfactor = 80)', day, upper);
	EXECUTE format('CREATE TABLE delivery_attempts_p%s PARTITION OF delivery_attempts FOR VALUES FROM (MINVALUE) TO (%s)', day, upper);
END $$;

CREATE TABLE delivery_queue (
	delivery_id     uuid PRIMARY KEY,
	-- the delivery's (and its event's) created_at: the partition key that finds both rows
	created_at      timestamptz NOT NULL,
	event_id        uuid NOT NULL,
	webhook_id      uuid NOT NULL,
	-- held: the webhook is paused (flipped on pause and resume; the schedule waits)
	status          text NOT NULL CHECK (status IN ('pending', 'in_flight', 'held')),
	-- attempts recorded so far (the next attempt is attempts + 1)
	attempts        int NOT NULL DEFAULT 0,
	next_attempt_at timestamptz NOT NULL DEFAULT now(),
	-- incremented by every claim; with locked_by it fences a claim's outcome (migration 010)
	claim_seq       int NOT NULL DEFAULT 0,
	locked_by       text,
	locked_until    timestamptz
);
-- Claims walk the webhooks with pending rows (a skip scan: one step per webhook, whatever its
-- backlog) and take each one's due rows in due order.
CREATE INDEX delivery_queue_due ON delivery_queue (webhook_id, next_attempt_at) WHERE status = 'pending';
CREATE INDEX delivery_queue_lease ON delivery_queue (locked_until) WHERE status = 'in_flight';
CREATE INDEX delivery_queue_held ON delivery_queue (webhook_id, created_at) WHERE status = 'held';

INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at)
SELECT id, org_id, channel_id, type, dedupe_key, payload, created_at FROM events_old;

INSERT INTO deliveries (id, event_id, webhook_id, status, attempts, last_status_code, last_error, created_at, updated_at)
SELECT d.id, d.event_id, d.webhook_id,
       CASE WHEN d.status IN ('delivered', 'failed') THEN d.status WHEN d.status = 'cancelled' THEN 'failed' ELSE 'pending' END,
       d.attempts, d.last_status_code, d.last_error, e.created_at, d.updated_at
FROM deliveries_old d JOIN events_old e ON e.id = d.event_id;

INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status, attempts, next_attempt_at, claim_seq, locked_by, locked_until)
SELECT d.id, e.created_at, d.event_id, d.webhook_id,
       CASE WHEN d.status = 'in_flight' THEN 'in_flight' WHEN w.status = 'paused' THEN 'held' ELSE 'pending' END,
       d.attempts, d.next_attempt_at, d.claim_seq, d.locked_by, d.locked_until
FROM deliveries_old d JOIN events_old e ON e.id = d.event_id JOIN webhooks w ON w.id = d.webhook_id
WHERE d.status IN ('pending', 'in_flight');

INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error, response_body)
SELECT id, delivery_id, attempt, started_at, duration_ms, status_code, error, response_body FROM delivery_attempts_old;

DROP TABLE delivery_attempts_old, deliveries_old, events_old;

-- Indexes after the copy (their names were the old tables').
ALTER TABLE events ADD PRIMARY KEY (id, created_at);
ALTER TABLE deliveries ADD PRIMARY KEY (id, created_at);
CREATE INDEX deliveries_webhook ON deliveries (webhook_id, created_at, id);
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id, attempt);
