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
		json.Unmarshal([]byte(tc.in), &a)
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
