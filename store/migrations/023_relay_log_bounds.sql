-- The relay log within bounds. Until now every refusal of a send (a 429 of the
-- rate limit, an inactive channel, a bad body, a key conflict) was a relay_log row of its own,
-- with the caller's key and "to": a refusal costs the caller nothing against its limit, so one
-- channel token could write rows as fast as it could call (265,427 rows in 25 s; with a 255-byte
-- key and a 256-byte "to", 106.7 MB in 20 s), and the reads that walked the channel's log grew
-- with it (the dashboard's per-minute chart counted 24 h of rows; the list's unreported sends
-- and the search by key filtered the channel's rows in time order). Now:
--
-- * relay_counts: calls counted, not written one by one — every refusal, and the calls beyond
--   the per-channel bound of rows a second (relaylog.Config.PerChannel): one row per channel,
--   second, outcome and status, with how many calls it stands for, added to by each batch of
--   each instance (an upsert on the primary key).
-- * relay_minutes: every call on the send path counted per channel and minute by the chart's
--   classes; the dashboard's chart reads it (at most 1,440 rows a day per channel).
-- * relay_log keeps one row per call that went upstream or was replayed (a send, its wamid, its
--   latency), within the per-channel bound. Its channel index, (channel_id, at) over every row,
--   gives way to two partial ones that hold what the reads look for: the sends that have a wamid
--   and are not replays (a channel's unreported sends, in time order) and the keyed ones (the
--   dashboard's search by key).
--
-- Both new tables are partitioned by UTC day like relay_log (store/partitions.go creates the days
-- ahead, and the retention drops them).
CREATE TABLE relay_counts (
	-- the calls' second (UTC, truncated)
	at         timestamptz NOT NULL,
	org_id     uuid NOT NULL,
	channel_id uuid NOT NULL,
	-- relay.Outcome of the calls, and the status answered
	outcome    text NOT NULL,
	status     int NOT NULL,
	calls      int NOT NULL,
	PRIMARY KEY (channel_id, at, outcome, status)
) PARTITION BY RANGE (at);

CREATE TABLE relay_minutes (
	-- the minute (UTC, truncated)
	minute         timestamptz NOT NULL,
	org_id         uuid NOT NULL,
	channel_id     uuid NOT NULL,
	-- store.SendMinute's classes
	ok             int NOT NULL DEFAULT 0,
	upstream_error int NOT NULL DEFAULT 0,
	rate_limited   int NOT NULL DEFAULT 0,
	refused        int NOT NULL DEFAULT 0,
	PRIMARY KEY (channel_id, minute)
) PARTITION BY RANGE (minute);

-- The chart of the last day, counted from the rows relay_log has of it, in a partition without a
-- lower bound up to tomorrow (as migration 011 did for the rows it copied): the app creates the
-- days after it.
DO $$
DECLARE
	today date := (now() AT TIME ZONE 'UTC')::date;
	since timestamptz := date_trunc('minute', now()) - interval '1 day';
	upper timestamptz := ((now() AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
	IF NOT EXISTS (SELECT 1 FROM relay_log WHERE at >= since AND at < upper) THEN
		RETURN; -- nothing to count: the app creates the daily partitions
	END IF;
	EXECUTE format('CREATE TABLE relay_minutes_p%s PARTITION OF relay_minutes FOR VALUES FROM (MINVALUE) TO (%L)',
		to_char(today, 'YYYYMMDD'), upper);
	INSERT INTO relay_minutes (minute, org_id, channel_id, ok, upstream_error, rate_limited, refused)
	SELECT date_trunc('minute', at), org_id, channel_id,
	       count(*) FILTER (WHERE status <> 429 AND (outcome = 'ok' OR outcome = 'replayed' AND status < 400)),
	       count(*) FILTER (WHERE status <> 429 AND (outcome IN ('upstream_4xx', 'upstream_5xx', 'upstream_error')
	                                                 OR outcome = 'replayed' AND status >= 400)),
	       count(*) FILTER (WHERE status = 429),
	       count(*) FILTER (WHERE status <> 429 AND outcome NOT IN ('ok', 'replayed', 'upstream_4xx', 'upstream_5xx', 'upstream_error'))
	FROM relay_log
	WHERE at >= since AND at < upper
	GROUP BY 1, 2, 3
	ON CONFLICT (channel_id, minute) DO NOTHING; -- (a channel's rows are one org's)
END $$;

CREATE INDEX relay_log_channel_sends ON relay_log (channel_id, at) WHERE wamid IS NOT NULL AND NOT replayed;
CREATE INDEX relay_log_channel_key ON relay_log (channel_id, idempotency_key, at)
	WHERE idempotency_key IS NOT NULL AND wamid IS NOT NULL;
DROP INDEX relay_log_channel;
