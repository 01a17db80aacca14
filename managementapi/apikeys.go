package managementapi

import (
	"context"
	"time"
)

// The org's API keys. Every key of an org may list, create and revoke every key of the org,
// itself included: keys carry no scopes.

// APIKeyInput is the body of POST /api_keys. ExpiresIn is a lifetime as ParseLifetime reads it;
// empty (or only white space) means the key never expires.
type APIKeyInput struct {
	Name      string
	ExpiresIn string
}

// ListAPIKeys returns all the org's keys, revoked and expired ones included (an operator sees
// the history), ordered by (created_at, id).
func (s *Service) ListAPIKeys(ctx context.Context, p Principal) ([]APIKey, error) {
	ks, err := s.opt.Store.ListAPIKeys(ctx, p.Key.OrgID)
	if err != nil {
		return nil, err
	}
	out := make([]APIKey, len(ks))
	for i, k := range ks {
		out[i] = NewAPIKey(k)
	}
	return out, nil
}

// CreateAPIKey creates a key and returns it in clear, this once. A key that expires cannot
// create a key that outlives it: it must give ExpiresIn, at most its own remaining lifetime.
// The org's cap on live keys applies.
func (s *Service) CreateAPIKey(ctx context.Context, p Principal, in APIKeyInput) (APIKeyCreated, error) {
	return s.createAPIKey(ctx, p, fields{"name": in.Name, "expires_in": in.ExpiresIn})
}

func (s *Service) createAPIKey(ctx context.Context, p Principal, src source) (APIKeyCreated, error) {
	in, e := parseAPIKeyInput(src)
	if e != nil {
		return APIKeyCreated{}, e
	}
	expiresAt := expiryAfter(in.expiresIn)
	if e := outlives(expiresAt, p.Key.ExpiresAt); e != nil {
		return APIKeyCreated{}, e
	}
	k, key, err := s.opt.Store.CreateAPIKeyCapped(ctx, p.Key.OrgID, in.name, expiresAt, s.opt.MaxAPIKeysPerOrg)
	if err != nil {
		return APIKeyCreated{}, s.storeError(err)
	}
	return APIKeyCreated{APIKey: NewAPIKey(k), Key: key}, nil
}

// expiryAfter is the expiry of a key created now with lifetime d; nil (never) when d is not
// positive. It has milliseconds, the precision the API shows, so that the answer and later
// lists agree.
func expiryAfter(d time.Duration) *time.Time {
	if d <= 0 {
		return nil
	}
	t := time.Now().Add(d).UTC().Truncate(time.Millisecond)
	return &t
}

// outlives refuses a new key's expiry (nil: never) that is later than that of the key creating
// it (nil: never), so that a short-lived key cannot mint a longer-lived or permanent one.
func outlives(expiresAt, creatorExpiresAt *time.Time) *Error {
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

// RevokeAPIKey revokes a key of the org; revoking a revoked key succeeds again. The calling
// key may revoke itself: its next call is refused.
func (s *Service) RevokeAPIKey(ctx context.Context, p Principal, keyID string) error {
	kid, err := id(keyID, MsgAPIKeyNotFound)
	if err != nil {
		return err
	}
	_, err = s.opt.Store.RevokeOrgAPIKey(ctx, p.Key.OrgID, kid)
	return s.storeError(err)
}
