package relay

import (
	"context"

	"github.com/wabarelay/wabarelay/store"
)

// State is what the relay's handlers learn about one request and pass down the chain.
type State struct {
	// Channel is the authenticated channel.
	Channel *store.RelayChannel
	// NotSent is set when the upstream provably did not act on the request: it was never
	// reached, or it rejected the access token. An idempotency key is then released.
	NotSent bool
	// UpstreamAnswered is set when the answer written down the chain is the upstream's own
	// (passed through or rewritten), as opposed to one the relay made up.
	UpstreamAnswered bool
}

type stateKey struct{}

// WithState returns ctx carrying st.
func WithState(ctx context.Context, st *State) context.Context {
	return context.WithValue(ctx, stateKey{}, st)
}

// StateFrom returns the request's relay state, or nil outside the relay chain.
func StateFrom(ctx context.Context) *State {
	st, _ := ctx.Value(stateKey{}).(*State)
	return st
}
