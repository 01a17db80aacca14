package connect

import (
	"flag"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzReadCompletion: whatever is posted, reading a completion never panics, every refusal is
// a 4xx, and accepted ids are numeric strings and the code non-empty text.
func FuzzReadCompletion(f *testing.F) {
	for _, s := range []string{
		`{"code":"AQB","phone_number_id":"106540352242922","waba_id":"524126980791429"}`,
		`{"code":"\u0000","phone_number_id":"1\u00002","waba_id":"x"}`,
		"{\"code\":\"\xff\",\"phone_number_id\":\"1\",\"waba_id\":\"2\"}",
		`{"code":1,"phone_number_id":2,"waba_id":3}`, `{"code":null}`, `[]`, `{`, ``,
		`{"code":" ","phone_number_id":" 1 ","waba_id":"+2"}`,
	} {
		f.Add([]byte(s))
	}
	// Huge strings in every field: past the body limit (256 KiB, 1 MiB) and just under it. Run
	// with the seed corpus (go test); under -fuzz they are left out, as in managementapi's
	// FuzzRequestBody: their baseline coverage would take the fuzz time.
	if fl := flag.Lookup("test.fuzz"); fl == nil || fl.Value.String() == "" {
		for _, n := range []int{256 << 10, 1 << 20, 60 << 10} {
			for _, huge := range []string{strings.Repeat("7", n), strings.Repeat("x", n)} {
				f.Add([]byte(`{"code":"` + huge + `","phone_number_id":"1","waba_id":"2"}`))
				f.Add([]byte(`{"code":"AQB","phone_number_id":"` + huge + `","waba_id":"2"}`))
				f.Add([]byte(`{"code":"AQB","phone_number_id":"1","waba_id":"` + huge + `"}`))
			}
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/connect/complete", strings.NewReader(string(body)))
		in, status, msg := readCompletion(httptest.NewRecorder(), r)
		if status != 0 {
			if status < 400 || status >= 500 || msg == "" {
				t.Fatalf("%q: %d %q", body, status, msg)
			}
			return
		}
		for _, id := range []string{in.PhoneNumberID, in.WabaID} {
			if id == "" || strings.Trim(id, "0123456789") != "" {
				t.Fatalf("%q: accepted id %q", body, id)
			}
		}
		if strings.TrimSpace(in.Code) == "" {
			t.Fatalf("%q: accepted an empty code", body)
		}
	})
}
