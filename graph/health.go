package graph

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// healthFields are the fields asked for a NumberHealth.
const healthFields = "quality_rating,name_status,throughput,whatsapp_business_manager_messaging_limit,messaging_limit_tier"

// NumberHealth is what the upstream says of a phone number's standing: its strings verbatim,
// empty when the answer lacks them.
type NumberHealth struct {
	// QualityRating is quality_rating: GREEN, YELLOW, RED or UNKNOWN.
	QualityRating string
	// MessagingLimit is whatsapp_business_manager_messaging_limit (e.g. TIER_2K), or, when the
	// answer lacks it, messaging_limit_tier (e.g. TIER_1K).
	MessagingLimit string
	// Throughput is throughput.level, e.g. STANDARD or HIGH.
	Throughput string
	// NameStatus is name_status, e.g. APPROVED or PENDING_REVIEW.
	NameStatus string
}

// GetNumberHealth reads a phone number's health with its business token:
// GET <phoneNumberID>?fields=quality_rating,name_status,throughput,whatsapp_business_manager_messaging_limit,messaging_limit_tier.
// A field of another JSON type than the one documented is taken as absent. A dead token is an
// *Error with Code 190.
func (c *Client) GetNumberHealth(ctx context.Context, token, phoneNumberID string) (NumberHealth, error) {
	const op = "GET /{phone_number_id}"
	if err := checkID(op, "phone number id", phoneNumberID); err != nil {
		return NumberHealth{}, err
	}
	if err := checkToken(op, token); err != nil {
		return NumberHealth{}, err
	}
	var out map[string]json.RawMessage
	err := c.do(ctx, call{
		method:  http.MethodGet,
		path:    "/" + url.PathEscape(phoneNumberID),
		query:   url.Values{"fields": {healthFields}},
		token:   token,
		secrets: []string{token},
	}, &out)
	if err != nil {
		return NumberHealth{}, err
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(out[k], &s) // absent, null or not a string: ""
		return s
	}
	h := NumberHealth{QualityRating: str("quality_rating"), NameStatus: str("name_status"),
		MessagingLimit: str("whatsapp_business_manager_messaging_limit")}
	if h.MessagingLimit == "" {
		h.MessagingLimit = str("messaging_limit_tier")
	}
	var tp struct {
		Level json.RawMessage `json:"level"`
	}
	if json.Unmarshal(out["throughput"], &tp) == nil {
		_ = json.Unmarshal(tp.Level, &h.Throughput)
	}
	return h, nil
}
