-- Intake and dispatcher hot path, continued.
--
-- The remaining foreign keys of the queue cost every stored delivery and every recorded attempt
-- a row lock on its parent (SELECT … FOR KEY SHARE, which also writes the parent tuple and WAL);
-- dropping them lowers the Postgres CPU per event (bench/events). Their
-- cascades are done by the store itself: PruneEvents deletes an event's deliveries and attempts
-- with it, DeleteWebhook its deliveries and their attempts.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_event_id_fkey;
ALTER TABLE delivery_attempts DROP CONSTRAINT delivery_attempts_delivery_id_fkey;
