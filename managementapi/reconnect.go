package managementapi

import (
	"context"
	"net/http"
	"time"

	"github.com/wabarelay/wabarelay/store"
)

// Why an inactive channel is inactive (store.Channel.InactiveReason).
const (
	reasonOperator = "operator"
	reasonUpstream = "upstream"
)

var (
	errOperatorDeactivated = &Error{http.StatusConflict, MsgOperatorDeactivated}
	errNotReconnectable    = &Error{http.StatusConflict, MsgNotReconnectable}
)

// reopenRefusal is the reconnect rule of an org's channel: nil when c's connect link may be
// reopened at now — a pending channel whose link expired (or never opened), a channel whose
// upstream token died, or one the upstream deactivated — else the refusal: a channel the
// operator deactivated is the operator's to reopen (MsgOperatorDeactivated), and any other has
// nothing to reconnect (MsgNotReconnectable). The operator may reopen any channel
// (ReopenChannel).
//
// ReconnectChannel answers by it, and the dashboard offers its Reconnect button by it
// (ChannelOverview.Reconnectable). store.Store.ReopenLink applies the same rule in its update,
// so that a change between the read and the write is refused too.
func reopenRefusal(c store.Channel, now time.Time) *Error {
	if c.InactiveReason != nil && *c.InactiveReason == reasonOperator {
		if c.Status == store.ChannelInactive {
			return errOperatorDeactivated
		}
		return errNotReconnectable
	}
	linkClosed := c.TokenExpiresAt == nil || !c.TokenExpiresAt.After(now)
	switch {
	case c.Status == store.ChannelPending && linkClosed,
		c.UpstreamDisconnectedAt != nil,
		c.Status == store.ChannelInactive && c.InactiveReason != nil && *c.InactiveReason == reasonUpstream:
		return nil
	}
	return errNotReconnectable
}

// ReconnectChannel reopens the connect link of one of the org's channels for
// Options.ConnectLinkTTL, as the reconnect rule allows; the channel token is kept.
func (s *Service) ReconnectChannel(ctx context.Context, p Principal, channelID string) (Channel, error) {
	cid, err := id(channelID, MsgChannelNotFound)
	if err != nil {
		return Channel{}, err
	}
	orgID := p.Key.OrgID
	c, err := s.opt.Store.GetChannel(ctx, orgID, cid)
	if err != nil {
		return Channel{}, s.storeError(err)
	}
	if e := reopenRefusal(c, time.Now()); e != nil {
		return Channel{}, e
	}
	if c, err = s.opt.Store.ReopenLink(ctx, &orgID, cid, s.opt.ConnectLinkTTL, false); err != nil {
		return Channel{}, s.storeError(err)
	}
	return NewChannel(c, s.connectBase(p)), nil
}

// ChannelOverview is a channel as the API shows it with what its connect link allows now: the
// dashboard's list of channels.
type ChannelOverview struct {
	Channel
	// LinkOpen: the connect link is open (TokenExpiresAt is ahead).
	LinkOpen bool
	// Reconnectable: ReconnectChannel would reopen the link (the reconnect rule).
	Reconnectable bool
}

// ChannelOverviews returns the org's channels, each with what its connect link allows now.
func (s *Service) ChannelOverviews(ctx context.Context, p Principal) ([]ChannelOverview, error) {
	cs, err := s.opt.Store.ListChannels(ctx, p.Key.OrgID)
	if err != nil {
		return nil, err
	}
	base, now := s.connectBase(p), time.Now()
	out := make([]ChannelOverview, len(cs))
	for i, c := range cs {
		out[i] = ChannelOverview{Channel: NewChannel(c, base), LinkOpen: c.TokenExpiresAt != nil && c.TokenExpiresAt.After(now),
			Reconnectable: reopenRefusal(c, now) == nil}
	}
	return out, nil
}
