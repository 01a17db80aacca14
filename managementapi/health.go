package managementapi

import (
	"context"
	"encoding/json"

	"github.com/wabarelay/wabarelay/store"
)

// ChannelHealth is the JSON form of a channel's number health: the upstream's strings verbatim,
// each null until known, and when they were read (null: never).
type ChannelHealth struct {
	QualityRating  *string `json:"quality_rating"`
	MessagingLimit *string `json:"messaging_limit"`
	Throughput     *string `json:"throughput"`
	NameStatus     *string `json:"name_status"`
	CheckedAt      *Time   `json:"checked_at"`
}

// NewChannelHealth converts a stored health.
func NewChannelHealth(h store.ChannelHealth) ChannelHealth {
	return ChannelHealth{QualityRating: h.QualityRating, MessagingLimit: h.MessagingLimit, Throughput: h.Throughput,
		NameStatus: h.NameStatus, CheckedAt: optTime(h.CheckedAt)}
}

// AtRisk reports whether the quality rating is YELLOW or RED.
func (h ChannelHealth) AtRisk() bool {
	return h.QualityRating != nil && (*h.QualityRating == store.QualityYellow || *h.QualityRating == store.QualityRed)
}

// HealthChange is one change of a channel's health (the dashboard's history).
type HealthChange struct {
	At       Time
	Changed  []string
	Health   ChannelHealth
	Previous ChannelHealth
	// Upstream is the account webhook change that prompted the read, nil when none did.
	Upstream json.RawMessage
}

// healthHistoryLimit is how many changes ChannelHealthHistory returns.
const healthHistoryLimit = 50

// ChannelHealthHistory returns the latest changes of one of the org's channels' health, newest
// first; another org's or an unknown channel is MsgChannelNotFound.
func (s *Service) ChannelHealthHistory(ctx context.Context, p Principal, channelID string) ([]HealthChange, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return nil, err
	}
	cs, err := s.opt.Store.ChannelHealthChanges(ctx, p.Key.OrgID, cid, healthHistoryLimit)
	if err != nil {
		return nil, s.storeError(err)
	}
	out := make([]HealthChange, len(cs))
	for i, c := range cs {
		out[i] = HealthChange{At: Time(c.At), Changed: c.Changed, Health: NewChannelHealth(c.Health),
			Previous: NewChannelHealth(c.Previous), Upstream: c.Upstream}
	}
	return out, nil
}
