-- Intake and dispatcher hot path.
--
-- Foreign keys to hot parent rows cost every intake a FOR KEY SHARE lock on the same org and
-- webhook rows, which concurrent intakes then share through MultiXacts. The store keeps these
-- references itself instead: DeleteWebhook deletes the webhook's deliveries with it, and
-- PruneEvents treats deliveries of a webhook that no longer exists as finished.
ALTER TABLE events DROP CONSTRAINT events_org_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_webhook_id_fkey;

-- One partial index per kind of due row, so that a claim reads only the rows it takes, in
-- order, whatever the backlog (the single index ordered by an expression made every claim sort
-- the whole backlog). A row version is in at most one of them; finished rows in none.
DROP INDEX deliveries_due;
CREATE INDEX deliveries_first_due ON deliveries (next_attempt_at) WHERE status = 'pending' AND attempts = 0;
CREATE INDEX deliveries_retry_due ON deliveries (next_attempt_at) WHERE status = 'pending' AND attempts > 0;
CREATE INDEX deliveries_lease ON deliveries (locked_until) WHERE status = 'in_flight';
