package managementapi

import (
	"net/http"
	"time"

	"github.com/wabarelay/wabarelay/internal/httpx"
)

// The org's API keys. Every key of an org may list, create and revoke every key of the org,
// itself included: keys carry no scopes.

// listAPIKeys answers all the org's keys, revoked and expired ones included (an operator sees
// the history), ordered by (created_at, id).
func (h *Handler) listAPIKeys(q *request) {
	ks, err := h.opt.Store.ListAPIKeys(q.r.Context(), q.orgID)
	if err != nil {
		h.serverError(q.w, q.r, err)
		return
	}
	out := make([]APIKey, len(ks))
	for i, k := range ks {
		out[i] = NewAPIKey(k)
	}
	httpx.WriteJSON(q.w, http.StatusOK, out)
}

// createAPIKey creates a key and answers it in clear, this once. A key that expires cannot
// create a key that outlives it: it must give "expires_in", at most its own remaining lifetime.
// The org's cap on live keys applies.
func (h *Handler) createAPIKey(q *request) {
	obj, e := readObject(q.w, q.r)
	if e != nil {
		clientError(q.w, e)
		return
	}
	in, e := parseAPIKeyInput(obj)
	if e != nil {
		clientError(q.w, e)
		return
	}
	var expiresAt *time.Time
	if in.expiresIn > 0 {
		// milliseconds, the precision the API shows, so that the answer and later lists agree
		t := time.Now().Add(in.expiresIn).UTC().Truncate(time.Millisecond)
		expiresAt = &t
	}
	if e := outlives(expiresAt, q.key.ExpiresAt); e != nil {
		clientError(q.w, e)
		return
	}
	k, key, err := h.opt.Store.CreateAPIKeyCapped(q.r.Context(), q.orgID, in.name, expiresAt, h.opt.MaxAPIKeysPerOrg)
	if err != nil {
		h.storeError(q, err)
		return
	}
	httpx.WriteJSON(q.w, http.StatusCreated, APIKeyCreated{APIKey: NewAPIKey(k), Key: key})
}

// outlives refuses a new key's expiry (nil: never) that is later than that of the key creating
// it (nil: never), so that a short-lived key cannot mint a longer-lived or permanent one.
func outlives(expiresAt, creatorExpiresAt *time.Time) *apiError {
	if creatorExpiresAt == nil {
		return nil
	}
	until := creatorExpiresAt.UTC().Format(TimeLayout)
	if expiresAt == nil {
		return unprocessable(`"expires_in" is required: the creating key expires at %s, and a key cannot create a key that outlives it`, until)
	}
	if expiresAt.After(*creatorExpiresAt) {
		return unprocessable(`"expires_in" must not exceed the creating key's remaining lifetime: it expires at %s`, until)
	}
	return nil
}

// revokeAPIKey revokes a key of the org; revoking a revoked key succeeds again. The key making
// the call may revoke itself: the answer is still 204, and its next call is refused.
func (h *Handler) revokeAPIKey(q *request) {
	id, ok := q.id(0, MsgAPIKeyNotFound)
	if !ok {
		return
	}
	if _, err := h.opt.Store.RevokeOrgAPIKey(q.r.Context(), q.orgID, id); err != nil {
		h.storeError(q, err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}
