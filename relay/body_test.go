package relay

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestRemoveKey(t *testing.T) {
	cases := []struct{ in, out, value string }{
		{`{"idempotency_key":"k1","to":"1"}`, `{"to":"1"}`, "k1"},
		{`{"to":"1","idempotency_key":"k1"}`, `{"to":"1"}`, "k1"},
		{`{"idempotency_key":"k1"}`, `{}`, "k1"},
		{`{ "a" : 1 ,  "idempotency_key" : "k" ,  "b":{"idempotency_key":"inner"} }`, `{ "a" : 1 ,  "b":{"idempotency_key":"inner"} }`, "k"},
		{"{\n  \"messaging_product\": \"whatsapp\",\n  \"idempotency_key\": \"x\\\"y\",\n  \"text\": {\"body\": \"a, }]\"}\n}",
			"{\n  \"messaging_product\": \"whatsapp\",\n  \"text\": {\"body\": \"a, }]\"}\n}", `x"y`},
		{`{"idempotency\u005fkey":"esc","z":[1,{"q":"}"}]}`, `{"z":[1,{"q":"}"}]}`, "esc"},
		{`{"idempotency_key":"a","idempotency_key":"b","c":true}`, `{"c":true}`, "b"},
		{`{"c":null,"idempotency_key":"a","idempotency_key":"b"}`, `{"c":null}`, "b"},
	}
	for _, tc := range cases {
		out, v, found, err := RemoveKey([]byte(tc.in), "idempotency_key")
		if err != nil || !found || string(out) != tc.out || v != tc.value {
			t.Errorf("RemoveKey(%s) = %s, %q, %v, %v; want %s, %q", tc.in, out, v, found, err, tc.out, tc.value)
			continue
		}
		var a, b map[string]any
		if err := json.Unmarshal([]byte(tc.in), &a); err != nil {
			t.Fatalf("case %s is not JSON: %v", tc.in, err)
		}
		if json.Unmarshal(out, &b) != nil {
			t.Errorf("output is not JSON: %s", out)
		}
		delete(a, "idempotency_key")
		if !reflect.DeepEqual(a, b) {
			t.Errorf("semantic change: %v vs %v", a, b)
		}
	}
	for _, in := range []string{`{"to":"1"}`, `[1]`, `not json`, `{"a":{"idempotency_key":"x"}}`, ``} {
		out, _, found, err := RemoveKey([]byte(in), "idempotency_key")
		if found || err != nil || string(out) != in {
			t.Errorf("RemoveKey(%s) changed it: %s %v %v", in, out, found, err)
		}
	}
	if _, _, found, err := RemoveKey([]byte(`{"idempotency_key":5}`), "idempotency_key"); !found || err != ErrKeyNotString {
		t.Errorf("non-string key: %v %v", found, err)
	}
}

func FuzzRemoveKey(f *testing.F) {
	f.Add([]byte(`{"a":1,"idempotency_key":"k","b":[1,2]}`))
	f.Add([]byte(`{"idempotency_key":"k"}`))
	f.Add([]byte(`{"idempotency\u005fkey":"k"}`))
	for _, in := range hugeSeeds() {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, _, found, err := RemoveKey(in, "idempotency_key")
		if !found {
			var m map[string]json.RawMessage
			if json.Unmarshal(in, &m) == nil && m["idempotency_key"] != nil {
				t.Fatalf("RemoveKey(%q) missed the key", in)
			}
			return
		}
		if err != nil {
			return
		}
		var a, b map[string]any
		if json.Unmarshal(in, &a) != nil {
			t.Fatalf("found a key in invalid JSON %q", in)
		}
		if err := json.Unmarshal(out, &b); err != nil {
			t.Fatalf("RemoveKey(%q) = %q: not JSON: %v", in, out, err)
		}
		delete(a, "idempotency_key")
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("RemoveKey(%q) = %q changed other members", in, out)
		}
	})
}

// TestCleanSendBody: a send's body loses its idempotency_key and every top-level access_token
// member, whatever the token's value and however its name is spelled in JSON; the rest of the
// body keeps its bytes, and a nested access_token (a message's text) stays.
func TestCleanSendBody(t *testing.T) {
	cases := []struct{ in, out, key string }{
		{`{"to":"1","access_token":"callers"}`, `{"to":"1"}`, ""},
		{`{"access_token":"callers","to":"1"}`, `{"to":"1"}`, ""},
		{`{"access_token":"callers"}`, `{}`, ""},
		{`{"to":"1","access_token":42,"access_token":{"a":[1]},"type":"text"}`, `{"to":"1","type":"text"}`, ""},
		{`{"access\u005ftoken":"esc","to":"1"}`, `{"to":"1"}`, ""},
		{`{"to":"1","idempotency_key":"k","access_token":"t"}`, `{"to":"1"}`, "k"},
		{`{"access_token":"t","idempotency_key":"k"}`, `{}`, "k"},
		{`{"idempotency_key":"k","to":"1","access_token":null}`, `{"to":"1"}`, "k"},
		{`{"text":{"body":"access_token","access_token":"inner"},"access_token":"x"}`, `{"text":{"body":"access_token","access_token":"inner"}}`, ""},
	}
	for _, tc := range cases {
		out, key, found, err := cleanSendBody([]byte(tc.in))
		if err != nil || string(out) != tc.out || key != tc.key || found != (tc.key != "") {
			t.Errorf("cleanSendBody(%s) = %s, %q, %v, %v; want %s, %q", tc.in, out, key, found, err, tc.out, tc.key)
			continue
		}
		var a, b map[string]any
		if err := json.Unmarshal([]byte(tc.in), &a); err != nil {
			t.Fatalf("case %s is not JSON: %v", tc.in, err)
		}
		if json.Unmarshal(out, &b) != nil {
			t.Errorf("output is not JSON: %s", out)
		}
		delete(a, "idempotency_key")
		delete(a, "access_token")
		if !reflect.DeepEqual(a, b) {
			t.Errorf("semantic change: %v vs %v", a, b)
		}
	}
	for _, in := range []string{`{"to":"1"}`, `{"text":{"access_token":"x"}}`, `not json "access_token"`, `["access_token"]`} {
		if out, _, found, err := cleanSendBody([]byte(in)); found || err != nil || string(out) != in {
			t.Errorf("cleanSendBody(%s) changed it: %s %v %v", in, out, found, err)
		}
	}
	if _, _, found, err := cleanSendBody([]byte(`{"access_token":"t","idempotency_key":5}`)); !found || err != ErrKeyNotString {
		t.Errorf("non-string key: %v %v", found, err)
	}
}
