-- Delivery attempts are counted when their outcome is recorded, not when they are claimed
-- (dispatcher: a lease that expired and is reclaimed is not an attempt), so deliveries.attempts
-- no longer changes with every claim and cannot tell two claims of a delivery apart. claim_seq
-- does: every claim by a dispatcher increments it, and an outcome (or a hand-back) is recorded
-- only while the claim that made it is still the delivery's current one (same locked_by, same
-- claim_seq). Deliveries the intake inserts already claimed keep 0 (their first claim).
-- A constant default: no table rewrite. Not indexed.
ALTER TABLE deliveries ADD COLUMN claim_seq int NOT NULL DEFAULT 0;
