package relay

import (
	"testing"

	"github.com/wabarelay/wabarelay/store"
)

func TestCheckPath(t *testing.T) {
	for _, c := range []struct {
		path, raw string
		ok        bool
	}{
		{"/1001/messages", "", true},
		{"/v26.0/1001/messages", "", true},
		{"/2001/message_templates", "", true},
		{"/1001", "", true},
		{"/", "", false},
		{"", "", false},
		{"1001/messages", "", false},
		{"/1001/messages/", "", false},
		{"/1001//messages", "", false},
		{"/1001/./messages", "", false},
		{"/1001/../9009/messages", "", false},
		{"/..", "", false},
		{`/1001\..\9009`, "", false},
		{"/1001/messages", "/1001%2Fmessages", false},
		{"/1001/messages", "/1001%2fmessages", false},
		{`/1001\messages`, "/1001%5Cmessages", false},
		{"/1001/a b", "/1001/a%20b", true},
	} {
		if err := CheckPath(c.path, c.raw); (err == nil) != c.ok {
			t.Errorf("CheckPath(%q, %q) = %v, want ok=%v", c.path, c.raw, err, c.ok)
		}
	}
}

func TestInScope(t *testing.T) {
	ch := &store.RelayChannel{PhoneNumberID: "1001", WabaID: "2001", Objects: store.NewObjectSet("t1", "m1")}
	for path, want := range map[string]bool{
		"/1001/messages":          true,
		"/2001/message_templates": true,
		"/2001/phone_numbers":     true,
		"/t1":                     true,
		"/m1":                     true,
		"/1002/messages":          false,
		"/2001/subscribed_apps":   false,
		"/1001/subscribed_apps":   false,
		"/t1/subscribed_apps":     false,
		"/":                       false,
		"/me":                     false,
	} {
		if got := InScope(ch, path); got != want {
			t.Errorf("InScope(%q) = %v, want %v", path, got, want)
		}
	}
	// a channel not connected yet reaches nothing, even the empty id
	if InScope(&store.RelayChannel{}, "//messages") {
		t.Error("an unconnected channel reaches the empty id")
	}
}

func TestHanded(t *testing.T) {
	ch := &store.RelayChannel{PhoneNumberID: "1001", WabaID: "2001"}
	list := []byte(`{"data":[{"id":"t1"},{"id":"t2"}],"paging":{}}`)
	for _, c := range []struct {
		method, path string
		status       int
		body         []byte
		kind         string
		n            int
	}{
		{"GET", "/2001/message_templates", 200, list, store.ObjectTemplate, 2},
		{"POST", "/2001/message_templates", 200, []byte(`{"id":"t9","status":"PENDING"}`), store.ObjectTemplate, 1},
		{"POST", "/1001/media", 200, []byte(`{"id":"m1"}`), store.ObjectMedia, 1},
		// never: other edges, other accounts, failures, reads of media
		{"GET", "/2001/phone_numbers", 200, []byte(`{"data":[{"id":"1002"}]}`), "", 0},
		{"GET", "/2002/message_templates", 200, list, "", 0},
		{"GET", "/2001/message_templates", 400, list, "", 0},
		{"GET", "/1001/media", 200, []byte(`{"id":"m2"}`), "", 0},
		{"POST", "/1002/media", 200, []byte(`{"id":"m3"}`), "", 0},
		{"GET", "/t1", 200, []byte(`{"id":"t1","data":[{"id":"x"}]}`), "", 0},
		{"POST", "/1001/messages", 200, []byte(`{"messages":[{"id":"wamid.x"}]}`), "", 0},
		{"POST", "/1001/media", 200, []byte(`{"id":12}`), "", 0},
	} {
		kind, ids := Handed(ch, c.method, c.path, c.status, c.body)
		if kind != c.kind || len(ids) != c.n {
			t.Errorf("Handed(%s %s %d) = %q %v, want %q with %d ids", c.method, c.path, c.status, kind, ids, c.kind, c.n)
		}
	}
}

func TestReleaseKey(t *testing.T) {
	for _, c := range []struct {
		status           int
		answered, notSen bool
		release          bool
	}{
		{200, true, false, false},
		{400, true, false, true},   // the upstream refused: nothing sent
		{499, false, false, false}, // not the upstream's answer (a hang-up): unknown, kept
		{404, false, false, false},
		{500, true, false, false},
		{504, false, false, false},
		{0, false, false, false},
		{503, false, true, true}, // code 190 or never reached
	} {
		if got := ReleaseKey(c.status, c.answered, c.notSen); got != c.release {
			t.Errorf("ReleaseKey(%d, answered=%v, notSent=%v) = %v", c.status, c.answered, c.notSen, got)
		}
	}
	if ValidStatus(0) || ValidStatus(99) || !ValidStatus(100) || !ValidStatus(599) {
		t.Error("ValidStatus")
	}
}
