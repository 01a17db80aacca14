package store

import (
	"context"
	"fmt"

	"github.com/google/uuid"
)

// ChannelDeleted reports whether channelID names a channel the org had and deleted, as far as
// its events still tell: the channel's status events (every channel has one, its deletion's at
// least: deletedChannelEvent) outlive it, its row does not. A deletion older than the event
// retention is no longer known (false), nor is another org's channel. The read goes through each
// day partition's (channel_id, dedupe_key) index: a few probes, made only on a refusal's path.
func (s *Store) ChannelDeleted(ctx context.Context, orgID, channelID uuid.UUID) (bool, error) {
	var deleted bool
	err := s.pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM events WHERE channel_id = $1 AND org_id = $2 AND type = $3)
		   AND NOT EXISTS (SELECT 1 FROM channels WHERE id = $1)`, channelID, orgID, EventChannelStatus).Scan(&deleted)
	if err != nil {
		return false, fmt.Errorf("channel deleted: %w", err)
	}
	return deleted, nil
}
