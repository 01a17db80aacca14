package fakegraph

import (
	"encoding/json"
	"strings"
)

// statusPricing is the pricing object the fake puts on the "sent" and "delivered" statuses of
// a message it accepted (§3.4; research/whatsapp.md "pricing"), as per-message pricing (PMP)
// has it:
//
//   - a template is billable, type "regular", category its template's category in lower case
//     (marketing, utility, authentication; "utility" for a template the fake cannot find);
//   - any other message can only be sent inside the customer-service window, where it is free:
//     category "service", type "free_customer_service", not billable.
func (s *Server) statusPricing(pnid string, template json.RawMessage) *whPricing {
	if template == nil {
		return &whPricing{false, "PMP", "free_customer_service", "service"}
	}
	category := "utility"
	var m struct {
		Name     string `json:"name"`
		Language struct {
			Code string `json:"code"`
		} `json:"language"`
	}
	_ = json.Unmarshal(template, &m) // (validated by validateTemplate)
	s.mu.RLock()
	if n := s.numbers[pnid]; n != nil {
		if w := s.wabas[n.waba]; w != nil {
			for _, t := range w.templates {
				if t.Name == m.Name && t.Language == m.Language.Code && t.Category != "" {
					category = strings.ToLower(t.Category)
					break
				}
			}
		}
	}
	s.mu.RUnlock()
	return &whPricing{true, "PMP", "regular", category}
}
