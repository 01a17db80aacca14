package managementapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

// Reads of what the dashboard's pages show beyond the API's JSON forms: a webhook's health in
// detail, its delivery charts, a channel's sends per minute and a message's whole record. They
// are scoped and refused as the API's reads are, and return the store's records where the page
// shows what the API's form leaves out.

// WebhookOverview is a webhook as the API shows it, with its receiver's health in detail.
type WebhookOverview struct {
	Webhook
	// HealthDetail is the receiver's health and probe schedule.
	HealthDetail store.WebhookHealth
}

// GetWebhookOverview returns one of the org's webhooks with its receiver's health in detail.
func (s *Service) GetWebhookOverview(ctx context.Context, p Principal, webhookID string) (WebhookOverview, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return WebhookOverview{}, err
	}
	wh, err := s.opt.Store.GetWebhook(ctx, p.Key.OrgID, wid)
	if err != nil {
		return WebhookOverview{}, s.storeError(err)
	}
	return WebhookOverview{Webhook: NewWebhook(wh), HealthDetail: wh.Health}, nil
}

// DeliveryChart returns the delivery charts of one of the org's webhooks since a time: its
// attempts by outcome and their latency per bucket of time (see store.Store.DeliveryChart).
func (s *Service) DeliveryChart(ctx context.Context, p Principal, webhookID string, since time.Time, bucket time.Duration) ([]store.DeliveryBucket, error) {
	wid, err := id(webhookID, MsgWebhookNotFound)
	if err != nil {
		return nil, err
	}
	buckets, err := s.opt.Store.DeliveryChart(ctx, p.Key.OrgID, wid, since, bucket)
	if err != nil {
		return nil, s.storeError(err)
	}
	return buckets, nil
}

// SendsPerMinute returns the relay calls of one of the org's channels per minute by outcome
// since a time (none for a channel of another org).
func (s *Service) SendsPerMinute(ctx context.Context, p Principal, channelID string, since time.Time) ([]store.SendMinute, error) {
	return s.SendsPerBucket(ctx, p, channelID, since, time.Minute)
}

// SendsPerBucket returns the relay calls of one of the org's channels per bucket of time by
// outcome since a time (none for a channel of another org; see store.Store.SendsPerBucket).
func (s *Service) SendsPerBucket(ctx context.Context, p Principal, channelID string, since time.Time, bucket time.Duration) ([]store.SendMinute, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return nil, err
	}
	return s.opt.Store.SendsPerBucket(ctx, p.Key.OrgID, cid, since, bucket)
}

// MessageTimeline returns the record of one of the org's messages, outgoing or incoming, as
// stored: GetMessage's timeline, with the time an incoming message was received and the relay
// call's latency to the microsecond.
func (s *Service) MessageTimeline(ctx context.Context, p Principal, wamid string) (*store.Timeline, error) {
	t, err := s.opt.Store.MessageTimeline(ctx, p.Key.OrgID, wamid)
	if errors.Is(err, store.ErrMessageNotFound) {
		return nil, &Error{http.StatusNotFound, MsgMessageNotFound}
	}
	return t, err
}
