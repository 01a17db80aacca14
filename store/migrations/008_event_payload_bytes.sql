-- Event payloads are the exact bytes delivered to webhooks: the upstream's objects as sent,
-- including \u0000 escapes and byte sequences that Postgres's text and json types refuse
-- (DESIGN §5 "Intake": content never causes a 5xx). bytea takes any of them.
ALTER TABLE events ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8');
