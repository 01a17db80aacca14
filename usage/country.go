// Package usage holds the domain rules of wabarelay's usage by pricing category (DESIGN §5c
// "Usage by pricing category") that are not SQL: the country of a recipient's number, the
// operator's rate card and the exact decimal arithmetic of costs, and the UTC-day window of a
// usage query. It imports neither Caddy nor the store.
package usage

import (
	"github.com/nyaruka/phonenumbers"
)

// UnknownCountry is the country of a number no country can be told for: ISO 3166-1's
// user-assigned "ZZ", as libphonenumber names an unknown region.
const UnknownCountry = "ZZ"

// Country returns the ISO 3166-1 alpha-2 code of the country of a WhatsApp number, given as its
// wa_id (the international number's digits, no "+"), by libphonenumber's metadata
// (github.com/nyaruka/phonenumbers):
//
//   - a calling code of one country gives that country (+33 → FR), whatever the rest;
//   - a calling code shared by several (+1, +7, +44, …) gives the country whose numbering plan
//     the number fits (+1 416 → CA, +1 212 → US);
//   - anything else is UnknownCountry: not 6 to 15 digits, a calling code no country has (+999),
//     a non-geographic one (+800, +882: "001" in the library, not a country), or a shared code
//     whose countries none claims the number (+1 555 …, a made-up area code). Guessing the
//     code's main country there (US for every +1) would price a Caribbean number as a US one.
func Country(waID string) string {
	if len(waID) < 6 || len(waID) > 15 {
		return UnknownCountry
	}
	for i := 0; i < len(waID); i++ {
		if waID[i] < '0' || waID[i] > '9' {
			return UnknownCountry
		}
	}
	num, err := phonenumbers.Parse("+"+waID, UnknownCountry)
	if err != nil {
		return UnknownCountry
	}
	region := phonenumbers.GetRegionCodeForNumber(num)
	if len(region) != 2 || region == UnknownCountry || region[0] < 'A' || region[0] > 'Z' {
		return UnknownCountry // "" (none claims it) or "001" (non-geographic)
	}
	return region
}
