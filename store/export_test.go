package store

import "time"

// SetNow replaces the store's clock (tests: intake on another day).
func (s *Store) SetNow(now func() time.Time) { s.now = now }

// ClaimSQL is the claim statement (tests measure its work).
const ClaimSQL = claimSQL
