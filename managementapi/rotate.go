package managementapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

// errGraceSeconds refuses a "grace_seconds" that is not an integer within the store's bounds.
var errGraceSeconds = unprocessable(`"grace_seconds" must be an integer between 0 and %d`, int64(store.MaxSecretGrace/time.Second))

// RotateWebhookSecret gives one of the org's webhooks a new signing secret, returned in the
// answer's hmac_secret this once. The secret it replaces keeps signing every delivery attempt,
// beside the new one, for grace (0 to store.MaxSecretGrace, else 422; the API's default is
// store.DefaultSecretGrace), until the answer's previous_secret_expires_at; a previous secret
// still in an earlier rotation's grace ends at once.
func (s *Service) RotateWebhookSecret(ctx context.Context, p Principal, webhookID string, grace time.Duration) (Webhook, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return Webhook{}, err
	}
	if grace < 0 || grace > store.MaxSecretGrace || grace%time.Second != 0 {
		return Webhook{}, errGraceSeconds
	}
	wh, secret, err := s.opt.Store.RotateWebhookSecret(ctx, p.Key.OrgID, wid, grace)
	if err != nil {
		return Webhook{}, s.storeError(err)
	}
	out := NewWebhook(wh)
	out.HMACSecret = secret
	return out, nil
}

// parseGraceSeconds reads the optional "grace_seconds" of a rotate_secret body: absent or null
// is store.DefaultSecretGrace; otherwise a JSON integer from 0 to MaxSecretGrace in seconds.
func parseGraceSeconds(o object) (time.Duration, *Error) {
	raw := o["grace_seconds"]
	if isNull(raw) {
		return store.DefaultSecretGrace, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil || bytes.HasPrefix(bytes.TrimSpace(raw), []byte(`"`)) {
		return 0, errGraceSeconds
	}
	secs, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil || secs < 0 || secs > int64(store.MaxSecretGrace/time.Second) {
		return 0, errGraceSeconds
	}
	return time.Duration(secs) * time.Second, nil
}

// rotateSecret serves POST /webhooks/{id}/rotate_secret. The body is optional: none (or only
// white space) takes the default grace.
func (h *Handler) rotateSecret(q *call) {
	if _, err := id(q.r.PathValue("id"), MsgWebhookNotFound); err != nil {
		q.fail(err) // the path is checked before the body
		return
	}
	grace := store.DefaultSecretGrace
	body, err := io.ReadAll(http.MaxBytesReader(q.w, q.r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		q.fail(errTooLarge)
		return
	case err != nil:
		q.fail(errInvalidJSON)
		return
	}
	if len(bytes.TrimSpace(body)) > 0 {
		q.r.Body = io.NopCloser(bytes.NewReader(body))
		obj := q.body()
		if obj == nil {
			return
		}
		var e *Error
		if grace, e = parseGraceSeconds(obj); e != nil {
			q.fail(e)
			return
		}
	}
	out, err := h.svc.RotateWebhookSecret(q.ctx(), q.p, q.r.PathValue("id"), grace)
	answer(q, http.StatusOK, out, err)
}
