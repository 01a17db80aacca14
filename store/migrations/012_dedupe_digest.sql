-- Over-long upstream identifiers (DESIGN §5 "Intake": content never causes a 5xx).
--
-- An event's dedupe_key is built from upstream ids (message id, status id and state); the
-- unique index on (channel_id, dedupe_key) of every events partition refused a key too long for
-- a btree row (about 2.7 kB), and the intake answered 503 to a post the upstream then retried
-- for days. From now on a key longer than 256 bytes (or one that is not text, as before) is
-- stored as 'h:' || hex SHA-256 of its UTF-8 bytes (store.dedupeKey): 66 bytes, whatever the
-- upstream sends. The index is unchanged, and so is the intake's statement.
--
-- Rows stored before this migration with a key longer than 256 bytes get the same digest form,
-- so that a re-send of their item is still recognised as a duplicate. (Keys of at most 256
-- bytes, nearly all, are unchanged; non-text keys were digests already.)
UPDATE events SET dedupe_key = 'h:' || encode(sha256(convert_to(dedupe_key, 'UTF8')), 'hex')
WHERE octet_length(dedupe_key) > 256;
