package usage

import (
	"strings"
	"testing"
)

// TestCountry: the country of numbers of several countries, a shared calling code told apart
// by its numbering plan, and ZZ for what places a number nowhere.
func TestCountry(t *testing.T) {
	for waID, want := range map[string]string{
		"12127365000":   "US", // +1 212: New York
		"14165550123":   "CA", // +1 416: Toronto (a shared code: the plan tells)
		"18092201234":   "DO", // +1 809: Dominican Republic
		"442079460958":  "GB",
		"5511987654321": "BR",
		"919876543210":  "IN",
		"4915123456789": "DE",
		"2348031234567": "NG",
		"33612345678":   "FR",
		"6281234567890": "ID",
		// unknown
		"":                 "ZZ",
		"abc":              "ZZ",
		"1212736500x":      "ZZ",
		"+12127365000":     "ZZ", // a wa_id has digits only
		"12345":            "ZZ", // too short
		"1234567890123456": "ZZ", // too long
		"9995550100":       "ZZ", // +999: no country's code
		"80012345678":      "ZZ", // +800: non-geographic
		"15550001234":      "ZZ", // +1 555: a made-up area code, no country's
	} {
		if got := Country(waID); got != want {
			t.Errorf("Country(%q) = %q, want %q", waID, got, want)
		}
	}
}

// TestParseRateCard: a card's prices, costs in exact decimals at the card's largest scale, and
// every kind of bad file refused naming its line.
func TestParseRateCard(t *testing.T) {
	card, err := ParseRateCard(strings.NewReader("\uFEFFCountry, Category ,PRICE\n" +
		"us,marketing,0.0250\n\nUS,utility,0.004\n\"IN\",\"marketing\",0.0107\nBR,authentication,2\nZZ,service,0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if card.Len() != 5 {
		t.Fatalf("%d prices", card.Len())
	}
	for _, tc := range []struct {
		country, cat string
		billable     int64
		want         string
		ok           bool
	}{
		{"US", "marketing", 3, "0.0750", true},
		{"US", "marketing", 0, "0.0000", true},
		{"US", "utility", 7, "0.0280", true},
		{"IN", "marketing", 1000000007, "10700000.0749", true}, // exact: no float rounding
		{"BR", "authentication", 5, "10.0000", true},
		{"ZZ", "service", 9, "0.0000", true},
		{"IN", "marketing", 9e18, "96300000000000000.0000", true}, // past an int64: big.Int
		{"US", "Marketing", 1, "", false},                         // categories match exactly
		{"GB", "marketing", 1, "", false},
	} {
		got, ok := card.Cost(tc.country, tc.cat, tc.billable)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Cost(%s, %s, %d) = %q %v, want %q %v", tc.country, tc.cat, tc.billable, got, ok, tc.want, tc.ok)
		}
	}
	total := card.Total()
	for _, a := range []struct {
		c, cat string
		n      int64
	}{{"US", "marketing", 3}, {"US", "utility", 7}, {"GB", "marketing", 100}, {"IN", "marketing", 1}} {
		total.Add(a.c, a.cat, a.n)
	}
	if got := total.String(); got != "0.1137" { // 0.0750 + 0.0280 + 0.0107; GB has no price
		t.Errorf("total = %s", got)
	}
	total.Add("IN", "marketing", 9e18)
	if got := total.String(); got != "96300000000000000.1137" {
		t.Errorf("total past an int64 = %s", got)
	}
	var none *RateCard
	if _, ok := none.Cost("US", "marketing", 1); ok || none.Len() != 0 {
		t.Error("the nil card prices")
	}

	for body, want := range map[string]string{
		"": "empty file",
		"country,price,category\nUS,marketing,1\n":         "line 1: the header must be country,category,price",
		"country,category,price\nUS,marketing\n":           "line 2: 2 columns, want 3",
		"country,category,price\nUS,marketing,1,2\n":       "line 2: 4 columns, want 3",
		"country,category,price\nUSA,marketing,1\n":        `line 2: country "USA" is not an ISO 3166-1 alpha-2 code`,
		"country,category,price\nU1,marketing,1\n":         `line 2: country "U1"`,
		"country,category,price\nUS,,1\n":                  "line 2: category is empty",
		"country,category,price\n\nUS,m,-0.01\n":           `line 3: price "-0.01" is negative`,
		"country,category,price\nUS,m,abc\n":               `line 2: price "abc" is not a decimal number`,
		"country,category,price\nUS,m,1e3\n":               `line 2: price "1e3" is not a decimal number`,
		"country,category,price\nUS,m,1,5\n":               "line 2: 4 columns",
		"country,category,price\nUS,m,.5\n":                `line 2: price ".5" is not a decimal number`,
		"country,category,price\nUS,m,0.1234567890123\n":   "line 2: price \"0.1234567890123\" has more than 12 digits",
		"country,category,price\nUS,m,1\nGB,m,1\nus,m,2\n": "line 4: country US and category m are already priced on line 2",
		"country,category,price\nUS,\"m,1\n":               "line 2",
	} {
		_, err := ParseRateCard(strings.NewReader(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}
