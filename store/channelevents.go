package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// States a channel_status event names (data.status and data.previous_status): a channel's
// status (ChannelPending, ChannelActive, ChannelInactive), except that an active channel whose
// upstream token died (code 190) is StateUpstreamDisconnected, and a deleted one StateDeleted.
const (
	StateUpstreamDisconnected = "upstream_disconnected"
	StateDeleted              = "deleted"
)

// Reasons of channel_status events (data.reason, DESIGN §5b "Event kinds").
const (
	ReasonConnected            = "connected"              // first connection (Embedded Signup or ConnectChannel)
	ReasonReconnected          = "reconnected"            // a connection after an earlier one
	ReasonUpstreamTokenInvalid = "upstream_token_invalid" // the upstream answered code 190
	ReasonOperator             = "operator"               // the operator deactivated the channel
	ReasonAccountBanned        = "account_banned"         // the business account was banned or disabled upstream
	ReasonAccountDeleted       = "account_deleted"        // the business account was deleted upstream
	ReasonNumberRemoved        = "number_removed"         // the number was removed from its account upstream
	ReasonDeleted              = "deleted"                // the channel was deleted
)

// channelState returns the state a channel_status event names for a channel row.
func channelState(status string, disconnected bool) string {
	if status == ChannelActive && disconnected {
		return StateUpstreamDisconnected
	}
	return status
}

// channelChange is one change of a channel's state, announced by a channel_status event.
type channelChange struct {
	id, org       uuid.UUID
	phoneNumberID *string // nil: never connected
	previous      string
	status        string
	reason        string
}

// changeColumns, after the RETURNING of an update of channels joined to a locked snapshot
// "old" (see transitionSQL), reads what a channelChange needs: the channel, its state before
// (old.old_status, old.old_disc), whether it had ever been connected (old.old_conn) and its
// state after.
const changeColumns = `channels.id, channels.org_id, channels.phone_number_id, old.old_status, old.old_disc, old.old_conn,
	channels.status, channels.upstream_disconnected_at IS NOT NULL`

// transitionSQL returns an update of the channels matching where (a condition on channels; an
// unqualified column is the channel's before the update) setting set, that returns
// changeColumns. The rows are locked first (FOR UPDATE) so that the state read before the
// update is the one it changes.
func transitionSQL(where, set string) string {
	return `WITH old AS (
		SELECT id, status AS old_status, upstream_disconnected_at IS NOT NULL AS old_disc, connected_at IS NOT NULL AS old_conn
		FROM channels WHERE ` + where + ` FOR UPDATE)
	UPDATE channels SET ` + set + ` FROM old WHERE channels.id = old.id RETURNING ` + changeColumns
}

// collectChanges reads the rows of a transitionSQL update and returns the channels changed
// (updated) and the state changes among them, with the reason reason(was connected before).
func collectChanges(rows pgx.Rows, reason func(connected bool) string) (updated int, changes []channelChange, err error) {
	defer rows.Close()
	for rows.Next() {
		var c channelChange
		var oldStatus, newStatus string
		var oldDisc, oldConn, newDisc bool
		if err := rows.Scan(&c.id, &c.org, &c.phoneNumberID, &oldStatus, &oldDisc, &oldConn, &newStatus, &newDisc); err != nil {
			return 0, nil, err
		}
		updated++
		c.previous, c.status = channelState(oldStatus, oldDisc), channelState(newStatus, newDisc)
		if c.previous == c.status {
			continue // no change of state: no event
		}
		c.reason = reason(oldConn)
		changes = append(changes, c)
	}
	return updated, changes, rows.Err()
}

// because returns a reason function giving r whatever the channel's past.
func because(r string) func(bool) string { return func(bool) string { return r } }

// connectReason is the reason of a connection: connected the first time, else reconnected.
func connectReason(wasConnected bool) string {
	if wasConnected {
		return ReasonReconnected
	}
	return ReasonConnected
}

// ChannelStatusData is the data of a channel_status event (keys in this order).
type ChannelStatusData struct {
	Status         string `json:"status"`
	PreviousStatus string `json:"previous_status"`
	Reason         string `json:"reason"`
}

// recordChannelEvents stores one channel_status event per change in tx, with one delivery per
// webhook that covers the channel at this moment (so a deleted channel's event must be recorded
// before its row and its webhook assignments go), through the same path as StoreEvents.
func (s *Store) recordChannelEvents(ctx context.Context, tx pgx.Tx, changes []channelChange) error {
	if len(changes) == 0 {
		return nil
	}
	now := s.now().UTC()
	created := now.Format(eventTimeFormat)
	in := inboundBatch{now: now, lookback: day(now)} // keys are new: no look-up in earlier days
	for _, c := range changes {
		data, err := json.Marshal(ChannelStatusData{Status: c.status, PreviousStatus: c.previous, Reason: c.reason})
		if err != nil {
			return err
		}
		pn := []byte("null")
		if c.phoneNumberID != nil {
			pn, _ = json.Marshal(*c.phoneNumberID)
		}
		id := newID()
		in.ids, in.chIDs, in.orgIDs = append(in.ids, id), append(in.chIDs, c.id), append(in.orgIDs, c.org)
		in.types, in.keys = append(in.types, EventChannelStatus), append(in.keys, "c:"+id.String())
		// a channel's status changes are its own conversation (ordering), as its template events
		conv := c.id.String()
		if c.phoneNumberID != nil {
			conv = *c.phoneNumberID
		}
		in.convs = append(in.convs, ConversationKey(conv, ""))
		in.payloads = append(in.payloads, encodeEvent(id, EventChannelStatus, created, c.id, pn, data))
	}
	var res InboundResult
	res.ByType = map[string]int{}
	if err := in.store(ctx, tx, &res); err != nil {
		return fmt.Errorf("channel status events: %w", err)
	}
	return nil
}

// changeChannels runs fn, which changes channels and records their events
// (recordChannelEvents), in one transaction. When today's history partition is missing (the
// partition manager is behind), it makes the partitions and runs fn once more.
func (s *Store) changeChannels(ctx context.Context, fn func(tx pgx.Tx) error) error {
	err := s.inTx(ctx, fn)
	if isMissingPartition(err) {
		now := s.now()
		if err = s.EnsurePartitions(ctx, now.AddDate(0, 0, -1), now.AddDate(0, 0, PartitionsAhead)); err == nil {
			err = s.inTx(ctx, fn)
		}
	}
	return err
}

// transition runs a transitionSQL update in tx and records the events of the state changes it
// made. It returns how many channels it updated.
func (s *Store) transition(ctx context.Context, tx pgx.Tx, where, set string, reason func(bool) string, args ...any) (int, error) {
	rows, err := tx.Query(ctx, transitionSQL(where, set), args...)
	if err != nil {
		return 0, err
	}
	n, changes, err := collectChanges(rows, reason)
	if err != nil {
		return 0, err
	}
	return n, s.recordChannelEvents(ctx, tx, changes)
}

// deletedChannelEvent records, in tx, the channel_status event of a channel about to be deleted
// (state → StateDeleted), for the webhooks that cover it now.
func (s *Store) deletedChannelEvent(ctx context.Context, tx pgx.Tx, orgID, id uuid.UUID, pnid *string, status string, disconnected bool) error {
	return s.recordChannelEvents(ctx, tx, []channelChange{{id: id, org: orgID, phoneNumberID: pnid,
		previous: channelState(status, disconnected), status: StateDeleted, reason: ReasonDeleted}})
}
