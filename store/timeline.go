package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The message timeline's reads (DESIGN §5b "Message timeline"): the recent outgoing messages of
// a channel and the whole timeline of one message, outgoing or incoming (its relay call, its
// status events and their deliveries). Every read is scoped to an org. They join two records
// (migration 021): relay_log, the relay's side of every send (relaylog.Writer), and messages,
// what the statuses said (StoreEvents), which a message's first status creates.

// ErrMessageNotFound is returned for an unknown message id (or one of another org).
var ErrMessageNotFound = errors.New("message not found")

// Directions of a message (Timeline.Direction).
const (
	DirectionOutgoing = "outgoing"
	DirectionIncoming = "incoming"
)

// MessageReceived is the status of an incoming message (Timeline.Status).
const MessageReceived = "received"

// MessageFilter selects a page of a channel's outgoing messages, newest first (created_at, then
// wamid, descending).
type MessageFilter struct {
	// Status keeps the messages whose latest status it is ("" for all).
	Status string
	// To keeps the messages to this recipient (exact; "" for all).
	To string
	// Search keeps the messages whose wamid, recipient or idempotency key it is (exact; "" for
	// all): the dashboard's search box.
	Search string
	// After is the cursor: the wamid of the last message of the previous page ("" for the first
	// page). A wamid that is not one of the channel's messages gives ErrCursorNotFound.
	After string
	// Limit caps the page (a caller that wants to know whether another page follows asks for one
	// more than it shows).
	Limit int
}

// ErrCursorNotFound is returned by ListMessages for a cursor that names none of the channel's
// messages.
var ErrCursorNotFound = errors.New("cursor names no message of the channel")

// MessageError is the upstream's error of a failed message or status (errors[0]).
type MessageError struct {
	Code  int
	Title string
}

// MessageSummary is one outgoing message of a channel's list.
type MessageSummary struct {
	WAMID     string
	ChannelID uuid.UUID
	// To is the recipient ("" when unknown).
	To        string
	CreatedAt time.Time
	// Status is the latest upstream status (MessageStatuses).
	Status string
	// Error is the upstream's error of a failed message, nil otherwise.
	Error          *MessageError
	IdempotencyKey *string
	// BroadcastID is the broadcast that sent the message (messages.broadcast_id, migration 027),
	// nil for any other send.
	BroadcastID *uuid.UUID
}

// Timeline is the whole timeline of one message.
type Timeline struct {
	WAMID     string
	ChannelID uuid.UUID
	// Direction is DirectionOutgoing or DirectionIncoming.
	Direction string
	// To and From are the two ends: the customer's number (an outgoing message's recipient, an
	// incoming one's sender) and the channel's display phone number. nil when unknown.
	To, From *string
	// Status is the latest upstream status of an outgoing message, MessageReceived for an incoming
	// one.
	Status string
	Error  *MessageError
	// BroadcastID is the broadcast that sent an outgoing message (messages.broadcast_id), nil
	// for any other message.
	BroadcastID *uuid.UUID
	// CreatedAt is when the relay sent the message (or first heard of it), or when an incoming
	// one was stored.
	CreatedAt time.Time
	// Relay is the relay call that sent the message; nil when the relay did not see it (sent
	// around it) or its log row was dropped.
	Relay *MessageRelayCall
	// Statuses are the message's status events in upstream timestamp order (empty for an
	// incoming message).
	Statuses []StatusEvent
	// Deliveries are the deliveries of the message's events (its status events, or the incoming
	// message's event) to the org's webhooks.
	Deliveries []EventDelivery
}

// MessageRelayCall is the relay call that sent an outgoing message.
type MessageRelayCall struct {
	At time.Time
	// Status is the HTTP status answered to the caller.
	Status    int
	LatencyUS int
	// IdempotencyKey is the call's Idempotency-Key, nil without one.
	IdempotencyKey *string
	// Replayed: the call was answered from the idempotency store.
	Replayed bool
}

// StatusEvent is one status event of an outgoing message.
type StatusEvent struct {
	EventID uuid.UUID
	Status  string
	// Timestamp is the upstream's timestamp (zero: unknown).
	Timestamp time.Time
	Error     *MessageError
}

// EventDelivery is one delivery of a message's event to a webhook.
type EventDelivery struct {
	WebhookID uuid.UUID
	EventID   uuid.UUID
	// Type is the event's type.
	Type string
	// Status is the delivery's status as the delivery log shows it: pending, in_flight,
	// delivered or failed.
	Status   string
	Attempts int
}

// messageError returns the error of a message or status (nil when it has none).
func messageError(code *int32, title *string) *MessageError {
	if code == nil && title == nil {
		return nil
	}
	e := &MessageError{}
	if code != nil {
		e.Code = int(*code)
	}
	if title != nil {
		e.Title = *title
	}
	return e
}

// UnreportedWindow is how long a send the upstream has not reported on (it has no messages row
// yet) is listed from relay_log, as accepted. Statuses come within seconds; a send without any
// after this long is found by its wamid (MessageTimeline) and the dashboard's search. The
// window bounds what a list reads of relay_log when few sends match (status accepted, a rare
// recipient): at most this long of the channel's sends, 1,000 at the relay's 100 a minute.
// Giving such sends rows of their own later was measured and not done: the check that a send
// has none costs more per send than the messages write the relay log gave up (bench/README.md,
// "Figures behind the defaults (relay admission)").
const UnreportedWindow = 10 * time.Minute

// maxTies bounds the relay calls of one microsecond read to complete a list page.
const maxTies = 1000

// keySearchWindow is how far back the dashboard's search looks for an idempotency key (the
// relay log's index of keyed sends, relay_log_channel_key: channel, key, time): the idempotency
// store keeps a key a day.
const keySearchWindow = 24 * time.Hour

// maxUnreportedScan bounds the relay log's rows a list reads to find a channel's sends not
// reported on yet (unreportedSends): the latest sends of the window, in the order of the index
// of sends (relay_log_channel_sends), whatever the filters. Twice the sends a channel makes in
// UnreportedWindow at the relay's default limit (100 a minute); a channel sending faster lists
// its older unreported sends once their first status comes (or by their wamid).
const maxUnreportedScan = 2000

// maxKeyedMessages bounds the sends one idempotency key finds for the search.
const maxKeyedMessages = 100

// readGuardSQL sets, for the rest of its transaction, what planGuardSQL sets but a plan made for
// each call (custom, with the call's values: which filters are set decides the index): no plan
// shape that reads every matching row before it returns one — no sequential or bitmap scan, no
// hash or merge join. The timeline's list and the relay log's chart read a channel's rows in an
// index's order up to a limit; a bitmap scan and a sort, or a hash of the messages the
// unreported sends are checked against, would read all of them (the planner chose both once a
// channel had a few thousand rows).
const readGuardSQL = `SELECT set_config('plan_cache_mode', 'force_custom_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
	set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`

// queryGuarded runs sql under readGuardSQL: the guard and the statement in one pipeline, one
// round trip and one implicit transaction (the guard's settings end with it), as queryGeneric
// does for the hot statements' generic plans.
func queryGuarded(ctx context.Context, db batchSender, sql string, args ...any) (pgx.Rows, error) {
	return queryUnder(ctx, db, readGuardSQL, sql, args)
}

// ListMessages returns a page of the outgoing messages of one of the org's channels, newest
// first (see MessageFilter). An unknown channel, or one of another org, is ErrChannelNotFound.
//
// Two sources make the list (migration 021): the messages rows, which statuses create, and the
// relay calls of the last UnreportedWindow whose message has no row yet (status accepted). Each is read in order from its index up to the page's limit, and the
// two are merged; the relay log is only read as far back as the messages page reaches when
// that page is full, so a page costs about two index ranges of its own length.
func (s *Store) ListMessages(ctx context.Context, orgID, channelID uuid.UUID, f MessageFilter) ([]MessageSummary, error) {
	now := s.now()
	// The cursor's position: (created_at, wamid) of the page's last message, in whichever source
	// holds it. The relay log is read by wamid alone, its channel checked on the row found: with
	// the channel in the condition, Postgres reads the channel's index in time order for the
	// earliest call, a scan of the channel's log (see messagesUpsertSQL).
	var before *time.Time
	if f.After != "" {
		err := s.pool.QueryRow(ctx, `
			SELECT coalesce(
				(SELECT created_at FROM messages WHERE wamid = $1 AND channel_id = $2 AND org_id = $3),
				(SELECT CASE WHEN channel_id = $2 AND org_id = $3 THEN at END FROM relay_log
				 WHERE wamid = $1 AND NOT replayed ORDER BY at LIMIT 1))`,
			f.After, channelID, orgID).Scan(&before)
		if err != nil {
			return nil, fmt.Errorf("list messages: %w", err)
		}
		if before == nil {
			return nil, s.emptyMessagesReason(ctx, orgID, channelID, ErrCursorNotFound)
		}
	}
	// A messages row holds a number's digits (a status's recipient_id); the relay log the "to"
	// the caller wrote.
	to, digits := recipientKey(f.To), phoneDigits(f.To)
	search := recipientKey(f.Search)
	// The wamids the searched text is the idempotency key of (a message id is no key).
	var keyed []string
	if f.Search != "" && !strings.HasPrefix(f.Search, "wamid.") && len(f.Search) <= MaxIdempotencyKeyLen {
		rows, err := queryGuarded(ctx, s.pool, `
			SELECT DISTINCT wamid FROM (
				SELECT wamid FROM relay_log
				WHERE channel_id = $1 AND idempotency_key = $4 AND at >= $3 AND wamid IS NOT NULL AND org_id = $2
				LIMIT $5) k`, channelID, orgID, now.Add(-keySearchWindow), f.Search, maxKeyedMessages)
		if err != nil {
			return nil, fmt.Errorf("list messages: %w", err)
		}
		if keyed, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("list messages: %w", err)
		}
	}

	// The reported messages. The cursor is compared as (created_at, wamid), the order the
	// channel indexes of migration 020 hold (created_at DESC, wamid DESC): a page is an index
	// range read in order. A search is two index reads, never a filter over the channel's
	// messages: the wamids it names (the text itself, the sends of the key it is) by primary
	// key, and the recipient it is through the channel's recipient index, in order up to the
	// page's limit.
	sql := `
		SELECT m.wamid, m.recipient, m.created_at, m.status, m.error_code, m.error_title, m.broadcast_id
		FROM messages m
		WHERE m.channel_id = $1 AND m.org_id = $2
		  AND ($3 = '' OR m.status = $3)
		  AND ($4 = '' OR m.recipient = $4)
		  AND ($5::timestamptz IS NULL OR (m.created_at, m.wamid) < ($5, $6) AND m.created_at <= $5)
		ORDER BY m.created_at DESC, m.wamid DESC
		LIMIT $7`
	args := []any{channelID, orgID, f.Status, to, before, f.After, f.Limit}
	if f.Search != "" {
		args = []any{channelID, orgID, f.Status, to, append([]string{f.Search}, keyed...), search, before, f.After, f.Limit}
		sql = `
		SELECT * FROM (
			SELECT m.wamid, m.recipient, m.created_at, m.status, m.error_code, m.error_title, m.broadcast_id
			FROM messages m
			WHERE m.wamid = ANY($5::text[]) AND m.channel_id = $1 AND m.org_id = $2
			  AND ($3 = '' OR m.status = $3)
			  AND ($4 = '' OR m.recipient = $4)
			  AND ($7::timestamptz IS NULL OR (m.created_at, m.wamid) < ($7, $8) AND m.created_at <= $7)
			UNION
			(SELECT m.wamid, m.recipient, m.created_at, m.status, m.error_code, m.error_title, m.broadcast_id
			 FROM messages m
			 WHERE m.channel_id = $1 AND m.recipient = $6 AND m.org_id = $2
			   AND ($3 = '' OR m.status = $3)
			   AND ($4 = '' OR m.recipient = $4)
			   AND ($7::timestamptz IS NULL OR (m.created_at, m.wamid) < ($7, $8) AND m.created_at <= $7)
			 ORDER BY m.created_at DESC, m.wamid DESC
			 LIMIT $9)
		) m
		ORDER BY m.created_at DESC, m.wamid DESC
		LIMIT $9`
	}
	// Planned for each call: which filters are set decides the index.
	rows, err := queryGuarded(ctx, s.pool, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MessageSummary, error) {
		m := MessageSummary{ChannelID: channelID}
		var code *int32
		var title *string
		err := r.Scan(&m.WAMID, &m.To, &m.CreatedAt, &m.Status, &code, &title, &m.BroadcastID)
		m.Error = messageError(code, title)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("list messages: %w", err)
	}

	// The sends not reported on yet: accepted.
	if f.Status == "" || f.Status == MessageAccepted {
		floor := now.Add(-UnreportedWindow)
		if len(out) == f.Limit && out[len(out)-1].CreatedAt.After(floor) {
			floor = out[len(out)-1].CreatedAt // older sends cannot make this page
		}
		unreported, err := s.unreportedSends(ctx, orgID, channelID, f, floor, before, digits)
		if err != nil {
			return nil, fmt.Errorf("list messages: %w", err)
		}
		if len(unreported) > 0 {
			out = mergeMessages(out, unreported, f.Limit)
		}
	}
	if len(out) == 0 {
		return out, s.emptyMessagesReason(ctx, orgID, channelID, nil)
	}
	if err := s.relaySide(ctx, orgID, out); err != nil {
		return nil, fmt.Errorf("list messages: %w", err)
	}
	return out, nil
}

// recipientKey is how a recipient looks in messages: its digits when it reads as a phone number
// (a status's recipient_id), else as it is.
func recipientKey(s string) string {
	if d := phoneDigits(s); d != "" {
		return d
	}
	return s
}

// unreportedSends returns up to f.Limit of the channel's sends since floor (before the cursor
// before/f.After, when set) that match f's recipient and search and that no status has
// reported on: status accepted, read from relay_log. digits is f.To's digits.
func (s *Store) unreportedSends(ctx context.Context, orgID, channelID uuid.UUID, f MessageFilter, floor time.Time,
	before *time.Time, digits string) ([]MessageSummary, error) {
	// In the order of relay_log's index of sends (relay_log_channel_sends, migration 023: the
	// channel's sends with a wamid that are not replays; at only: a tie-break on wamid would make
	// Postgres sort the whole window), then every call of the last one's time, so that the merge
	// cuts a group of equal times where the order (at, wamid) says. The index is read from the
	// cursor back for at most maxUnreportedScan rows, and the filters apply to those: a list reads
	// no more of the relay log whatever the filters and however many of the window's sends are
	// reported on already.
	read := func(floor time.Time, limit int, tie *time.Time) ([]MessageSummary, error) {
		rows, err := queryGuarded(ctx, s.pool, `
			SELECT r.wamid, coalesce(r.recipient, ''), r.at, r.idempotency_key
			FROM (
				SELECT r.wamid, r.recipient, r.at, r.idempotency_key
				FROM relay_log r
				WHERE r.channel_id = $1 AND r.at >= $3 AND r.wamid IS NOT NULL AND NOT r.replayed
				  AND ($7::timestamptz IS NULL OR r.at <= $7)
				  AND ($10::timestamptz IS NULL OR r.at = $10)
				  AND r.org_id = $2
				ORDER BY r.at DESC
				LIMIT $11
			) r
			WHERE ($4 = '' OR r.recipient = $4 OR regexp_replace(r.recipient, '[^0-9]', '', 'g') = $5)
			  AND ($6 = '' OR r.wamid = $6 OR r.recipient = $6 OR r.idempotency_key = $6)
			  AND ($7::timestamptz IS NULL OR (r.at, r.wamid) < ($7, $8))
			  AND NOT EXISTS (SELECT 1 FROM messages x WHERE x.wamid = r.wamid)
			ORDER BY r.at DESC
			LIMIT $9`,
			channelID, orgID, floor, f.To, digits, f.Search, before, f.After, limit, tie, max(maxUnreportedScan, limit))
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (MessageSummary, error) {
			m := MessageSummary{ChannelID: channelID, Status: MessageAccepted}
			err := r.Scan(&m.WAMID, &m.To, &m.CreatedAt, &m.IdempotencyKey)
			return m, err
		})
	}
	unreported, err := read(floor, f.Limit, nil)
	if err != nil || len(unreported) < f.Limit {
		return unreported, err
	}
	last := unreported[len(unreported)-1].CreatedAt
	ties, err := read(last, maxTies, &last)
	return append(unreported, ties...), err // each merged once
}

// mergeMessages merges two lists in the list's order (created_at, then wamid, descending) into
// at most limit messages; a wamid is kept once (in both: a send reported on between the reads;
// twice in b: two calls that were not replays of each other answered with one wamid).
func mergeMessages(a, b []MessageSummary, limit int) []MessageSummary {
	seen := make(map[string]bool, len(a)+len(b))
	for _, m := range a {
		seen[m.WAMID] = true
	}
	for _, m := range b {
		if !seen[m.WAMID] {
			seen[m.WAMID] = true
			a = append(a, m)
		}
	}
	slices.SortStableFunc(a, func(x, y MessageSummary) int {
		if c := y.CreatedAt.Compare(x.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(y.WAMID, x.WAMID)
	})
	return a[:min(len(a), limit)]
}

// relaySide fills in what the relay log knows of the listed messages that came from messages
// rows: the idempotency key of the call that sent each and the recipient as the caller wrote it
// (a status's recipient_id is its digits), found through relay_log's wamid index in the days
// around the message's creation (partitions pruned at run time).
func (s *Store) relaySide(ctx context.Context, orgID uuid.UUID, ms []MessageSummary) error {
	var wamids []string
	var ats []time.Time
	for _, m := range ms {
		if m.IdempotencyKey == nil {
			wamids, ats = append(wamids, m.WAMID), append(ats, m.CreatedAt)
		}
	}
	if len(wamids) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, `
		SELECT u.wamid, r.idempotency_key, coalesce(r.recipient, '')
		FROM unnest($1::text[], $2::timestamptz[]) AS u(wamid, at)
		CROSS JOIN LATERAL (
			SELECT r.idempotency_key, r.recipient FROM relay_log r
			WHERE r.wamid = u.wamid AND r.org_id = $3
			  AND r.at >= u.at - $4::interval AND r.at <= u.at + interval '1 hour'
			ORDER BY r.at LIMIT 1) r`, wamids, ats, orgID, relayLookBack)
	if err != nil {
		return err
	}
	type side struct {
		key       *string
		recipient string
	}
	found := map[string]side{}
	var w, recipient string
	var key *string
	if _, err := pgx.ForEachRow(rows, []any{&w, &key, &recipient}, func() error {
		found[w] = side{key, recipient}
		return nil
	}); err != nil {
		return err
	}
	for i := range ms {
		if r, ok := found[ms[i].WAMID]; ok {
			ms[i].IdempotencyKey = r.key
			if r.recipient != "" && IsText(r.recipient) {
				ms[i].To = r.recipient
			}
		}
	}
	return nil
}

// relayLookBack is how long before a message's created_at its relay call is looked for (and,
// when a status creates the row, before the status's upstream timestamp): created_at is the
// call's time, or, for a message whose call was not found, its first status's arrival, seconds
// after the send. A message whose first status came later (a lone read, days after) lists
// without its key; its timeline, which reads every partition, has it.
const relayLookBack = "1 day"

// emptyMessagesReason says why a list is empty when it is the channel's fault (unknown, or
// another org's) and else returns otherwise.
func (s *Store) emptyMessagesReason(ctx context.Context, orgID, channelID uuid.UUID, otherwise error) error {
	var channel bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM channels WHERE id = $1 AND org_id = $2)`,
		channelID, orgID).Scan(&channel); err != nil {
		return fmt.Errorf("list messages: %w", err)
	}
	if !channel {
		return ErrChannelNotFound
	}
	return otherwise
}

// phoneDigits returns the digits of s when s reads as a phone number (digits, with "+", spaces,
// dashes, dots and parentheses), else "": a status's recipient_id is the number's digits, a
// caller's "to" may be written either way.
func phoneDigits(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			b = append(b, c)
		case c == '+' || c == ' ' || c == '-' || c == '.' || c == '(' || c == ')':
		default:
			return ""
		}
	}
	return string(b)
}

// relayCallRow is one relay_log row of a message's timeline as read.
type relayCallRow struct {
	at                time.Time
	channel           uuid.UUID
	status, latencyUS int32
	key, recipient    *string
	replayed          bool
	display           *string // the channel's display phone number
}

// timelineEvent is one event of a message's timeline as read.
type timelineEvent struct {
	id, channel uuid.UUID
	typ         string
	createdAt   time.Time
	payload     []byte
	display     *string // the channel's display phone number
}

// MessageTimeline returns the timeline of one of the org's messages: an outgoing one (a row of
// messages) with its relay call, its status events and their deliveries, else an incoming one
// (an event of type messages with that id) with its deliveries. Another org's message, or an
// unknown id, is ErrMessageNotFound.
func (s *Store) MessageTimeline(ctx context.Context, orgID uuid.UUID, wamid string) (*Timeline, error) {
	if nullText(wamid) == nil {
		return nil, ErrMessageNotFound // no stored message has such an id
	}
	// The message's row and its events in one round trip.
	b := &pgx.Batch{}
	t := &Timeline{WAMID: wamid}
	var found bool
	b.Queue(`
		SELECT m.channel_id, m.recipient, c.display_phone_number, m.created_at, m.status, m.error_code, m.error_title, m.broadcast_id
		FROM messages m LEFT JOIN channels c ON c.id = m.channel_id
		WHERE m.wamid = $1 AND m.org_id = $2`, wamid, orgID).QueryRow(func(row pgx.Row) error {
		var to string
		var code *int32
		var title *string
		err := row.Scan(&t.ChannelID, &to, &t.From, &t.CreatedAt, &t.Status, &code, &title, &t.BroadcastID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		t.Direction, t.Error = DirectionOutgoing, messageError(code, title)
		if to != "" {
			t.To = &to
		}
		return nil
	})
	// The relay calls that answered with this wamid, first first (a retry answered from the
	// idempotency store repeats it): found through relay_log's wamid index in every partition.
	var calls []relayCallRow
	b.Queue(`
		SELECT r.at, r.channel_id, r.status, r.latency_us, r.idempotency_key, r.replayed, r.recipient, c.display_phone_number
		FROM relay_log r LEFT JOIN channels c ON c.id = r.channel_id
		WHERE r.wamid = $1 AND r.org_id = $2
		ORDER BY r.at`, wamid, orgID).Query(func(rows pgx.Rows) error {
		var err error
		calls, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (relayCallRow, error) {
			var c relayCallRow
			err := r.Scan(&c.at, &c.channel, &c.status, &c.latencyUS, &c.key, &c.replayed, &c.recipient, &c.display)
			return c, err
		})
		return err
	})
	var events []timelineEvent
	b.Queue(`
		SELECT e.id, e.channel_id, e.type, e.created_at, e.payload, c.display_phone_number
		FROM events e LEFT JOIN channels c ON c.id = e.channel_id
		WHERE e.wamid = $1 AND e.org_id = $2 AND e.type IN ('message_status', 'messages')
		ORDER BY e.created_at, e.id`, wamid, orgID).Query(func(rows pgx.Rows) error {
		var err error
		events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (timelineEvent, error) {
			var e timelineEvent
			err := r.Scan(&e.id, &e.channel, &e.typ, &e.createdAt, &e.payload, &e.display)
			return e, err
		})
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("message timeline: %w", err)
	}

	// The relay's side: the first call of the message's channel (of the first call's channel when
	// no status has made the message's row yet: a send not reported on, status accepted).
	for _, c := range calls {
		if !found {
			found = true
			t.ChannelID, t.Direction, t.Status, t.CreatedAt, t.From = c.channel, DirectionOutgoing, MessageAccepted, c.at, c.display
			if c.recipient != nil && *c.recipient != "" {
				t.To = c.recipient
			}
		}
		if c.channel != t.ChannelID {
			continue
		}
		if t.Relay == nil {
			t.Relay = &MessageRelayCall{At: c.at, Status: int(c.status), LatencyUS: int(c.latencyUS), IdempotencyKey: c.key}
			t.CreatedAt = c.at // when the relay sent it
			if c.recipient != nil && *c.recipient != "" {
				t.To = c.recipient // as the caller wrote it (a status's recipient_id is its digits)
			}
		}
		t.Relay.Replayed = t.Relay.Replayed || c.replayed
	}

	// The message's own events: an outgoing message's statuses in its channel, else an incoming
	// message's event(s).
	mine := events[:0:0]
	for _, e := range events {
		if found && e.typ == "message_status" && e.channel == t.ChannelID ||
			!found && e.typ == "messages" && (len(mine) == 0 || e.channel == mine[0].channel) {
			mine = append(mine, e)
		}
	}
	if !found {
		if len(mine) == 0 {
			return nil, ErrMessageNotFound
		}
		t.ChannelID, t.Direction, t.Status, t.CreatedAt, t.To = mine[0].channel, DirectionIncoming, MessageReceived, mine[0].createdAt, mine[0].display
		if from := incomingFrom(mine[0].payload); from != "" {
			t.From = &from
		}
	}
	t.Statuses = []StatusEvent{}
	if found {
		for _, e := range mine {
			t.Statuses = append(t.Statuses, statusEvent(e))
		}
		// Upstream timestamp order; equal timestamps (seconds) in the order of the status's rank,
		// then of arrival.
		slices.SortStableFunc(t.Statuses, func(a, b StatusEvent) int {
			if c := a.Timestamp.Compare(b.Timestamp); c != 0 {
				return c
			}
			ra, oka := StatusRank(a.Status)
			rb, okb := StatusRank(b.Status)
			if !oka || !okb {
				return 0
			}
			return cmp.Compare(ra, rb)
		})
	}
	var err error
	if t.Deliveries, err = s.eventDeliveries(ctx, orgID, mine); err != nil {
		return nil, fmt.Errorf("message timeline: %w", err)
	}
	return t, nil
}

// statusEvent reads a status event's payload ({..., "data": {"status": {...}}}).
func statusEvent(e timelineEvent) StatusEvent {
	var p struct {
		Data struct {
			Status json.RawMessage `json:"status"`
		} `json:"data"`
	}
	_ = json.Unmarshal(e.payload, &p) // stored by StoreEvents: valid JSON
	_, st, _ := ParseMessageStatus(p.Data.Status)
	out := StatusEvent{EventID: e.id, Status: st.Status, Timestamp: st.Timestamp}
	if st.ErrorCode != 0 || st.ErrorTitle != "" {
		out.Error = &MessageError{Code: st.ErrorCode, Title: st.ErrorTitle}
	}
	return out
}

// incomingFrom reads the sender of an incoming message's event ({..., "data": {"message":
// {"from": ...}}}); "" when it has none.
func incomingFrom(payload []byte) string {
	var p struct {
		Data struct {
			Message struct {
				From json.RawMessage `json:"from"`
			} `json:"message"`
		} `json:"data"`
	}
	_ = json.Unmarshal(payload, &p)
	return jsonString(p.Data.Message.From)
}

// eventDeliveries returns the deliveries of events to the org's webhooks, in the events' order.
// Each event's deliveries are found through its webhooks' index (deliveries_webhook: webhook,
// then the event's created_at, which its deliveries share) in the event's day partition only.
func (s *Store) eventDeliveries(ctx context.Context, orgID uuid.UUID, events []timelineEvent) ([]EventDelivery, error) {
	out := []EventDelivery{}
	if len(events) == 0 {
		return out, nil
	}
	ids := make([]uuid.UUID, len(events))
	ats := make([]time.Time, len(events))
	types := make([]string, len(events))
	for i, e := range events {
		ids[i], ats[i], types[i] = e.id, e.createdAt, e.typ
	}
	rows, err := s.pool.Query(ctx, `
		SELECT d.webhook_id, d.event_id, e.type, `+deliveryStatusSQL+`, d.attempts
		FROM unnest($1::uuid[], $2::timestamptz[], $3::text[]) WITH ORDINALITY AS e(id, created_at, type, n)
		JOIN webhooks w ON w.org_id = $4
		JOIN deliveries d ON d.webhook_id = w.id AND d.created_at = e.created_at AND d.event_id = e.id
		LEFT JOIN delivery_queue q ON q.delivery_id = d.id
		ORDER BY e.n, d.id`, ids, ats, types, orgID)
	if err != nil {
		return nil, err
	}
	return pgx.AppendRows(out, rows, func(r pgx.CollectableRow) (EventDelivery, error) {
		var d EventDelivery
		err := r.Scan(&d.WebhookID, &d.EventID, &d.Type, &d.Status, &d.Attempts)
		return d, err
	})
}
