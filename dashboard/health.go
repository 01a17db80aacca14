package dashboard

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
)

// The number's health on the dashboard (DESIGN §5c "Number health"): a quality badge and the
// messaging limit on each channel's card, the "at risk" filter of the channels page
// (?filter=at-risk: quality YELLOW or RED), and the history of changes on the channel page.

// filterAtRisk is the channels page's filter value for the channels at risk.
const filterAtRisk = "at-risk"

// qualityClass is the CSS class of a quality badge: quality-green, quality-yellow, quality-red,
// or quality-other for any other string the upstream gives (UNKNOWN, or a new one).
func qualityClass(q *string) string {
	if q == nil {
		return "quality-other"
	}
	switch v := strings.ToLower(*q); v {
	case "green", "yellow", "red":
		return "quality-" + v
	}
	return "quality-other"
}

// healthChangeRow is one change of the channel page's history: when, what changed from what to
// what, and the upstream webhook field that prompted the read ("" for a periodic read).
type healthChangeRow struct {
	managementapi.HealthChange
	Items []healthItem
	Field string
}

// healthItem is one changed field.
type healthItem struct {
	Name, From, To string
}

// healthHistory reads the channel's health changes for its page.
func (h *Handler) healthHistory(r *http.Request, s *session, cid uuid.UUID) ([]healthChangeRow, error) {
	changes, err := h.opt.API.ChannelHealthHistory(r.Context(), h.principal(r, s), cid.String())
	if err != nil {
		return nil, err
	}
	rows := make([]healthChangeRow, len(changes))
	for i, c := range changes {
		row := healthChangeRow{HealthChange: c}
		for _, f := range c.Changed {
			row.Items = append(row.Items, healthItem{Name: f, From: healthValue(c.Previous, f), To: healthValue(c.Health, f)})
		}
		if c.Upstream != nil {
			row.Field = upstreamField(c.Upstream)
		}
		rows[i] = row
	}
	return rows, nil
}

// healthValue is one field of a health, "—" when unknown.
func healthValue(h managementapi.ChannelHealth, field string) string {
	var v *string
	switch field {
	case "quality_rating":
		v = h.QualityRating
	case "messaging_limit":
		v = h.MessagingLimit
	case "throughput":
		v = h.Throughput
	case "name_status":
		v = h.NameStatus
	}
	if v == nil {
		return "—"
	}
	return *v
}

// upstreamField is the "field" of a stored upstream change ("" when it has none).
func upstreamField(raw []byte) string {
	var u struct {
		Field string `json:"field"`
	}
	_ = json.Unmarshal(raw, &u) // a stored change always has one; "" otherwise
	return u.Field
}
