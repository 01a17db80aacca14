package fakegraph

import (
	"net/url"
	"slices"
	"strings"
)

// NumberHealth is what GET /{pnid} answers for a number's health fields (SetNumberHealth). An
// empty string keeps the fake's default: quality_rating GREEN, name_status APPROVED,
// whatsapp_business_manager_messaging_limit TIER_2K, messaging_limit_tier TIER_1K, throughput
// level STANDARD (NOT_APPLICABLE when the number is not registered).
type NumberHealth struct {
	QualityRating      string // quality_rating: GREEN, YELLOW, RED, UNKNOWN
	NameStatus         string // name_status
	MessagingLimit     string // whatsapp_business_manager_messaging_limit, e.g. TIER_10K
	MessagingLimitTier string // messaging_limit_tier (the older field)
	Throughput         string // throughput.level, e.g. HIGH
	// NoManagerLimit leaves whatsapp_business_manager_messaging_limit out of the answer (as for
	// numbers the upstream reports only messaging_limit_tier for).
	NoManagerLimit bool
}

// SetNumberHealth sets (or changes) the health GET /{pnid} answers for a number added with
// AddNumber; it is a no-op for an unknown number.
func (s *Server) SetNumberHealth(pnid string, h NumberHealth) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.numbers[pnid]; n != nil {
		n.health = h
	}
}

// HealthReads returns how many GET /{pnid} asked for the number's quality_rating (a health read)
// and were answered with its fields.
func (s *Server) HealthReads(pnid string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if n := s.numbers[pnid]; n != nil {
		return n.healthReads
	}
	return 0
}

// countHealthRead counts a read of the number that asks for quality_rating. s.mu is held.
func (s *Server) countHealthRead(pnid string, fields []string) {
	if n := s.numbers[pnid]; n != nil && slices.Contains(fields, "quality_rating") {
		n.healthReads++
	}
}

// or returns v, or def when v is empty.
func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// WithHealthReadsUnrecorded leaves the number health reads (GET /{pnid} asking for
// quality_rating, as the relay's health worker makes in the background) out of Requests, so that
// a test counting the relay's own calls to the upstream does not count them; HealthReads still
// counts them.
func WithHealthReadsUnrecorded() Option { return func(s *Server) { s.unrecordedHealth = true } }

// isHealthRead reports whether r is a GET of a node asking for quality_rating.
func isHealthRead(r Request) bool {
	if r.Method != "GET" {
		return false
	}
	q, err := url.ParseQuery(r.RawQuery)
	return err == nil && slices.Contains(strings.Split(q.Get("fields"), ","), "quality_rating")
}
