-- Secret rotation (POST /webhooks/:id/rotate_secret): the secret a rotation replaced keeps
-- signing deliveries, beside the new one, until previous_secret_expires_at. Sealed like
-- secret_enc (secretbox, additional data "webhooks.previous_secret:<id>"); NULL when there is
-- none or the grace was 0. previous_secret_expires_at stays after the grace ends (until the next
-- rotation): the claims hand it to the dispatcher, which re-reads a webhook's secrets when it
-- changes.
ALTER TABLE webhooks
	ADD COLUMN previous_secret_enc bytea,
	ADD COLUMN previous_secret_expires_at timestamptz;
