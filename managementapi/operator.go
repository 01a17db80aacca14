package managementapi

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// The operator's operations: what the CLI does, as the operator's principal (Operator()). They
// cross orgs, are not capped, answer in the API's shapes with the record's org added, and
// return the store's errors (see Service).

// Org is the JSON form of an organization.
type Org struct {
	ID        uuid.UUID `json:"id"`
	Name      string    `json:"name"`
	CreatedAt Time      `json:"created_at"`
}

// OrgAPIKey is the JSON form of an API key record with its org.
type OrgAPIKey struct {
	APIKey
	OrgID uuid.UUID `json:"org_id"`
}

func newOrgAPIKey(k store.APIKey) OrgAPIKey { return OrgAPIKey{APIKey: NewAPIKey(k), OrgID: k.OrgID} }

// OrgAPIKeyCreated is a new API key's record with its org, plus the key, shown this once.
type OrgAPIKeyCreated struct {
	OrgAPIKey
	Key string `json:"key"`
}

// OrgWebhook is the JSON form of a webhook config with its org.
type OrgWebhook struct {
	Webhook
	OrgID uuid.UUID `json:"org_id"`
}

// ChannelState is the operator's form of a channel: its org and state, never a token (the
// API's form, Channel, carries the channel token and its connect link).
type ChannelState struct {
	ID     uuid.UUID `json:"id"`
	OrgID  uuid.UUID `json:"org_id"`
	Name   string    `json:"name"`
	Status string    `json:"status"`
	// InactiveReason says why an inactive channel is inactive: "operator" or "upstream".
	InactiveReason *string `json:"inactive_reason"`
}

func newChannelState(c store.Channel) ChannelState {
	return ChannelState{ID: c.ID, OrgID: c.OrgID, Name: c.Name, Status: c.Status, InactiveReason: c.InactiveReason}
}

// ReopenedChannel is a channel whose connect link the operator reopened, with the link's end.
type ReopenedChannel struct {
	ChannelState
	TokenExpiresAt *Time `json:"token_expires_at"`
}

// CreateOrg creates an organization.
func (s *Service) CreateOrg(ctx context.Context, p Principal, name string) (Org, error) {
	if !p.operator {
		return Org{}, errOperatorOnly
	}
	o, err := s.opt.Store.CreateOrg(ctx, name)
	if err != nil {
		return Org{}, err
	}
	return Org{ID: o.ID, Name: o.Name, CreatedAt: Time(o.CreatedAt)}, nil
}

// CreateOrgAPIKey creates an API key of an org, named as given, that expires after lifetime
// (0: never), and returns it in clear, this once. The org's cap on live keys does not apply:
// this is the operator's way in for an org at its cap.
func (s *Service) CreateOrgAPIKey(ctx context.Context, p Principal, orgID uuid.UUID, name string, lifetime time.Duration) (OrgAPIKeyCreated, error) {
	if !p.operator {
		return OrgAPIKeyCreated{}, errOperatorOnly
	}
	k, key, err := s.opt.Store.CreateAPIKey(ctx, orgID, name, expiryAfter(lifetime))
	if err != nil {
		return OrgAPIKeyCreated{}, err
	}
	return OrgAPIKeyCreated{OrgAPIKey: newOrgAPIKey(k), Key: key}, nil
}

// ListOrgAPIKeys returns all of an org's API keys, revoked and expired ones included, ordered by
// (created_at, id).
func (s *Service) ListOrgAPIKeys(ctx context.Context, p Principal, orgID uuid.UUID) ([]OrgAPIKey, error) {
	if !p.operator {
		return nil, errOperatorOnly
	}
	ks, err := s.opt.Store.ListAPIKeys(ctx, orgID)
	if err != nil {
		return nil, err
	}
	out := make([]OrgAPIKey, len(ks))
	for i, k := range ks {
		out[i] = newOrgAPIKey(k)
	}
	return out, nil
}

// RevokeAnyAPIKey revokes an API key of any org and returns its record; revoking a revoked key
// succeeds again and keeps its first revocation time.
func (s *Service) RevokeAnyAPIKey(ctx context.Context, p Principal, keyID uuid.UUID) (OrgAPIKey, error) {
	if !p.operator {
		return OrgAPIKey{}, errOperatorOnly
	}
	k, err := s.opt.Store.RevokeAPIKey(ctx, keyID)
	if err != nil {
		return OrgAPIKey{}, err
	}
	return newOrgAPIKey(k), nil
}

// DeactivateChannel deactivates a channel of any org (inactive_reason "operator"): the relay
// refuses it from then on, and only the operator reopens it.
func (s *Service) DeactivateChannel(ctx context.Context, p Principal, channelID uuid.UUID) (ChannelState, error) {
	if !p.operator {
		return ChannelState{}, errOperatorOnly
	}
	c, err := s.opt.Store.DeactivateChannel(ctx, channelID)
	if err != nil {
		return ChannelState{}, err
	}
	return newChannelState(c), nil
}

// ReopenChannel reopens the connect link of a channel of any org for ttl (0:
// Options.ConnectLinkTTL), whatever its state: the operator is not bound by the reconnect rule,
// and reopening a channel it deactivated lets the owner complete the link. The channel token
// is kept.
func (s *Service) ReopenChannel(ctx context.Context, p Principal, channelID uuid.UUID, ttl time.Duration) (ReopenedChannel, error) {
	if !p.operator {
		return ReopenedChannel{}, errOperatorOnly
	}
	if ttl <= 0 {
		ttl = s.opt.ConnectLinkTTL
	}
	c, err := s.opt.Store.ReopenLink(ctx, nil, channelID, ttl, true)
	if err != nil {
		return ReopenedChannel{}, err
	}
	return ReopenedChannel{ChannelState: newChannelState(c), TokenExpiresAt: optTime(c.TokenExpiresAt)}, nil
}

// RotateAnyWebhookSecret gives a webhook of any org a new signing secret, returned in the
// answer's hmac_secret this once; the secret it replaces keeps signing beside it for grace (0
// to store.MaxSecretGrace), until the answer's previous_secret_expires_at.
func (s *Service) RotateAnyWebhookSecret(ctx context.Context, p Principal, webhookID uuid.UUID, grace time.Duration) (OrgWebhook, error) {
	if !p.operator {
		return OrgWebhook{}, errOperatorOnly
	}
	wh, secret, err := s.opt.Store.RotateAnyWebhookSecret(ctx, webhookID, grace)
	if err != nil {
		return OrgWebhook{}, err
	}
	out := OrgWebhook{Webhook: NewWebhook(wh), OrgID: wh.OrgID}
	out.HMACSecret = secret
	return out, nil
}
