package usage

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"math/bits"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// RateCard is the operator's price of one billable message per recipient country and pricing
// category (`wabarelay { rate_card <file.csv> }`): the upstream's published rate card reshaped,
// in one currency. Prices are exact decimals; a cost is billable × price, computed in integers
// of the card's smallest unit (no float rounding). A RateCard is immutable and safe for
// concurrent use. The nil *RateCard prices nothing.
type RateCard struct {
	// prices are in units of 10^-scale, by country and category.
	prices map[rateKey]*big.Int
	// scale is the most decimals any price of the card is written with: every cost and total
	// is written with that many (a card of 0.0147 and 0.0250 writes 0.0294, 0.0500).
	scale int
}

type rateKey struct{ country, category string }

// rateCardHeader is the first line a rate card must have.
const rateCardHeader = "country,category,price"

// Bounds on a price as written: enough for any currency's per-message price, small enough that
// a typo (a pasted id) is refused rather than carried into every cost.
const (
	maxPriceDecimals = 12
	maxPriceDigits   = 12 // before the point
)

var (
	priceRe   = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	countryRe = regexp.MustCompile(`^[A-Za-z]{2}$`)
)

// LoadRateCard reads and parses the rate card file at path (see ParseRateCard); its errors
// name the file and, for its content, the line.
func LoadRateCard(path string) (*RateCard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rate_card: %w", err)
	}
	c, err := ParseRateCard(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("rate_card %s: %w", path, err)
	}
	return c, nil
}

// ParseRateCard parses a rate card: CSV (RFC 4180; a UTF-8 byte order mark is skipped, blank
// lines are ignored) whose first line is the header `country,category,price` and each further
// line one price: country an ISO 3166-1 alpha-2 code (any case; ZZ prices the numbers whose
// country is unknown), category the upstream's pricing category as the status webhooks write
// it (marketing, utility, authentication, …; matched exactly), price a non-negative decimal
// number such as 0.0250 (at most 12 digits before the point and 12 after; no sign, exponent or
// thousands separator). A country and category may be priced once. The first problem is
// reported with its line number ("line 4: price "-0.01" is negative").
func ParseRateCard(r io.Reader) (*RateCard, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1 // counted here, to say what is expected
	cr.TrimLeadingSpace = true
	type row struct {
		line            int
		country, cat    string
		whole, fraction string
	}
	var rows []row
	seen := map[rateKey]int{}
	c := &RateCard{prices: map[rateKey]*big.Int{}}
	for first := true; ; first = false {
		rec, err := cr.Read()
		if err == io.EOF {
			if first {
				return nil, errors.New("empty file: the first line must be the header " + rateCardHeader)
			}
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, fmt.Errorf("line %d: %w", pe.Line, pe.Err)
			}
			return nil, err
		}
		line, _ := cr.FieldPos(0)
		if first {
			if len(rec) > 0 {
				rec[0] = strings.TrimPrefix(rec[0], "\uFEFF")
			}
			if got := strings.ToLower(strings.Join(trimAll(rec), ",")); got != rateCardHeader {
				return nil, fmt.Errorf("line %d: the header must be %s, got %q", line, rateCardHeader, strings.Join(rec, ","))
			}
			continue
		}
		if len(rec) != 3 {
			return nil, fmt.Errorf("line %d: %d columns, want 3 (%s)", line, len(rec), rateCardHeader)
		}
		rec = trimAll(rec)
		country, cat, price := strings.ToUpper(rec[0]), rec[1], rec[2]
		switch {
		case !countryRe.MatchString(country):
			return nil, fmt.Errorf("line %d: country %q is not an ISO 3166-1 alpha-2 code (two letters)", line, rec[0])
		case cat == "":
			return nil, fmt.Errorf("line %d: category is empty", line)
		case strings.HasPrefix(price, "-") && priceRe.MatchString(price[1:]):
			return nil, fmt.Errorf("line %d: price %q is negative", line, price)
		case !priceRe.MatchString(price):
			return nil, fmt.Errorf("line %d: price %q is not a decimal number such as 0.0250", line, price)
		}
		whole, fraction, _ := strings.Cut(price, ".")
		if len(whole) > maxPriceDigits || len(fraction) > maxPriceDecimals {
			return nil, fmt.Errorf("line %d: price %q has more than %d digits before or after the point", line, price, maxPriceDigits)
		}
		k := rateKey{country, cat}
		if prev, dup := seen[k]; dup {
			return nil, fmt.Errorf("line %d: country %s and category %s are already priced on line %d", line, country, cat, prev)
		}
		seen[k] = line
		rows = append(rows, row{line, country, cat, whole, fraction})
		c.scale = max(c.scale, len(fraction))
	}
	for _, r := range rows {
		units, _ := new(big.Int).SetString(r.whole+r.fraction+strings.Repeat("0", c.scale-len(r.fraction)), 10)
		c.prices[rateKey{r.country, r.cat}] = units
	}
	return c, nil
}

func trimAll(ss []string) []string {
	for i, s := range ss {
		ss[i] = strings.TrimSpace(s)
	}
	return ss
}

// Len returns how many prices the card lists.
func (c *RateCard) Len() int {
	if c == nil {
		return 0
	}
	return len(c.prices)
}

// Cost returns billable × the price of country and category as a decimal string with the
// card's decimals, and false when the card lists no price for them (or c is nil).
func (c *RateCard) Cost(country, category string, billable int64) (string, bool) {
	if c == nil {
		return "", false
	}
	p, ok := c.prices[rateKey{country, category}]
	if !ok {
		return "", false
	}
	if units, ok := mulSmall(p, billable); ok {
		return c.formatSmall(units), true
	}
	return c.format(new(big.Int).Mul(p, big.NewInt(billable))), true
}

// mulSmall returns p × n when both and the product fit an int64 (the usual case: a price of a
// few thousand units times a count), so that a cost needs no big.Int.
func mulSmall(p *big.Int, n int64) (int64, bool) {
	if !p.IsInt64() || n < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(p.Int64()), uint64(n))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// formatSmall is format for units that fit an int64 (non-negative), with one allocation.
func (c *RateCard) formatSmall(units int64) string {
	var buf [48]byte
	return string(c.appendSmall(buf[:0], units))
}

// appendSmall appends units (non-negative, in an int64) as a decimal with the card's decimals.
func (c *RateCard) appendSmall(b []byte, units int64) []byte {
	var digits [24]byte
	d := strconv.AppendInt(digits[:0], units, 10)
	if c.scale == 0 {
		return append(b, d...)
	}
	if len(d) > c.scale {
		b = append(b, d[:len(d)-c.scale]...)
		d = d[len(d)-c.scale:]
	} else {
		b = append(b, '0')
	}
	b = append(b, '.')
	for range c.scale - len(d) {
		b = append(b, '0')
	}
	return append(b, d...)
}

// format writes units of 10^-scale as a decimal string: "0.0750", "-1.50", "12".
func (c *RateCard) format(units *big.Int) string {
	s := new(big.Int).Abs(units).String()
	sign := ""
	if units.Sign() < 0 {
		sign = "-"
	}
	if c.scale == 0 {
		return sign + s
	}
	if len(s) <= c.scale {
		s = strings.Repeat("0", c.scale-len(s)+1) + s
	}
	return sign + s[:len(s)-c.scale] + "." + s[len(s)-c.scale:]
}

// Total adds up the costs of one card exactly; make one with RateCard.Total.
type Total struct {
	card  *RateCard
	small int64 // the sum while it fits an int64
	big   *big.Int
}

// Total returns an empty sum of the card's costs.
func (c *RateCard) Total() *Total { return &Total{card: c} }

// Cost is RateCard.Cost, the cost added to the sum.
func (t *Total) Cost(country, category string, billable int64) (string, bool) {
	c := t.card
	if c == nil {
		return "", false
	}
	p, ok := c.prices[rateKey{country, category}]
	if !ok {
		return "", false
	}
	if units, ok := mulSmall(p, billable); ok {
		if t.big == nil && t.small <= math.MaxInt64-units {
			t.small += units
		} else {
			t.addBig(big.NewInt(units))
		}
		return c.formatSmall(units), true
	}
	units := new(big.Int).Mul(p, big.NewInt(billable))
	t.addBig(units)
	return c.format(units), true
}

// AppendCost is Cost appending the decimal to b instead (no allocation for the usual sizes).
func (t *Total) AppendCost(b []byte, country, category string, billable int64) ([]byte, bool) {
	c := t.card
	if c == nil {
		return b, false
	}
	p, ok := c.prices[rateKey{country, category}]
	if !ok {
		return b, false
	}
	if units, ok := mulSmall(p, billable); ok {
		if t.big == nil && t.small <= math.MaxInt64-units {
			t.small += units
		} else {
			t.addBig(big.NewInt(units))
		}
		return c.appendSmall(b, units), true
	}
	units := new(big.Int).Mul(p, big.NewInt(billable))
	t.addBig(units)
	return append(b, c.format(units)...), true
}

// Add adds the cost of billable messages of country and category, when the card prices them;
// it reports whether it does.
func (t *Total) Add(country, category string, billable int64) bool {
	_, ok := t.Cost(country, category, billable)
	return ok
}

func (t *Total) addBig(units *big.Int) {
	if t.big == nil {
		t.big = big.NewInt(t.small)
	}
	t.big.Add(t.big, units)
}

// String writes the sum as a decimal string with the card's decimals.
func (t *Total) String() string {
	if t.big != nil {
		return t.card.format(t.big)
	}
	if t.small < 0 { // (only from a negative count)
		return t.card.format(big.NewInt(t.small))
	}
	return t.card.formatSmall(t.small)
}
