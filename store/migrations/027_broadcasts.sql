-- Broadcasts: paced template sends to a list of recipients (DESIGN §5c "Broadcasts",
-- store/broadcasts.go).
--
-- * broadcasts: one row per broadcast. Its next_send_at is the pace gate shared by every
--   instance: a claim locks the row (FOR UPDATE SKIP LOCKED) and moves next_send_at on by
--   60 s / rate_per_minute, so the row lock serialises the sends of a broadcast across instances
--   and the pace holds however many senders there are. channel_id has no foreign key (like
--   usage_daily's): a deleted channel's broadcasts stay readable, cancelled by DeleteChannel in
--   its transaction, rather than cascading away under their readers.
-- * broadcast_recipients: one row per recipient, its seq its position in the list (the caller
--   deduplicates, keeping the first). A recipient is sent at most once: the claim writes it
--   'sending' with a lease and commits before the upstream call; a lease that ends without an
--   outcome leaves it 'unknown' (the send may have happened), never sent again.
-- * messages.broadcast_id: the broadcast a message was sent for, written by the outcome of an
--   accepted send. The recipients' statuses after acceptance are the messages' statuses (the
--   intake moves them as for any message), so the counts read them from messages by this
--   column, and the intake's hot path writes nothing for broadcasts.
CREATE TABLE broadcasts (
	-- UUIDv7 like every id
	id              uuid PRIMARY KEY,
	org_id          uuid NOT NULL,
	-- no foreign key: a deleted channel's broadcasts outlive it, cancelled (see above)
	channel_id      uuid NOT NULL,
	name            text NOT NULL,
	-- {"name", "language": {"code"}, "components"?} as the caller gave it
	template        jsonb NOT NULL,
	status          text NOT NULL
	                CHECK (status IN ('scheduled', 'sending', 'paused', 'completed', 'cancelled')),
	-- why a paused broadcast is paused (NULL unless paused)
	paused_reason   text CHECK (paused_reason IN ('operator', 'upstream_disconnected')),
	created_at      timestamptz NOT NULL DEFAULT now(),
	start_at        timestamptz NOT NULL,
	rate_per_minute int NOT NULL CHECK (rate_per_minute > 0),
	-- the pace gate: the earliest time of the broadcast's next send (start_at until it starts)
	next_send_at    timestamptz NOT NULL,
	-- the number of recipients, fixed at creation: the counts' total without a count
	total           int NOT NULL,
	-- when it completed or was cancelled
	finished_at     timestamptz
);
-- A channel's list, newest first, read in order up to its limit.
CREATE INDEX broadcasts_channel ON broadcasts (channel_id, created_at DESC, id DESC);
-- The claim's probe and the senders' wake-up time: only the broadcasts that may send are in it,
-- so the finished ones (nearly all, over time) cost the claim nothing.
CREATE INDEX broadcasts_due ON broadcasts (next_send_at) WHERE status IN ('scheduled', 'sending');

CREATE TABLE broadcast_recipients (
	-- the recipients go with their broadcast (a broadcast is deleted only with its org)
	broadcast_id     uuid NOT NULL REFERENCES broadcasts (id) ON DELETE CASCADE,
	-- the position in the list, from 1: the order of the sends and the recipients' page cursor
	seq              int NOT NULL,
	-- the number's digits (the caller normalises them, as messages.recipient holds them)
	wa_to            text NOT NULL,
	-- the recipient's own template components, which replace the template's (NULL: none)
	components       jsonb,
	status           text NOT NULL
	                 CHECK (status IN ('queued', 'sending', 'accepted', 'failed', 'unknown', 'cancelled')),
	-- sends made (a send the relay provably did not make is not counted)
	attempts         smallint NOT NULL DEFAULT 0,
	-- when a queued recipient may be sent (start_at, or the retry's backoff)
	next_attempt_at  timestamptz NOT NULL,
	-- the lease of a 'sending' row: past it without an outcome, the row becomes 'unknown'
	locked_until     timestamptz,
	-- the upstream's message id of an accepted send
	wamid            text,
	-- the last upstream error (a failed recipient's reason)
	error_code       int,
	error_title      text,
	-- retries stop 24 h after the first attempt
	first_attempt_at timestamptz,
	PRIMARY KEY (broadcast_id, seq)
);
-- The claim: a broadcast's first due queued recipient, in list order among equals.
CREATE INDEX broadcast_recipients_due ON broadcast_recipients (broadcast_id, next_attempt_at, seq) WHERE status = 'queued';
-- The lease sweep: only the rows in flight.
CREATE INDEX broadcast_recipients_lease ON broadcast_recipients (locked_until) WHERE status = 'sending';
-- The counts (GROUP BY status of one broadcast, an index-only scan of the statuses other than
-- accepted, which are few once a broadcast has run) and the recipients' page filtered by a
-- stored status, read in seq order up to its limit.
CREATE INDEX broadcast_recipients_status ON broadcast_recipients (broadcast_id, status, seq);
-- A wamid is one send's: an outcome cannot be recorded for two recipients.
CREATE UNIQUE INDEX broadcast_recipients_wamid ON broadcast_recipients (wamid) WHERE wamid IS NOT NULL;

-- Nullable without default: no rewrite of the table. Only the sends of broadcasts have one, so
-- the partial index holds only them: the counts of a broadcast by status are read from it, and
-- the rest of messages costs it nothing.
ALTER TABLE messages ADD COLUMN broadcast_id uuid;
CREATE INDEX messages_broadcast ON messages (broadcast_id, status) WHERE broadcast_id IS NOT NULL;
