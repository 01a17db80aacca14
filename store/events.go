package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DeliveriesNotifyChannel is the Postgres channel announcing new due deliveries.
const DeliveriesNotifyChannel = "wabarelay_deliveries"

// IncomingItem is one upstream message or status to turn into an event: what inbound.Parse
// splits a webhook batch into, and what StoreEvents stores.
type IncomingItem struct {
	// Type is the event type: "messages" (inbound.TypeMessage), "message_status"
	// (inbound.TypeStatus) or "message_template_status_update" (inbound.TypeTemplateStatus).
	Type string
	// PhoneNumberID (value.metadata.phone_number_id) routes the item to its channel. Empty: the
	// item is routed by WabaID instead, one event per channel of that business account (the
	// upstream's template changes name no number).
	PhoneNumberID string
	// WabaID is the item's WhatsApp Business Account id (entry.id). Not stored: the channel
	// routed by PhoneNumberID knows its account.
	WabaID string
	// DedupeKey identifies the upstream item and state across re-sends; a repeat is dropped:
	// "m:"+message.id for messages, "s:"+status.id+":"+status.status for statuses (each state of
	// a message — sent, delivered, read, … — is its own event). Any length and any bytes: a key longer than MaxDedupeKeyLen bytes, or not text, is stored and matched
	// by its digest (see dedupeKey). Keys beginning with "h:" are reserved for those digests.
	DedupeKey string
	// Data is the event's data object, stored and delivered verbatim: {"message":<upstream
	// message>,"contact":<its value.contacts entry, or null>} for messages, {"status":<upstream
	// status>} for statuses.
	Data json.RawMessage
	// ObjectIDs are upstream object ids (the media a message carries: image, audio, video,
	// document, sticker) the item hands to its channel; they are
	// recorded with the events, so the relay's scope admits them from then on. An id that is
	// not text or longer than MaxObjectIDLen bytes is not recorded (InboundResult.SkippedObjectIDs):
	// no upstream object has such an id, and the event is stored all the same.
	ObjectIDs []string
	// WAMID is the upstream message id the item is about (a message's id, a status's id), stored
	// on the event for the message timeline. Empty for items about no message.
	WAMID string
	// Traceparent is the W3C traceparent of the intake request that carried the item, stored on
	// the event so that its delivery attempts continue the trace. Empty when tracing is off.
	Traceparent string
	// Status is what a status item says about its outgoing message (nil for other items): when
	// the event is stored (not a duplicate), it moves the message's latest status forward in
	// messages, or creates the message's row (see StoreEvents).
	Status *MessageStatus
	// Customer is the customer the item is about (wa_id: a message's "from", a status's
	// "recipient_id"); "" for items about the channel itself. With PhoneNumberID it is the
	// item's conversation (ConversationKey), which orders the deliveries of webhooks with
	// ordering "conversation".
	Customer string
	// Sent is the upstream's timestamp of the item (zero: unknown). An earlier copy can only
	// have been stored after it, so the look-up for duplicates starts on its day instead of
	// DedupeWindow ago: a fresh item costs no look-up in earlier days' partitions.
	Sent time.Time
}

// InboundResult counts what StoreEvents did with a batch.
type InboundResult struct {
	Events     int // new events stored
	Duplicates int // items already stored earlier (upstream re-sends)
	Unknown    int // items for numbers no channel has
	Deliveries int // deliveries created
	// Queued counts deliveries created pending for active webhooks (due now, not claimed).
	Queued int
	// Claimed are the deliveries created already claimed (see Claim).
	Claimed []ClaimedDelivery
	// ByType counts new events per type.
	ByType map[string]int
	// ObjectChannels are the channels handed new objects (media ids) by the batch: a caller
	// holding their relay scope in memory reloads them.
	ObjectChannels []uuid.UUID
	// SkippedObjectIDs counts the items' object ids not recorded for the relay scope: not
	// text, or longer than MaxObjectIDLen bytes.
	SkippedObjectIDs int
}

// MaxDedupeKeyLen is the longest dedupe key (bytes) stored as it is. A longer one is stored as
// its digest, so that no upstream identifier, whatever its length, is refused by the events'
// unique index (a btree row holds at most about 2.7 kB): see dedupeKey.
const MaxDedupeKeyLen = 256

// MaxObjectIDLen is the longest object id (bytes) recorded for a channel's relay scope from
// its events. Upstream ids are tens of bytes; a longer one names no upstream object, and the
// scope's primary key would refuse one of a few kilobytes.
const MaxObjectIDLen = 512

// dedupeKey returns the key stored for the upstream item key k: k itself when it is text of
// at most MaxDedupeKeyLen bytes, else "h:" + hex SHA-256 of its bytes (66 bytes, whatever k
// holds). Migration 012 gave the rows stored before it the same form, so a re-send of an item
// stored then is still recognised.
func dedupeKey(k string) string {
	if len(k) <= MaxDedupeKeyLen && IsText(k) {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "h:" + hex.EncodeToString(sum[:])
}

// Claim asks StoreEvents to insert up to Max of the new deliveries to active webhooks already
// claimed by Instance for Lease (in flight, claim 0, no attempt recorded yet — attempts are
// counted when their outcome is recorded —) and to return them, so that the inbound handler's
// own dispatcher can start them at once (inbound.HandOff). Only webhooks with no due first
// attempt waiting in the queue take them, so that a new event never overtakes an older due
// first attempt of its webhook; it may overtake the webhook's due retries (only unordered
// webhooks take hand-offs, and their retries are out of order by nature: issue 35, decision 2).
// The zero Claim claims nothing.
type Claim struct {
	Instance string
	Lease    time.Duration
	Max      int
}

// ClaimedDelivery is a delivery claimed for an attempt: by StoreEvents (Claim) or Queue.Claim.
type ClaimedDelivery struct {
	ID, EventID, WebhookID uuid.UUID
	// OrgID is the webhook's org (the dispatcher's per-org cap counts its attempts).
	OrgID uuid.UUID
	// CreatedAt is the delivery's (and its event's) creation time: it finds their partitions.
	CreatedAt time.Time
	// Attempt is the number of the attempt to make (attempts recorded + 1); Claim is the
	// delivery's claim_seq under this claim (0: inserted claimed by StoreEvents). With the
	// instance they fence the attempt's outcome.
	Attempt, Claim int
	URL            string
	Payload        []byte // the event JSON, as stored
	// Probe: claimed by ClaimProbes, the one attempt of a failing webhook (store/health.go).
	Probe bool
	// PreviousSecretExpiresAt is the webhook's previous_secret_expires_at (nil: never rotated):
	// it changes with every rotation, so the dispatcher re-reads the webhook's secrets when it
	// differs from theirs.
	PreviousSecretExpiresAt *time.Time
	// Traceparent is the W3C traceparent stored with the event (IncomingItem.Traceparent): its
	// attempts continue that trace. Empty when the event was stored without tracing.
	Traceparent string
	// Conversation is the delivery's conversation (ConversationKey) when its webhook was
	// ordered when it was queued; nil otherwise. Recording its end promotes the next one.
	Conversation *int64
}

// EncodeEvent returns the JSON delivered to webhooks for an event (see Event), with data
// (the upstream's objects) kept byte for byte: not re-encoded, so not HTML-escaped, not
// normalised, whatever bytes it holds.
func EncodeEvent(id uuid.UUID, typ, createdAt string, channelID uuid.UUID, phoneNumberID string, data json.RawMessage) []byte {
	pn, _ := json.Marshal(phoneNumberID) // text: it routed the item to a channel
	return encodeEvent(id, typ, createdAt, channelID, pn, data)
}

// encodeEvent is EncodeEvent with the phone number id given as JSON (null for a channel never
// connected: its channel_status events).
func encodeEvent(id uuid.UUID, typ, createdAt string, channelID uuid.UUID, pn []byte, data json.RawMessage) []byte {
	b := make([]byte, 0, 160+len(typ)+len(pn)+len(data))
	b = append(b, `{"id":"`...)
	b = append(b, id.String()...)
	b = append(b, `","type":"`...)
	b = append(b, typ...)
	b = append(b, `","created_at":"`...)
	b = append(b, createdAt...)
	b = append(b, `","channel_id":"`...)
	b = append(b, channelID.String()...)
	b = append(b, `","phone_number_id":`...)
	b = append(b, pn...)
	b = append(b, `,"data":`...)
	b = append(b, data...)
	return append(b, '}')
}

// eventTimeFormat is the format of an event's created_at (UTC, milliseconds).
const eventTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// Event is the JSON delivered to webhooks.
type Event struct {
	ID            uuid.UUID       `json:"id"`
	Type          string          `json:"type"`
	CreatedAt     string          `json:"created_at"`
	ChannelID     uuid.UUID       `json:"channel_id"`
	PhoneNumberID string          `json:"phone_number_id"`
	Data          json.RawMessage `json:"data"`
}

// StoreEvents stores a batch of upstream items as events, with one delivery per matching
// webhook (active or paused, of the channel's org, subscribed to the event type, with org scope
// or the channel assigned), in one transaction, and announces the deliveries left pending.
// Up to claim.Max deliveries to active webhooks are created already claimed (see Claim).
// Items for unknown numbers are counted and dropped; items already stored are counted as
// duplicates. It is StoreEventsGroup for one post.
func (s *Store) StoreEvents(ctx context.Context, items []IncomingItem, claim Claim) (InboundResult, error) {
	res, err := s.StoreEventsGroup(ctx, []Post{{Items: items, Claim: claim}})
	if err != nil {
		return InboundResult{}, err
	}
	return res[0], nil
}

// Post is one intake post's share of a StoreEventsGroup: its items and its hand-off claim.
type Post struct {
	Items []IncomingItem
	Claim Claim
}

// StoreEventsGroup stores the items of several posts in one transaction (group commit): one
// commit and one statement of each kind for all of them, each post's result as if it had been
// stored alone by StoreEvents, in the order of posts. Every claim with Max > 0 must name the
// same Instance and Lease (one dispatcher's hand-off); each post gets at most its own Max
// deliveries claimed, from its own events. An item of one post that another post of the
// group also carries is stored once, and counted as a duplicate by the other post, as it
// would be had the posts been stored one after the other. On an error nothing is stored, for any post.
func (s *Store) StoreEventsGroup(ctx context.Context, posts []Post) ([]InboundResult, error) {
	results := make([]InboundResult, len(posts))
	for i := range results {
		results[i].ByType = map[string]int{}
	}
	var numbers, wabas []string
	var claim Claim
	for _, p := range posts {
		if p.Claim.Max > 0 {
			if claim.Max > 0 && (p.Claim.Instance != claim.Instance || p.Claim.Lease != claim.Lease) {
				return nil, errors.New("store events: the posts of a group claim for different instances or leases")
			}
			claim.Instance, claim.Lease, claim.Max = p.Claim.Instance, p.Claim.Lease, claim.Max+p.Claim.Max
		}
		for _, it := range p.Items {
			switch {
			case it.PhoneNumberID == "":
				if IsText(it.WabaID) {
					wabas = append(wabas, it.WabaID)
				}
			case IsText(it.PhoneNumberID): // an id that is not text is no channel's number
				numbers = append(numbers, it.PhoneNumberID)
			}
		}
	}
	if len(numbers) == 0 && len(wabas) == 0 {
		for i, p := range posts {
			results[i].Unknown = len(p.Items)
		}
		return results, nil
	}
	type channelRef struct {
		id, org uuid.UUID
		pn      string
	}
	channels := map[string]channelRef{}
	byWaba := map[string][]channelRef{} // items routed by business account (PhoneNumberID empty)
	rows, err := s.pool.Query(ctx, `
		SELECT phone_number_id, id, org_id, waba_id FROM channels
		WHERE phone_number_id = ANY($1) OR (waba_id = ANY($2) AND phone_number_id IS NOT NULL)
		ORDER BY created_at, id`, numbers, wabas)
	if err != nil {
		return nil, fmt.Errorf("store events: channels: %w", err)
	}
	for rows.Next() {
		var c channelRef
		var waba *string
		if err := rows.Scan(&c.pn, &c.id, &c.org, &waba); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store events: channels: %w", err)
		}
		channels[c.pn] = c
		if waba != nil && slices.Contains(wabas, *waba) {
			byWaba[*waba] = append(byWaba[*waba], c)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store events: channels: %w", err)
	}

	now := s.now().UTC()
	created := now.Format(eventTimeFormat)
	in := inboundBatch{now: now, leaseFrom: s.nowArg(), claim: claim, maxes: make([]int32, len(posts))}
	today := day(now)
	in.lookback = today // the first day a copy of some item could have been stored on
	for pi, p := range posts {
		in.maxes[pi] = int32(max(p.Claim.Max, 0))
		res := &results[pi]
		for _, it := range p.Items {
			targets := byWaba[it.WabaID]
			if it.PhoneNumberID != "" {
				c, ok := channels[it.PhoneNumberID]
				targets = []channelRef{c}
				if !ok {
					targets = nil
				}
			}
			if len(targets) == 0 {
				res.Unknown++
				continue
			}
			// (an hour's margin for the upstream's clock)
			from := day(it.Sent.Add(-time.Hour))
			if earliest := today.Add(-DedupeWindow); from.Before(earliest) {
				from = earliest // (also an unknown Sent: the whole window)
			}
			if from.Before(in.lookback) {
				in.lookback = from
			}
			for _, c := range targets {
				id := newID()
				in.ids, in.chIDs, in.orgIDs = append(in.ids, id), append(in.chIDs, c.id), append(in.orgIDs, c.org)
				in.posts = append(in.posts, int32(pi))
				in.types, in.keys = append(in.types, it.Type), append(in.keys, dedupeKey(it.DedupeKey))
				in.convs = append(in.convs, ConversationKey(c.pn, it.Customer))
				in.wamids, in.traces = append(in.wamids, nullText(it.WAMID)), append(in.traces, nullText(it.Traceparent))
				if it.Status != nil && in.statuses == nil {
					in.statuses = make([]*MessageStatus, len(in.ids)-1, cap(in.ids))
				}
				if in.statuses != nil {
					in.statuses = append(in.statuses, it.Status)
				}
				in.payloads = append(in.payloads, EncodeEvent(id, it.Type, created, c.id, c.pn, it.Data))
				in.contacts.add(c.id, &it, now)
				for _, o := range it.ObjectIDs {
					if !recordableObjectID(o) {
						res.SkippedObjectIDs++
						continue
					}
					in.objChannels, in.objIDs = append(in.objChannels, c.id), append(in.objIDs, o)
					in.objPosts = append(in.objPosts, int32(pi))
				}
			}
		}
	}
	if len(in.ids) == 0 {
		return results, nil
	}
	ptrs := make([]*InboundResult, len(results))
	for i := range results {
		ptrs[i] = &results[i]
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error { return in.storeGroup(ctx, tx, ptrs) })
	if isMissingPartition(err) {
		// The partition manager is behind (or the clock jumped): make today's and retry once.
		if err = s.EnsurePartitions(ctx, now.AddDate(0, 0, -1), now.AddDate(0, 0, PartitionsAhead)); err == nil {
			for i := range results {
				results[i] = InboundResult{ByType: map[string]int{}, Unknown: results[i].Unknown, SkippedObjectIDs: results[i].SkippedObjectIDs}
			}
			err = s.inTx(ctx, func(tx pgx.Tx) error { return in.storeGroup(ctx, tx, ptrs) })
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store events: %w", err)
	}
	return results, nil
}

// DedupeWindow is how long an upstream item is recognised as a duplicate at least (the
// upstream retries for up to 7 days): today's events partition by its unique index, the
// partitions of the 7 days before by a look-up.
const DedupeWindow = 7 * 24 * time.Hour

// inboundBatch is one StoreEvents batch: parallel arrays of the items of known channels.
type inboundBatch struct {
	ids, chIDs, orgIDs []uuid.UUID
	types, keys        []string
	convs              []int64 // ConversationKey of each item
	wamids, traces     []*string
	statuses           []*MessageStatus // each item's Status; nil when the batch holds none
	payloads           [][]byte
	objChannels        []uuid.UUID
	objIDs             []string
	now                time.Time
	// leaseFrom is when the hand-off's leases start (nil: the database's now(); see package
	// clock).
	leaseFrom *time.Time
	lookback  time.Time // the first day to look for duplicates in (see IncomingItem.Sent)
	// claim is the hand-off of the whole batch: Instance and Lease, Max the sum of maxes.
	claim Claim
	// posts is the post (index into the results, see StoreEventsGroup) of each item, objPosts
	// of each object id; maxes the claim's Max of each post. Nil: one post, claim.Max.
	posts, objPosts, maxes []int32
	contacts               contactBatch // the customers' newest incoming messages (store/contacts.go)
}

// store is storeGroup for a batch of one post.
func (in *inboundBatch) store(ctx context.Context, tx pgx.Tx, res *InboundResult) error {
	return in.storeGroup(ctx, tx, []*InboundResult{res})
}

// post returns the post of item i (0 without posts).
func (in *inboundBatch) post(i int) int {
	if in.posts == nil {
		return 0
	}
	return int(in.posts[i])
}

// storeGroup inserts the batch in tx: the events that are not duplicates, the objects they hand
// their channels, one delivery log row and one queue row per matching webhook; each post's
// counts go to its own result (res, by post index).
func (in *inboundBatch) storeGroup(ctx context.Context, tx pgx.Tx, res []*InboundResult) error {
	lockConvs, err := in.contactsAndOrdered(ctx, tx)
	if err != nil {
		return err
	}
	// A duplicate within today's partition meets its unique index (ON CONFLICT); one of the
	// days before (from the lookback day: none for items sent today) is looked up in their
	// partitions (pruned to them by created_at when the statement is planned). When an ordered
	// webhook may take a hand-off, the same statement locks the conversations first
	// (lockConversationsSQL; their rows have a NULL id).
	args := []any{pgx.QueryExecModeCacheDescribe, in.ids, in.orgIDs, in.chIDs, in.types, in.keys, in.payloads, in.now,
		in.lookback, day(in.now), in.convs, in.wamids, in.traces}
	insertSQL := eventsInsertSQL
	if len(lockConvs) > 0 {
		insertSQL = `WITH ` + lockConversationsSQL("$13") + `, ins AS (` + eventsInsertSQL + `)
		SELECT * FROM ins UNION ALL SELECT NULL, NULL, NULL, NULL, k FROM locked`
		args = append(args, lockConvs)
	}
	rows, err := tx.Query(ctx, insertSQL, args...)
	if err != nil {
		return err
	}
	index := make(map[uuid.UUID]int, len(in.ids)) // event id → item
	for i, id := range in.ids {
		index[id] = i
	}
	var stored, storedOrg, storedCh []uuid.UUID
	var storedType []string
	var storedPost []int32 // 1-based, for the SQL arrays
	var locked []int64     // the conversations locked for hand-offs to ordered webhooks
	for rows.Next() {
		var id, org, ch *uuid.UUID
		var typ *string
		var conv *int64
		if err := rows.Scan(&id, &org, &ch, &typ, &conv); err != nil {
			rows.Close()
			return err
		}
		if id == nil {
			locked = append(locked, *conv)
			continue
		}
		stored, storedOrg, storedCh, storedType = append(stored, *id), append(storedOrg, *org), append(storedCh, *ch), append(storedType, *typ)
		p := in.post(index[*id])
		storedPost = append(storedPost, int32(p+1))
		res[p].ByType[*typ]++
		res[p].Events++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range in.ids {
		res[in.post(i)].Duplicates++
	}
	for _, r := range res {
		r.Duplicates -= r.Events
	}
	if len(stored) == 0 {
		return nil
	}
	if in.statuses != nil {
		created, err := in.applyStatuses(ctx, tx, stored)
		if err != nil {
			return err
		}
		if err := in.applyUsage(ctx, tx, stored, created); err != nil { // (store/usage.go)
			return err
		}
	}
	if len(in.objIDs) > 0 {
		// Re-sent items' objects are already recorded; the conflict clause covers them.
		if _, err := tx.Exec(ctx, `
			INSERT INTO channel_objects (channel_id, object_id)
			SELECT * FROM unnest($1::uuid[], $2::text[]) ON CONFLICT DO NOTHING`, in.objChannels, in.objIDs); err != nil {
			return err
		}
		// each post that stored an event reloads the channels of its objects
		objs := make([][]uuid.UUID, len(res))
		for i, ch := range in.objChannels {
			p := 0
			if in.objPosts != nil {
				p = int(in.objPosts[i])
			}
			objs[p] = append(objs[p], ch)
		}
		for p, chs := range objs {
			if len(chs) > 0 && res[p].Events > 0 {
				res[p].ObjectChannels = slices.Compact(slices.SortedFunc(slices.Values(chs), func(a, b uuid.UUID) int {
					return bytes.Compare(a[:], b[:])
				}))
			}
		}
	}
	payloadOf := make(map[uuid.UUID][]byte, len(in.ids))
	convOf := make(map[uuid.UUID]int64, len(in.ids))
	traceOf := map[uuid.UUID]string{} // (only traced items: none without tracing)
	for i, id := range in.ids {
		payloadOf[id], convOf[id] = in.payloads[i], in.convs[i]
		if i < len(in.traces) && in.traces[i] != nil { // (channel events have none)
			traceOf[id] = *in.traces[i]
		}
	}
	storedConv := make([]int64, len(stored))
	for i, id := range stored {
		storedConv[i] = convOf[id]
	}
	maxes := in.maxes
	if maxes == nil {
		maxes = []int32{int32(max(in.claim.Max, 0))}
	}
	rows, err = queryGeneric(ctx, tx, storeDeliveriesSQL, stored, storedOrg, storedCh, storedType, in.now, maxes, in.claim.Instance,
		in.claim.Lease.Milliseconds(), storedConv, storedPost, in.leaseFrom, locked)
	if err != nil {
		return err
	}
	queued := false
	for rows.Next() {
		d := ClaimedDelivery{CreatedAt: in.now, Attempt: 1}
		var claimed, active bool
		if err := rows.Scan(&d.ID, &d.EventID, &d.WebhookID, &d.OrgID, &claimed, &active, &d.URL, &d.PreviousSecretExpiresAt, &d.Conversation); err != nil {
			rows.Close()
			return err
		}
		r := res[in.post(index[d.EventID])]
		r.Deliveries++
		switch {
		case claimed:
			d.Payload, d.Traceparent = payloadOf[d.EventID], traceOf[d.EventID]
			r.Claimed = append(r.Claimed, d)
		case active:
			r.Queued++
			queued = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if queued {
		return notifyDeliveries(ctx, tx)
	}
	return nil
}

// orderedOrgsSQL returns which of the orgs $1 have a webhook with ordering "conversation".
const orderedOrgsSQL = `SELECT DISTINCT org_id FROM webhooks WHERE org_id = ANY($1::uuid[]) AND ordering = 'conversation'`

// contactsAndOrdered stores the batch's contacts (the customers' windows, store/contacts.go)
// and, when the batch hands deliveries off, returns the conversations that its events insert
// is to lock (lockConversationsSQL): those of the items whose org has an ordered webhook. Both
// statements go in one round trip. A webhook made ordered after this look takes no hand-off in
// this batch: its conversations are not locked, and storeDeliveriesSQL hands off only locked ones.
func (in *inboundBatch) contactsAndOrdered(ctx context.Context, tx pgx.Tx) ([]int64, error) {
	handOff := in.claim.Max > 0
	if !handOff {
		return nil, in.contacts.store(ctx, tx)
	}
	b := &pgx.Batch{}
	in.contacts.queue(b)
	b.Queue(orderedOrgsSQL, in.orgIDs) // (one per item: the statement's DISTINCT makes them a set)
	br := tx.SendBatch(ctx, b)
	ordered, err := orderedOrgs(br, len(b.QueuedQueries) > 1)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	var convs []int64
	for i, org := range in.orgIDs {
		if ordered[org] {
			convs = append(convs, in.convs[i])
		}
	}
	return convs, nil
}

// orderedOrgs reads the results of contactsAndOrdered's batch: the contacts' upsert when
// withContacts, then orderedOrgsSQL's orgs.
func orderedOrgs(br pgx.BatchResults, withContacts bool) (map[uuid.UUID]bool, error) {
	if withContacts {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("contacts: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("ordered webhooks: %w", err)
	}
	orgs, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("ordered webhooks: %w", err)
	}
	ordered := make(map[uuid.UUID]bool, len(orgs))
	for _, org := range orgs {
		ordered[org] = true
	}
	return ordered, nil
}

// eventsInsertSQL inserts a batch's events ($1–$12, see storeGroup), skipping duplicates, and
// returns each stored one's id, org_id, channel_id and type, and a NULL (the key column of the
// locks' rows, see storeGroup).
const eventsInsertSQL = `
	INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at, conversation, wamid, traceparent)
	SELECT u.id, u.org, u.ch, u.typ, u.key, u.payload, $7::timestamptz, u.conv, u.wamid, u.trace
	FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::bytea[], $10::bigint[], $11::text[], $12::text[])
	     AS u(id, org, ch, typ, key, payload, conv, wamid, trace)
	WHERE NOT EXISTS (SELECT 1 FROM events o WHERE o.channel_id = u.ch AND o.dedupe_key = u.key
	                  AND o.created_at >= $8::timestamptz AND o.created_at < $9::timestamptz)
	ON CONFLICT DO NOTHING
	RETURNING id, org_id, channel_id, type, NULL::bigint`

// storeDeliveriesSQL makes the deliveries of stored events (storeGroup), one per matching
// webhook: a log row, and a queue row — claimed for this instance (up to its post's claim Max,
// active webhooks; leased from $11, NULL: the database's now()), pending (active) or held
// (paused). A webhook with ordering "conversation" gets the item's conversation on both rows,
// and no hand-off (its claims keep the order, see claimableSQL); its queue row waits behind the
// conversation's rows already queued, or earlier in the statement (queueStatusSQL: one index
// probe).
//
// It runs on a generic plan (queryGeneric): planned per call, it spent more time in the planner
// than running. It inserts into deliveries, a partitioned table, into which a generic plan
// routes rows at run time without locking every partition.
var storeDeliveriesSQL = `
	WITH m AS (
		SELECT e.id AS event_id, w.id AS webhook_id, w.org_id, w.status = 'active' AS active, w.url,
		       CASE WHEN w.ordering = 'conversation' THEN e.conv END AS conv, w.previous_secret_expires_at,
		       e.post
		FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $9::bigint[], $10::int[]) AS e(id, org_id, channel_id, type, conv, post)
		JOIN webhooks w ON w.org_id = e.org_id AND e.type = ANY (w.events)
		WHERE w.scope = 'org' OR EXISTS (SELECT 1 FROM webhook_channels wc WHERE wc.webhook_id = w.id AND wc.channel_id = e.channel_id)
	), r AS (
		SELECT m.*, CASE WHEN m.conv IS NOT NULL THEN row_number() OVER (PARTITION BY m.webhook_id, m.conv ORDER BY m.event_id) END AS conv_rank
		FROM m
	), h AS (
		-- a hand-off goes to an active webhook that is not failing (only its probe goes out,
		-- migration 017). An unordered webhook (conv NULL) takes it only when no first attempt
		-- of its own is waiting, due, in the queue (a probe of delivery_queue_due): new events
		-- never overtake its older due first attempts, while other webhooks' and other orgs'
		-- backlogs do not matter. Its due retries do not stop it: its retries are out of order
		-- by nature (issue 35, decision 2; the probe reads the webhook's due rows oldest first
		-- until one is a first attempt). An ordered webhook takes it for the first delivery of a
		-- conversation (in this statement) that has no live row queued — the row that the claim
		-- would take next — and only under the conversation's lock ($12: the conversations the
		-- events insert locked, see lockConversationsSQL), taken before this statement's
		-- snapshot, so that no other writer of the conversation is between its look and its
		-- commit
		SELECT r.*, r.active AND ($6::int[])[r.post] > 0
		       AND NOT EXISTS (SELECT 1 FROM webhooks f WHERE f.id = r.webhook_id AND f.failing_since IS NOT NULL)
		       AND CASE WHEN r.conv IS NULL THEN NOT EXISTS (
		           SELECT 1 FROM delivery_queue q WHERE q.webhook_id = r.webhook_id AND q.status = 'pending' AND q.next_attempt_at <= $5 AND q.attempts = 0)
		       ELSE r.conv = ANY ($12::bigint[]) AND r.conv_rank = 1 AND NOT EXISTS (
		           SELECT 1 FROM delivery_queue o WHERE o.webhook_id = r.webhook_id AND o.conversation = r.conv AND o.status <> 'waiting') END AS free
		FROM r
	), n AS (
		SELECT h.event_id, h.webhook_id, h.org_id, h.active, h.url, h.conv, h.previous_secret_expires_at, ` + newDeliveryIDSQL("$5") + ` AS id,
		       h.free AND row_number() OVER (PARTITION BY h.free, h.post ORDER BY h.event_id, h.webhook_id) <= ($6::int[])[h.post] AS claimed,
		       h.conv_rank
		FROM h
	), log AS (
		` + insertDeliveryLog + `
		SELECT n.id, n.event_id, n.webhook_id, 'pending', 0, $5, $5, n.conv FROM n ORDER BY n.event_id, n.webhook_id
	), q AS (
		` + insertDeliveryQueue + `
		SELECT n.id, $5, n.event_id, n.webhook_id,
		       ` + queueStatusSQL("n.webhook_id", "n.conv", "n.conv_rank", `CASE WHEN n.claimed THEN 'in_flight' WHEN n.active THEN 'pending' ELSE `+heldWhenPausedSQL("n.webhook_id")+` END`) + `,
		       $5, CASE WHEN n.claimed THEN $7 END,
		       CASE WHEN n.claimed THEN coalesce($11::timestamptz, now()) + $8 * interval '1 millisecond' END, n.conv
		FROM n ORDER BY n.event_id, n.webhook_id
	)
	SELECT n.id, n.event_id, n.webhook_id, n.org_id, n.claimed, n.active, n.url, n.previous_secret_expires_at, n.conv FROM n`

// applyStatuses moves the latest status of the outgoing messages that the stored events (ids in
// stored) report, in one statement (see messagesUpsertSQL, messagesUpsertPricedSQL). Statuses that rank no message status,
// or whose message id is not storable, leave messages alone. It returns the message ids whose
// rows the statement created: their priced statuses are counted already (applyUsage leaves
// them out).
func (in *inboundBatch) applyStatuses(ctx context.Context, tx pgx.Tx, stored []uuid.UUID) (map[string]bool, error) {
	index := make(map[uuid.UUID]int, len(in.ids))
	for i, id := range in.ids {
		if in.statuses[i] != nil {
			index[id] = i
		}
	}
	var wamids, recipients, statuses, titles []string
	var orgs, chs []uuid.UUID
	var ranks, codes []int32
	var ats []*time.Time
	// each status's pricing (usageDays NULL: none), for messagesUpsertPricedSQL
	var usageDays []*time.Time
	var usageCats, usageTypes, usageCountries []string
	var usageBillable []bool
	priced := false
	for _, id := range stored {
		i, ok := index[id]
		if !ok || in.wamids[i] == nil {
			continue
		}
		st := in.statuses[i]
		rank, ok := StatusRank(st.Status)
		if !ok {
			continue
		}
		var at *time.Time
		if !st.Timestamp.IsZero() {
			at = &st.Timestamp
		}
		recipient := st.Recipient
		if len(recipient) > maxRecipientLen || !IsText(recipient) {
			recipient = ""
		}
		title := st.ErrorTitle
		if !IsText(title) {
			title = ""
		}
		title = truncateText(title, maxErrorTitleLen)
		var uday *time.Time
		var cat, typ, country string
		var billable bool
		if st.Pricing != nil {
			d, c := in.usageBucket(i) // (store/usage.go)
			uday, cat, typ, country, billable, priced = &d, st.Pricing.Category, st.Pricing.Type, c, st.Pricing.Billable, true
		}
		usageDays, usageCats, usageTypes = append(usageDays, uday), append(usageCats, cat), append(usageTypes, typ)
		usageCountries, usageBillable = append(usageCountries, country), append(usageBillable, billable)
		wamids, orgs, chs = append(wamids, *in.wamids[i]), append(orgs, in.orgIDs[i]), append(chs, in.chIDs[i])
		recipients, statuses, ranks = append(recipients, recipient), append(statuses, st.Status), append(ranks, int32(rank))
		ats, codes, titles = append(ats, at), append(codes, int32(st.ErrorCode)), append(titles, title)
	}
	if len(wamids) == 0 {
		return nil, nil
	}
	if !priced {
		_, err := tx.Exec(ctx, messagesUpsertSQL, wamids, orgs, chs, recipients, statuses, ranks, ats, codes, titles, in.now)
		return nil, err
	}
	rows, err := tx.Query(ctx, messagesUpsertPricedSQL, wamids, orgs, chs, recipients, statuses, ranks, ats, codes, titles, in.now,
		usageDays, usageCats, usageTypes, usageBillable, usageCountries)
	if err != nil {
		return nil, err
	}
	created := map[string]bool{}
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			rows.Close()
			return nil, err
		}
		created[w] = true
	}
	rows.Close()
	return created, rows.Err()
}

// messagesUpsertSQL applies statuses to messages (DESIGN §5b "Message timeline"): it creates the
// row of a message not seen yet — its recipient the status's recipient_id, its created_at the
// time of the relay call that sent it (found in relay_log by wamid, in the day before the
// earliest upstream timestamp among the batch's statuses of it, so that the channel's list keeps
// the order of the sends to the microsecond), else, for a status that came before the call's log
// row or a message sent around the relay, the status's arrival (now, as its event's; not the
// upstream's timestamp, which may be days old or garbage, and would have the retention delete the
// row at once) with relay_pending set (see settleMessagesSQL) —, else moves its status forward only: the update applies when the new rank
// is greater, and only to a row of the same channel. One row per message id (its highest status
// in the batch), in message id order so that concurrent posts lock rows in the same order. The
// relay log is probed only for a message that has no row yet, in the days its call can be in.
var messagesUpsertSQL = `
	INSERT INTO messages AS m (` + messagesInsertColumns + `)
	SELECT ` + messagesInsertValues + `
	FROM (
		SELECT DISTINCT ON (u.wamid) u.*, ` + messagesFirstSQL + ` AS first
		FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::smallint[], $7::timestamptz[], $8::int[], $9::text[])
		     AS u(wamid, org, ch, recipient, status, rank, at, code, title)
		ORDER BY u.wamid, u.rank DESC
	) v
	` + messagesRelayCallSQL + `
	ORDER BY v.wamid
	` + messagesOnConflictSQL

// messagesUpsertPricedSQL is messagesUpsertSQL for a batch with priced statuses ($11–$15: each
// status's usage day — NULL for a status without pricing —, category, type, billable and
// country, as applyUsage passes them to usageSQL). A row it creates is created in its usage
// bucket, and its +1 appended to usage_deltas, in the same statement: one row version and one
// statement, where usageSQL would read the new row again, update it (a second version) and
// append the delta (BenchmarkPricedStatus: about 90 Postgres-µs per status, most of it the
// statement itself: without its update, or its insert, it cost about the same). The bucket is the one usageSQL moves a message into
// from none: the pricing of the batch's priced status of the highest rank (the later one in the
// batch among equals) if that status is of the row's channel, the earliest day of the message's
// priced statuses, the status's country as is (no earlier one to fall back on). A row that
// existed is left to usageSQL: its move needs the old bucket, which RETURNING does not give
// before Postgres 18. So the statement returns the message ids of the rows it created, told
// apart by their xmax (the usual test: 0 on a row inserted, the conflict's lock on a row
// updated; TestUsageCountsOnce would count a message twice were an update taken for an insert).
var messagesUpsertPricedSQL = `
	WITH u AS (
		SELECT * FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::smallint[], $7::timestamptz[], $8::int[], $9::text[],
		                     $11::date[], $12::text[], $13::text[], $14::boolean[], $15::text[])
		     WITH ORDINALITY AS u(wamid, org, ch, recipient, status, rank, at, code, title, uday, category, ptype, billable, country, ord)
	), p AS (
		SELECT DISTINCT ON (u.wamid) u.wamid, u.ch, u.rank, u.category, u.ptype, u.billable, u.country,
		       min(u.uday) OVER (PARTITION BY u.wamid) AS day
		FROM u WHERE u.uday IS NOT NULL
		ORDER BY u.wamid, u.rank DESC, u.ord DESC
	), up AS (
		INSERT INTO messages AS m (` + messagesInsertColumns + `,
		                           usage_day, usage_category, usage_type, usage_country, usage_billable, usage_rank)
		SELECT ` + messagesInsertValues + `,
		       p.day, p.category, p.ptype, p.country, p.billable, p.rank
		FROM (
			SELECT DISTINCT ON (u.wamid) u.*, ` + messagesFirstSQL + ` AS first
			FROM u
			ORDER BY u.wamid, u.rank DESC
		) v
		LEFT JOIN p ON p.wamid = v.wamid AND p.ch = v.ch
		` + messagesRelayCallSQL + `
		ORDER BY v.wamid
		` + messagesOnConflictSQL + `
		RETURNING m.wamid, m.org_id, m.channel_id, m.usage_day, m.usage_category, m.usage_type, m.usage_country,
		          m.usage_billable, m.xmax = 0 AS created
	), d AS (
		-- one delta per bucket, as usageSQL's
		INSERT INTO usage_deltas (org_id, day, channel_id, category, pricing_type, country, messages, billable)
		SELECT org_id, usage_day, channel_id, usage_category, usage_type, usage_country,
		       count(*), count(*) FILTER (WHERE usage_billable)
		FROM up WHERE created AND usage_day IS NOT NULL
		GROUP BY 1, 2, 3, 4, 5, 6
		ORDER BY 1, 2, 3, 4, 5, 6
	)
	SELECT wamid FROM up WHERE created`

// The parts of messagesUpsertSQL and messagesUpsertPricedSQL, over v: one status per message
// (its highest in the batch), with first, the earliest upstream timestamp among the batch's
// statuses of it (now at the latest).
const (
	messagesInsertColumns = `wamid, org_id, channel_id, recipient, created_at, status, status_rank, status_at,
	                           error_code, error_title, relay_pending`
	messagesInsertValues = `v.wamid, v.org, v.ch, v.recipient, coalesce(r.at, $10::timestamptz), v.status, v.rank, v.at,
	       CASE WHEN v.status = 'failed' THEN nullif(v.code, 0) END, CASE WHEN v.status = 'failed' THEN nullif(v.title, '') END,
	       CASE WHEN r.at IS NULL THEN true END`
	messagesFirstSQL = `least($10::timestamptz, coalesce(min(u.at) OVER (PARTITION BY u.wamid), $10::timestamptz))`
	// (the call by its wamid alone, its channel checked on the row: with the channel in the
	// condition the planner reads the channel's index in time order for the earliest call,
	// filtering on wamid — a scan of the channel's day per status)
	messagesRelayCallSQL = `LEFT JOIN LATERAL (
		SELECT r.at FROM (
			SELECT r.at, r.channel_id FROM relay_log r
			WHERE r.wamid = v.wamid AND NOT r.replayed
			  AND r.at >= v.first - interval '` + relayLookBack + `' AND r.at <= $10::timestamptz + interval '1 minute'
			  AND NOT EXISTS (SELECT 1 FROM messages x WHERE x.wamid = v.wamid)
			ORDER BY r.at LIMIT 1) r
		WHERE r.channel_id = v.ch
	) r ON true`
	messagesOnConflictSQL = `ON CONFLICT (wamid) DO UPDATE
	SET status = excluded.status, status_rank = excluded.status_rank, status_at = excluded.status_at,
	    error_code = excluded.error_code, error_title = excluded.error_title,
	    recipient = CASE WHEN m.recipient = '' THEN excluded.recipient ELSE m.recipient END
	WHERE m.channel_id = excluded.channel_id AND excluded.status_rank > m.status_rank`
)

// The column lists of a new delivery's two rows — its delivery log row and its queue row —,
// shared by the statements that create deliveries (StoreEvents, Replay), so that a column
// added to one is added to every one of them. Both rows take the event's created_at: it is
// the partition key that finds the delivery's and its event's rows.
const (
	insertDeliveryLog   = `INSERT INTO deliveries (id, event_id, webhook_id, status, attempts, created_at, updated_at, conversation)`
	insertDeliveryQueue = `INSERT INTO delivery_queue (delivery_id, created_at, event_id, webhook_id, status, next_attempt_at, locked_by, locked_until, conversation)`
)

// newDeliveryIDSQL returns the SQL expression of a new delivery id made at the time the SQL
// expression at (a timestamptz) gives. Delivery ids are UUIDv7 like every other id (they sort
// by time): that time in milliseconds over the first 48 bits of a random (v4) uuid, the
// version set to 7.
func newDeliveryIDSQL(at string) string {
	return `encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
			         PLACING substring(int8send(floor(extract(epoch FROM ` + at + `::timestamptz) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
			         52, 1), 53, 1), 'hex')::uuid`
}

// isMissingPartition reports a row that no partition of a history table takes.
func isMissingPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// DeactivateByWaba marks every channel of a business account inactive because the account was
// removed or banned upstream; each change of state is announced by a channel_status event with
// reason (ReasonAccountBanned or ReasonAccountDeleted), stored in the same transaction. It
// returns how many channels changed.
func (s *Store) DeactivateByWaba(ctx context.Context, wabaID, reason string) (int, error) {
	if !IsText(wabaID) {
		return 0, nil // no channel's account
	}
	var n int
	err := s.changeChannels(ctx, func(tx pgx.Tx) error {
		var err error
		n, err = s.transition(ctx, tx, `waba_id = $1 AND status <> 'inactive'`,
			`status = 'inactive', inactive_reason = 'upstream', updated_at = now()`, because(reason), wabaID)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("deactivate by waba: %w", err)
	}
	return n, nil
}
