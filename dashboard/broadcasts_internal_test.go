package dashboard

import (
	"strings"
	"testing"
)

// TestParseRecipientsCSV: the header names "to" and var1, var2, … in any order; each line is a
// recipient whose vars become one body component with text parameters; an error names the CSV
// line at fault.
func TestParseRecipientsCSV(t *testing.T) {
	rs, lines, err := parseRecipientsCSV(strings.NewReader("\ufeffvar2, TO ,var1\r\nA-1,+1 650 555 0101,Ana\r\n\r\n\"A,2\",16505550102,\"Ben \"\"B\"\"\"\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].To != "+1 650 555 0101" || rs[1].To != "16505550102" || lines[0] != 2 || lines[1] != 4 {
		t.Fatalf("%+v %v", rs, lines)
	}
	if got, want := string(rs[0].Components), `[{"parameters":[{"text":"Ana","type":"text"},{"text":"A-1","type":"text"}],"type":"body"}]`; got != want {
		t.Errorf("components %s, want %s", got, want)
	}
	if got, want := string(rs[1].Components), `[{"parameters":[{"text":"Ben \"B\"","type":"text"},{"text":"A,2","type":"text"}],"type":"body"}]`; got != want {
		t.Errorf("components %s, want %s", got, want)
	}
	// no vars: no components
	rs, _, err = parseRecipientsCSV(strings.NewReader("to\n16505550101\n"))
	if err != nil || len(rs) != 1 || rs[0].Components != nil {
		t.Fatalf("%+v %v", rs, err)
	}

	for csv, want := range map[string]string{
		"":                            "The CSV file is empty.",
		"phone\n1650\n":               `CSV line 1: column "phone" is neither "to" nor var1`,
		"to,name\n1650,Ana\n":         `CSV line 1: column "name" is neither`,
		"to,var0\n1650,Ana\n":         `CSV line 1: column "var0" is neither`,
		"to,to\n1,2\n":                `CSV line 1: the column "to" appears twice.`,
		"var1\nAna\n":                 `CSV line 1 has no column "to".`,
		"to,var2\n1650,Ana\n":         "CSV line 1: there are 1 var columns but no var1",
		"to,var1\n1650,Ana\n1651\n":   "CSV line 3 has a different number of fields than the header line.",
		"to,var1\n1650,Ana\n,Ben\n":   `CSV line 3: "to" is empty.`,
		"to,var1\n1650,Ana\n1651, \n": "CSV line 3: var1 is empty",
		"to\n":                        "The CSV file lists no recipients",
		"to,var1\n1650,\"Ana\n":       "CSV line 2",
		"to,,var1\n1650,x,Ana\n":      "CSV line 1: column 2 has no name.",
	} {
		_, _, err := parseRecipientsCSV(strings.NewReader(csv))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", csv, err, want)
		}
	}
}

// TestCSVLineOf: the API's message about recipients[i] is prefixed with the CSV line of that
// recipient; others are left alone.
func TestCSVLineOf(t *testing.T) {
	lines := []int{2, 3, 5}
	if got := csvLineOf(`"recipients[2].to" must be a phone number`, lines); got != `CSV line 5: "recipients[2].to" must be a phone number` {
		t.Error(got)
	}
	for _, msg := range []string{`"recipients[3].to" must be a phone number`, `"name" is required`} {
		if got := csvLineOf(msg, lines); got != msg {
			t.Errorf("%q → %q", msg, got)
		}
	}
}

// TestDemoBroadcastRecipients: ten distinct made-up numbers per batch, different batches apart.
func TestDemoBroadcastRecipients(t *testing.T) {
	a, b := demoBroadcastRecipients("0123456789abcdef"), demoBroadcastRecipients("fedcba9876543210")
	seen := map[string]bool{}
	for _, n := range append(a, b...) {
		if len(n) != 11 || !strings.HasPrefix(n, "1650555") || seen[n] {
			t.Errorf("number %q (or repeated)", n)
		}
		seen[n] = true
	}
	if len(a) != demoBroadcastSize {
		t.Errorf("%d recipients", len(a))
	}
}
