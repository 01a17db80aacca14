-- Dashboard sign-ins: a server-side session per sign-in, tied to the API key that signed in.
-- The cookie holds a random token; only its SHA-256 is stored. A session ends on sign-out, at
-- expires_at, and the moment its key is revoked or expires (the lookup joins api_keys), and is
-- removed with its key.
CREATE TABLE dashboard_sessions (
	token_hash  bytea PRIMARY KEY,
	api_key_id  uuid NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
	csrf_token  text NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now(),
	expires_at  timestamptz NOT NULL
);
CREATE INDEX dashboard_sessions_api_key_id ON dashboard_sessions (api_key_id);
CREATE INDEX dashboard_sessions_expires_at ON dashboard_sessions (expires_at);

