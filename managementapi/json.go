package managementapi

import (
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// Time marshals as RFC 3339 in UTC with milliseconds, e.g. "2026-11-22T10:04:05.123Z".
type Time time.Time

// TimeLayout is the layout of every timestamp the API writes.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(t).UTC().Format(TimeLayout) + `"`), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *Time) UnmarshalJSON(b []byte) error {
	var v time.Time
	if err := v.UnmarshalJSON(b); err != nil {
		return err
	}
	*t = Time(v)
	return nil
}

func optTime(t *time.Time) *Time {
	if t == nil {
		return nil
	}
	v := Time(*t)
	return &v
}

// Channel is the JSON form of a channel.
type Channel struct {
	ID                     uuid.UUID `json:"id"`
	Name                   string    `json:"name"`
	Status                 string    `json:"status"`
	DisplayPhoneNumber     *string   `json:"display_phone_number"`
	PhoneNumberID          *string   `json:"phone_number_id"`
	WabaID                 *string   `json:"waba_id"`
	ChannelToken           string    `json:"channel_token"`
	ConnectURL             string    `json:"connect_url"`
	ConnectedAt            *Time     `json:"connected_at"`
	TokenExpiresAt         *Time     `json:"token_expires_at"`
	UpstreamDisconnectedAt *Time     `json:"upstream_disconnected_at"`
	CreatedAt              Time      `json:"created_at"`
	// Health is what the upstream says of the number (DESIGN §5c "Number health").
	Health ChannelHealth `json:"health"`
}

// NewChannel converts a stored channel; connectBase is the prefix of its connect_url.
func NewChannel(c store.Channel, connectBase string) Channel {
	return Channel{
		ID:                     c.ID,
		Name:                   c.Name,
		Status:                 c.Status,
		DisplayPhoneNumber:     c.DisplayPhoneNumber,
		PhoneNumberID:          c.PhoneNumberID,
		WabaID:                 c.WabaID,
		ChannelToken:           c.ChannelToken,
		ConnectURL:             strings.TrimRight(connectBase, "/") + "/connect/" + c.ChannelToken,
		ConnectedAt:            optTime(c.ConnectedAt),
		TokenExpiresAt:         optTime(c.TokenExpiresAt),
		UpstreamDisconnectedAt: optTime(c.UpstreamDisconnectedAt),
		CreatedAt:              Time(c.CreatedAt),
		Health:                 NewChannelHealth(c.Health),
	}
}

// Webhook is the JSON form of a webhook config. HMACSecret is set only in the answers of its
// creation and of a secret rotation.
type Webhook struct {
	ID         uuid.UUID   `json:"id"`
	Name       string      `json:"name"`
	URL        string      `json:"url"`
	Events     []string    `json:"events"`
	Status     string      `json:"status"`
	Scope      string      `json:"scope"`
	ChannelIDs []uuid.UUID `json:"channel_ids"`
	HMACSecret string      `json:"hmac_secret,omitempty"`
	CreatedAt  Time        `json:"created_at"`
	// Ordering is "none" or "conversation" (DESIGN §5b "Ordering").
	Ordering string `json:"ordering"`
	// Health is "ok" or "failing" (DESIGN §5b Failing receivers); FailingSince is null when ok;
	// PausedReason is "failing" for a webhook paused after failing for disable_after, else null.
	Health       string  `json:"health"`
	FailingSince *Time   `json:"failing_since"`
	PausedReason *string `json:"paused_reason"`
	// PreviousSecretExpiresAt is when the secret a rotation replaced stops signing; null when
	// there is none.
	PreviousSecretExpiresAt *Time `json:"previous_secret_expires_at"`
}

// NewWebhook converts a stored webhook config.
func NewWebhook(w store.Webhook) Webhook {
	ids := w.ChannelIDs
	if ids == nil {
		ids = []uuid.UUID{}
	}
	return Webhook{
		ID:         w.ID,
		Name:       w.Name,
		URL:        w.URL,
		Events:     w.Events,
		Status:     w.Status,
		Scope:      w.Scope,
		ChannelIDs: ids,
		CreatedAt:  Time(w.CreatedAt),
		Ordering:   w.Ordering,

		Health:       w.Health.State(),
		FailingSince: optTime(w.Health.FailingSince),
		PausedReason: w.PausedReason,

		PreviousSecretExpiresAt: optTime(w.PreviousSecretExpiresAt),
	}
}

// Assignment is the response of a channel assignment.
type Assignment struct {
	WebhookConfigID uuid.UUID `json:"webhook_config_id"`
	ChannelID       uuid.UUID `json:"channel_id"`
}

// APIKey is the JSON form of an API key record: never the key itself nor its hash.
type APIKey struct {
	ID         uuid.UUID `json:"id"`
	Name       string    `json:"name"`
	Prefix     string    `json:"prefix"`
	CreatedAt  Time      `json:"created_at"`
	ExpiresAt  *Time     `json:"expires_at"`
	RevokedAt  *Time     `json:"revoked_at"`
	LastUsedAt *Time     `json:"last_used_at"`
}

// NewAPIKey converts a stored API key record.
func NewAPIKey(k store.APIKey) APIKey {
	return APIKey{
		ID:         k.ID,
		Name:       k.Name,
		Prefix:     k.Prefix,
		CreatedAt:  Time(k.CreatedAt),
		ExpiresAt:  optTime(k.ExpiresAt),
		RevokedAt:  optTime(k.RevokedAt),
		LastUsedAt: optTime(k.LastUsedAt),
	}
}

// APIKeyCreated is the response of POST /api_keys: the record plus the key, shown this once.
type APIKeyCreated struct {
	APIKey
	Key string `json:"key"`
}
