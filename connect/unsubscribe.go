package connect

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/wabarelay/wabarelay/graph"
	"github.com/wabarelay/wabarelay/store"
)

// unsubscribeTimeout bounds the upstream call that undoes a deleted channel's subscription.
const unsubscribeTimeout = 15 * time.Second

// Unsubscriber returns the undoing of the connect flow's subscription for a deleted channel:
// given a channel deleted as the last of its business account (store.DeletedChannel), it
// removes the app's subscription to that account upstream with the channel's access token,
// best effort: a failure is logged (never the token) and not retried. It is what the management
// Service calls after such a deletion (managementapi.Options.AfterChannelDeleted).
func Unsubscriber(g *graph.Client, logger *zap.Logger) func(store.DeletedChannel) {
	if logger == nil {
		logger = zap.NewNop()
	}
	return func(d store.DeletedChannel) {
		ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
		defer cancel()
		if err := g.UnsubscribeApp(ctx, d.UpstreamToken, d.WabaID); err != nil {
			logger.Warn("unsubscribing a deleted channel's business account failed", zap.String("waba_id", d.WabaID), zap.Error(err))
		}
	}
}
