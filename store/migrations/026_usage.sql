-- Usage by pricing category (DESIGN §5c "Usage by pricing category"): every outgoing message
-- counted once per UTC day of its first priced status, channel, category, pricing type and
-- recipient country, its latest pricing winning (store/usage.go).
--
-- * messages gains the message's current bucket: the pricing it is counted under (NULL: never
--   priced). Nullable without default: no rewrite of the table.
-- * usage_deltas: an append-only log of signed changes (+1 for the bucket a message enters, -1
--   for the one it leaves; billable likewise), written by the intake transaction that priced the
--   message, one statement per batch: no row is updated by two intakes at once, so no hot row.
-- * usage_daily: the rollup the deltas are folded into by the maintenance loop (one statement,
--   FoldUsage). It has no foreign key and is not touched by the retention: what a month cost
--   outlives its messages, its events and its channels.
--
-- The text columns of the buckets sort bytewise (COLLATE "C"), the order of the API's rows, so
-- that the rollup's primary key reads an org's days already in that order.
ALTER TABLE messages
	ADD COLUMN usage_day      date,
	ADD COLUMN usage_category text COLLATE "C",
	ADD COLUMN usage_type     text COLLATE "C",
	ADD COLUMN usage_country  text COLLATE "C",
	ADD COLUMN usage_billable boolean,
	-- the rank (store.StatusRank) of the status whose pricing the message is counted under
	ADD COLUMN usage_rank     smallint;

CREATE TABLE usage_deltas (
	seq          bigint GENERATED ALWAYS AS IDENTITY,
	org_id       uuid NOT NULL,
	day          date NOT NULL,
	channel_id   uuid NOT NULL,
	category     text COLLATE "C" NOT NULL,
	pricing_type text COLLATE "C" NOT NULL,
	country      text COLLATE "C" NOT NULL,
	messages     int NOT NULL,
	billable     int NOT NULL
);
CREATE INDEX usage_deltas_org_day ON usage_deltas (org_id, day);

CREATE TABLE usage_daily (
	org_id       uuid NOT NULL,
	day          date NOT NULL,
	-- no foreign key: the usage outlives the channel
	channel_id   uuid NOT NULL,
	category     text COLLATE "C" NOT NULL,
	pricing_type text COLLATE "C" NOT NULL,
	country      text COLLATE "C" NOT NULL,
	-- int: a bucket is one channel's day, at most 86.4 million messages (1,000 a second, the
	-- upstream's highest throughput); sum(int) is a bigint, cheaper than sum(bigint)'s numeric
	messages     int NOT NULL,
	billable     int NOT NULL,
	-- the counts included: a window is read by an index-only scan, in the answer's order
	PRIMARY KEY (org_id, day, channel_id, category, pricing_type, country) INCLUDE (messages, billable)
);
