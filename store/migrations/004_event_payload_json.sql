-- Event payloads are delivered byte-for-byte as stored: json keeps the text (jsonb would
-- reorder keys and drop whitespace of the upstream objects).
ALTER TABLE events ALTER COLUMN payload TYPE json USING payload::json;
