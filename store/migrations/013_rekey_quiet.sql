-- Re-encrypting secrets under a new key (`caddy wabarelay rekey`) changes no plaintext, so no
-- instance's cache of a channel goes stale: such writes, made in transactions that set
-- wabarelay.rekey, are not announced on wabarelay_channels (a rekey of every channel would
-- otherwise flush every instance's relay cache).
CREATE OR REPLACE FUNCTION wabarelay_channel_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('wabarelay.rekey', true) = 'on' THEN
		RETURN NULL;
	END IF;
	PERFORM pg_notify('wabarelay_channels', COALESCE(NEW.id, OLD.id)::text);
	RETURN NULL;
END;
$$;
