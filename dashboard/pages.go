package dashboard

import (
	"context"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/httpx"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// ---- sign-in ----------------------------------------------------------------------------

// login shows the sign-in form (GET) or signs in with an API key (POST). A sign-in is
// admitted by the AuthGuard (a key it knows valid always is), then costs a request of the key's
// management rate limit (over it: 429 with Retry-After, no session), and the key's session
// beyond store.MaxDashboardSessions ends its oldest.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		h.loginForm(w, r, http.StatusOK, "")
	case http.MethodPost:
		addr := httpx.ClientAddr(r)
		raw := strings.TrimSpace(r.PostFormValue("api_key"))
		g := h.opt.AuthGuard
		if g != nil {
			if wait, ok := g.Admit(addr, raw); !ok {
				w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
				h.loginForm(w, r, http.StatusTooManyRequests, "Too many failed sign-ins from your address. Wait a minute and try again.")
				return
			}
		}
		key, err := h.opt.Store.AuthenticateAPIKey(r.Context(), raw)
		switch {
		case errors.Is(err, store.ErrInvalidAPIKey), errors.Is(err, store.ErrAPIKeyExpired):
			if g != nil {
				g.Forget(raw)
				g.Fail(addr)
			}
			msg := managementapi.MsgKeyInvalid
			if errors.Is(err, store.ErrAPIKeyExpired) {
				msg = managementapi.MsgKeyExpired
			}
			h.loginForm(w, r, http.StatusUnauthorized, msg)
			return
		case err != nil:
			h.serverError(w, r, err)
			return
		}
		if g != nil {
			g.Valid(raw)
		}
		if h.opt.API.Charge(r.Context(), key, w.Header()) != nil {
			h.loginForm(w, r, http.StatusTooManyRequests, httpx.MsgRateLimited+" for this API key. Wait a moment and sign in again.")
			return
		}
		token, _, err := h.opt.Store.CreateDashboardSession(r.Context(), key, h.opt.SessionTTL)
		if errors.Is(err, store.ErrInvalidAPIKey) {
			h.loginForm(w, r, http.StatusUnauthorized, managementapi.MsgKeyInvalid)
			return
		}
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		if g != nil {
			g.Valid(token)
		}
		h.setCookie(w, r, token, 0)
		h.redirect(w, r, "/channels", "")
	default:
		w.Header().Set("Allow", "GET, POST")
		h.render(w, r, http.StatusMethodNotAllowed, "error", page{Title: "Method not allowed", Error: "Method not allowed"})
	}
}

// loginForm renders the sign-in form.
func (h *Handler) loginForm(w http.ResponseWriter, r *http.Request, status int, msg string) {
	notice := ""
	if r.URL.Query().Get("done") == "signed-out" {
		notice = notices["signed-out"]
	}
	h.render(w, r, status, "login", page{Title: "Sign in", Error: msg, Notice: notice})
}

// logout ends the session.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(h.cookieName(r)); err == nil {
		if err := h.opt.Store.DeleteDashboardSession(r.Context(), c.Value); err != nil {
			h.serverError(w, r, err)
			return
		}
		if g := h.opt.AuthGuard; g != nil {
			g.Forget(c.Value)
		}
	}
	h.setCookie(w, r, "", -1)
	h.redirect(w, r, "/login", "signed-out")
}

// ---- channels ---------------------------------------------------------------------------

// channelRow is a channel's card. Its Reconnectable offers the Reconnect button: where the
// reconnect rule allows it (managementapi.ChannelOverview) and no open link is shown already.
type channelRow struct {
	managementapi.ChannelOverview
	QR template.HTML
}

type channelsData struct {
	Channels []channelRow
	// ConfirmDelete is the channel whose deletion awaits confirmation (it is active).
	ConfirmDelete *managementapi.Channel
	Name          string
	// AtRisk: only the channels whose quality is YELLOW or RED are listed (?filter=at-risk);
	// AtRiskCount counts them either way (health.go).
	AtRisk      bool
	AtRiskCount int
}

func (h *Handler) channels(w http.ResponseWriter, r *http.Request, s *session) {
	h.channelsPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK, channelsData{})
}

func (h *Handler) channelsPage(w http.ResponseWriter, r *http.Request, p page, status int, d channelsData) {
	list, err := h.opt.API.ChannelOverviews(r.Context(), h.principal(r, p.Session))
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	d.AtRisk = r.URL.Query().Get("filter") == filterAtRisk
	for _, c := range list {
		if c.Health.AtRisk() {
			d.AtRiskCount++
		} else if d.AtRisk {
			continue
		}
		row := channelRow{ChannelOverview: c}
		row.Reconnectable = c.Reconnectable && !c.LinkOpen
		if c.LinkOpen {
			row.QR = qrSVG(c.ConnectURL, "Connect link of "+c.Name)
		}
		d.Channels = append(d.Channels, row)
	}
	p.Title, p.Nav, p.Data = "Channels", "channels", d
	h.render(w, r, status, "channels", p)
}

func (h *Handler) createChannel(w http.ResponseWriter, r *http.Request, s *session) {
	name := r.PostFormValue("name")
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) error {
		_, err := h.opt.API.CreateChannel(ctx, p, managementapi.ChannelInput{Name: formText(name)})
		return err
	}); e != nil {
		h.channelsPage(w, r, page{Session: s, Error: e.Message}, e.Status, channelsData{Name: name})
		return
	}
	h.redirect(w, r, "/channels", "channel-created")
}

func (h *Handler) reconnectChannel(w http.ResponseWriter, r *http.Request, s *session) {
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) error {
		_, err := h.opt.API.ReconnectChannel(ctx, p, r.PathValue("id"))
		return err
	}); e != nil {
		h.channelsPage(w, r, page{Session: s, Error: e.Message}, e.Status, channelsData{})
		return
	}
	h.redirect(w, r, "/channels", "reconnected")
}

// deleteChannel deletes a channel; an active channel needs the confirmation the API asks for
// (force), which the page shows when the API refuses without it.
func (h *Handler) deleteChannel(w http.ResponseWriter, r *http.Request, s *session) {
	id, force := r.PathValue("id"), r.PostFormValue("force") == "true"
	e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) error {
		return h.opt.API.DeleteChannel(ctx, p, id, force)
	})
	if e == nil {
		h.redirect(w, r, "/channels", "channel-deleted")
		return
	}
	var d channelsData
	if e.Status == http.StatusConflict && !force {
		if u, err := uuid.Parse(id); err == nil {
			if c, err := h.opt.API.GetChannel(r.Context(), h.principal(r, s), u.String()); err == nil {
				d.ConfirmDelete = &c
			}
		}
	}
	h.channelsPage(w, r, page{Session: s, Error: e.Message}, e.Status, d)
}

// ---- webhooks ---------------------------------------------------------------------------

type webhookRow struct {
	managementapi.Webhook
	Channels []string // names of assigned channels
}

type webhooksData struct {
	Webhooks []webhookRow
	Channels []managementapi.Channel
	// Created is the webhook just created, with its secret (shown this once).
	Created *managementapi.Webhook
	Form    webhookForm
	// Orderings lists the webhook orderings (the form's choices).
	Orderings []string
}

type webhookForm struct {
	Name, URL  string
	Ordering   string
	Events     map[string]bool
	ChannelIDs map[string]bool
}

func (h *Handler) webhooks(w http.ResponseWriter, r *http.Request, s *session) {
	h.webhooksPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK,
		webhooksData{Form: webhookForm{Events: map[string]bool{"messages": true, "message_status": true}}})
}

func (h *Handler) webhooksPage(w http.ResponseWriter, r *http.Request, p page, status int, d webhooksData) {
	pr := h.principal(r, p.Session)
	hooks, err := h.opt.API.ListWebhooks(r.Context(), pr)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if d.Channels, err = h.opt.API.ListChannels(r.Context(), pr); err != nil {
		h.serverError(w, r, err)
		return
	}
	names := map[uuid.UUID]string{}
	for _, c := range d.Channels {
		names[c.ID] = c.Name
	}
	for _, wh := range hooks {
		row := webhookRow{Webhook: wh}
		for _, id := range wh.ChannelIDs {
			row.Channels = append(row.Channels, names[id])
		}
		d.Webhooks = append(d.Webhooks, row)
	}
	d.Orderings = []string{store.OrderingNone, store.OrderingConversation}
	p.Title, p.Nav, p.Data = "Webhooks", "webhooks", d
	h.render(w, r, status, "webhooks", p)
}

func (h *Handler) createWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	if err := r.ParseForm(); err != nil {
		h.webhooksPage(w, r, page{Session: s, Error: "Invalid form"}, http.StatusBadRequest, webhooksData{})
		return
	}
	f := webhookForm{Name: r.PostForm.Get("name"), URL: r.PostForm.Get("url"), Ordering: r.PostForm.Get("ordering"),
		Events: map[string]bool{}, ChannelIDs: map[string]bool{}}
	events, ids := r.PostForm["events"], r.PostForm["channel_ids"]
	for _, e := range events {
		f.Events[e] = true
	}
	for _, id := range ids {
		f.ChannelIDs[id] = true
	}
	in := managementapi.WebhookInput{Name: formText(f.Name), URL: formText(f.URL), Events: formTexts(events), ChannelIDs: formTexts(ids),
		Ordering: formText(f.Ordering)}
	var created managementapi.Webhook
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) (err error) {
		created, err = h.opt.API.CreateWebhook(ctx, p, in)
		return err
	}); e != nil {
		h.webhooksPage(w, r, page{Session: s, Error: e.Message}, e.Status, webhooksData{Form: f})
		return
	}
	h.webhooksPage(w, r, page{Session: s, Notice: "Webhook created. Copy its signing secret now: it is not shown again."},
		http.StatusCreated, webhooksData{Created: &created, Form: webhookForm{Events: map[string]bool{"messages": true, "message_status": true}}})
}

// formTexts is formText of each value, never nil.
func formTexts(v []string) []string {
	out := make([]string, len(v))
	for i, s := range v {
		out[i] = formText(s)
	}
	return out
}

func (h *Handler) setWebhookStatus(w http.ResponseWriter, r *http.Request, s *session) {
	status := formText(r.PostFormValue("status"))
	h.changeWebhook(w, r, s, "webhook-updated", r.PostFormValue("back") == "webhook", func(ctx context.Context, p managementapi.Principal) error {
		_, err := h.opt.API.SetWebhookStatus(ctx, p, r.PathValue("id"), status)
		return err
	})
}

// setWebhookOrdering sets a webhook's ordering (none or conversation).
func (h *Handler) setWebhookOrdering(w http.ResponseWriter, r *http.Request, s *session) {
	ordering := formText(r.PostFormValue("ordering"))
	h.changeWebhook(w, r, s, "webhook-updated", false, func(ctx context.Context, p managementapi.Principal) error {
		_, err := h.opt.API.SetWebhookOrdering(ctx, p, r.PathValue("id"), ordering)
		return err
	})
}

func (h *Handler) deleteWebhook(w http.ResponseWriter, r *http.Request, s *session) {
	h.changeWebhook(w, r, s, "webhook-deleted", false, func(ctx context.Context, p managementapi.Principal) error {
		return h.opt.API.DeleteWebhook(ctx, p, r.PathValue("id"))
	})
}

// assignChannel assigns (op=assign) or removes (op=remove) a channel.
func (h *Handler) assignChannel(w http.ResponseWriter, r *http.Request, s *session) {
	remove, cid := r.PostFormValue("op") == "remove", r.PostFormValue("channel_id")
	h.changeWebhook(w, r, s, "assigned", false, func(ctx context.Context, p managementapi.Principal) error {
		if remove {
			return h.opt.API.UnassignChannel(ctx, p, r.PathValue("id"), cid)
		}
		_, err := h.opt.API.AssignChannel(ctx, p, r.PathValue("id"), cid)
		return err
	})
}

// changeWebhook makes a change to a webhook (op, through act) and redirects with notice to the
// webhooks page, or to the webhook's page when toWebhook; a refusal is shown on the webhooks page.
func (h *Handler) changeWebhook(w http.ResponseWriter, r *http.Request, s *session, notice string, toWebhook bool,
	op func(context.Context, managementapi.Principal) error,
) {
	if e := h.act(r, s, nil, op); e != nil {
		h.webhooksPage(w, r, page{Session: s, Error: e.Message}, e.Status, webhooksData{Form: webhookForm{Events: map[string]bool{"messages": true}}})
		return
	}
	if toWebhook {
		h.redirect(w, r, "/webhooks/"+url.PathEscape(r.PathValue("id")), notice)
		return
	}
	h.redirect(w, r, "/webhooks", notice)
}

// ---- a webhook's delivery log -----------------------------------------------------------

type webhookData struct {
	Webhook managementapi.Webhook
	// Health is the receiver's health and probe schedule (store/health.go).
	Health     store.WebhookHealth
	Deliveries []managementapi.Delivery
	Filter     deliveryFilter
	NextURL    string
	Charts     charts
	Statuses   []string
	// Rotated is the webhook just given a new signing secret, with it (shown this once);
	// GraceChoices are the rotation form's.
	Rotated      *managementapi.Webhook
	GraceChoices []graceChoice
	// RangeParam is the chart range asked for ("" for the default), kept by the filter form.
	RangeParam string
}

type deliveryFilter struct {
	Status, Since, Until string
}

// deliveryPageSize is how many deliveries the webhook page lists at a time.
const deliveryPageSize = 50

// formTime is the layout of the time filters (an <input type="datetime-local">, read as UTC).
const formTime = "2006-01-02T15:04"

func parseFormTime(v string) (*time.Time, bool) {
	if v == "" {
		return nil, true
	}
	t, err := time.ParseInLocation(formTime, v, time.UTC)
	if err != nil {
		if t, err = time.Parse(time.RFC3339, v); err != nil {
			return nil, false
		}
	}
	return &t, true
}

func (h *Handler) webhook(w http.ResponseWriter, r *http.Request, s *session) {
	h.webhookPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK, r.PathValue("id"))
}

func (h *Handler) webhookPage(w http.ResponseWriter, r *http.Request, p page, status int, id string) {
	h.webhookPageWith(w, r, p, status, id, nil)
}

// webhookPageWith is webhookPage showing rotated's new secret when it is not nil.
func (h *Handler) webhookPageWith(w http.ResponseWriter, r *http.Request, p page, status int, id string, rotated *managementapi.Webhook) {
	wid, err := uuid.Parse(id)
	if err != nil {
		h.notFound(w, r, p.Session)
		return
	}
	pr := h.principal(r, p.Session)
	wh, err := h.opt.API.GetWebhookOverview(r.Context(), pr, wid.String())
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	q := r.URL.Query()
	d := webhookData{Webhook: wh.Webhook, Health: wh.HealthDetail, Statuses: []string{"pending", "in_flight", "delivered", "failed"},
		Filter: deliveryFilter{Status: q.Get("status"), Since: q.Get("since"), Until: q.Get("until")}}
	d.Rotated, d.GraceChoices = rotated, graceChoices
	dq := managementapi.DeliveryQuery{Status: d.Filter.Status, Limit: strconv.Itoa(deliveryPageSize), Newest: true}
	valid := d.Filter.Status == ""
	for _, st := range d.Statuses {
		valid = valid || st == d.Filter.Status
	}
	var ok1, ok2 bool
	dq.Since, ok1 = parseFormTime(d.Filter.Since)
	dq.Until, ok2 = parseFormTime(d.Filter.Until)
	if !valid || !ok1 || !ok2 {
		p.Error, status = "The filter is not valid: pick a status from the list and times as YYYY-MM-DDTHH:MM (UTC).", http.StatusUnprocessableEntity
		dq = managementapi.DeliveryQuery{Limit: dq.Limit, Newest: true}
		d.Filter = deliveryFilter{}
	}
	if after := q.Get("after"); after != "" {
		if u, err := uuid.Parse(after); err == nil {
			dq.Cursor = u.String()
		}
	}
	list, next, err := h.opt.API.ListDeliveries(r.Context(), pr, wid.String(), dq)
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	d.Deliveries = list
	if next != nil && len(list) > 0 {
		nq := url.Values{}
		for k, v := range map[string]string{"status": d.Filter.Status, "since": d.Filter.Since, "until": d.Filter.Until, "range": q.Get("range")} {
			if v != "" {
				nq.Set(k, v)
			}
		}
		nq.Set("after", list[len(list)-1].ID.String())
		d.NextURL = h.opt.BasePath + "/webhooks/" + wid.String() + "?" + nq.Encode()
	}
	now, cr := time.Now().UTC(), parseRange(q.Get("range"))
	buckets, err := h.opt.API.DeliveryChart(r.Context(), pr, wid.String(), cr.since(now), cr.Bucket)
	if err != nil {
		h.readError(w, r, p.Session, err)
		return
	}
	d.Charts = renderCharts(now, cr, buckets)
	d.Charts.Ranges = rangeLinks(r, h.opt.BasePath+"/webhooks/"+wid.String(), cr)
	if q.Get("range") != "" {
		d.RangeParam = cr.Name
	}
	p.Title, p.Nav, p.Data = "Webhook "+wh.Name, "webhooks", d
	h.render(w, r, status, "webhook", p)
}

func (h *Handler) retryDelivery(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) error {
		return h.opt.API.RetryDelivery(ctx, p, id, r.PathValue("did"))
	}); e != nil {
		h.webhookPage(w, r, page{Session: s, Error: e.Message}, e.Status, id)
		return
	}
	h.redirect(w, r, "/webhooks/"+url.PathEscape(id), "retried")
}

func (h *Handler) recoverDeliveries(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	since, ok := parseFormTime(r.PostFormValue("since"))
	if !ok || since == nil {
		h.webhookPage(w, r, page{Session: s, Error: `"since" must be a time such as 2026-11-20T00:00 (UTC)`}, http.StatusUnprocessableEntity, id)
		return
	}
	var n int
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) (err error) {
		n, err = h.opt.API.RecoverDeliveries(ctx, p, id, since.UTC().Format(time.RFC3339))
		return err
	}); e != nil {
		h.webhookPage(w, r, page{Session: s, Error: e.Message}, e.Status, id)
		return
	}
	h.webhookPage(w, r, page{Session: s, Notice: strconv.Itoa(n) + " failed deliveries queued again."}, http.StatusOK, id)
}

// ---- API keys ---------------------------------------------------------------------------

type apiKeysData struct {
	Keys    []managementapi.APIKey
	Created *managementapi.APIKeyCreated
	Current uuid.UUID // the key this session signed in with
	Name    string
	Expires string
}

func (h *Handler) apiKeys(w http.ResponseWriter, r *http.Request, s *session) {
	h.apiKeysPage(w, r, page{Session: s, Notice: notices[r.URL.Query().Get("done")]}, http.StatusOK, apiKeysData{})
}

func (h *Handler) apiKeysPage(w http.ResponseWriter, r *http.Request, p page, status int, d apiKeysData) {
	hdr := http.Header{}
	if e := h.act(r, p.Session, hdr, func(ctx context.Context, pr managementapi.Principal) (err error) {
		d.Keys, err = h.opt.API.ListAPIKeys(ctx, pr)
		return err
	}); e != nil {
		if e.Status >= 500 {
			w.Header().Set("Retry-After", "5")
		}
		for _, k := range []string{"Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
			if v := hdr.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		p.Error, status = e.Message, e.Status
	}
	d.Current = p.Session.Key.ID
	p.Title, p.Nav, p.Data = "API keys", "api-keys", d
	h.render(w, r, status, "apikeys", p)
}

func (h *Handler) createAPIKey(w http.ResponseWriter, r *http.Request, s *session) {
	d := apiKeysData{Name: r.PostFormValue("name"), Expires: r.PostFormValue("expires_in")}
	var k managementapi.APIKeyCreated
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) (err error) {
		k, err = h.opt.API.CreateAPIKey(ctx, p, managementapi.APIKeyInput{Name: formText(d.Name), ExpiresIn: formText(d.Expires)})
		return err
	}); e != nil {
		h.apiKeysPage(w, r, page{Session: s, Error: e.Message}, e.Status, d)
		return
	}
	h.apiKeysPage(w, r, page{Session: s, Notice: "API key created. Copy it now: it is not shown again."}, http.StatusCreated, apiKeysData{Created: &k})
}

func (h *Handler) revokeAPIKey(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	if e := h.act(r, s, nil, func(ctx context.Context, p managementapi.Principal) error {
		return h.opt.API.RevokeAPIKey(ctx, p, id)
	}); e != nil {
		h.apiKeysPage(w, r, page{Session: s, Error: e.Message}, e.Status, apiKeysData{})
		return
	}
	if id == s.Key.ID.String() { // this session's own key: the session has ended with it
		h.setCookie(w, r, "", -1)
		h.redirect(w, r, "/login", "signed-out")
		return
	}
	h.redirect(w, r, "/api-keys", "key-revoked")
}
