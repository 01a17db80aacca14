package relay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// discardLog is a CallLog that drops every call.
type discardLog struct{}

func (discardLog) Record(Call) {}

// BenchmarkServeSend measures the relay's own work for one send (token lookup from the cache,
// scope, key removal, admission in memory, token swap, passing the answer on) with an upstream
// that answers at once. Run: go test -run '^$' -bench ServeSend -benchmem ./relay
// (the -log variants: with a call log, the relay's own part of the relay log's cost; the -window
// variants: window_guard enforce with the recipient's window open, the look-up and the header).
// Compare a variant with its base: go test -run '^$' -bench 'ServeSend/no-key(-window)?$' -count 6 ./relay
func BenchmarkServeSend(b *testing.B) {
	for _, tc := range []struct{ keyed, logged, window bool }{{false, false, false}, {true, false, false}, {false, true, false},
		{true, true, false}, {false, false, true}, {true, false, true}} {
		keyed := tc.keyed
		name := "no-key"
		if keyed {
			name = "key"
		}
		if tc.logged {
			name += "-log" // a call log that takes each call (the relay's part of the log's cost)
		}
		if tc.window {
			name += "-window"
		}
		b.Run(name, func(b *testing.B) {
			f := newRelayFixture(b, 1<<30, nil)
			if tc.logged {
				f.relay.CallLog = discardLog{}
			}
			if tc.window {
				storeIncoming(b, f.store, "15551234567", "wamid.bench", time.Now())
				f.relay.Windows, f.relay.WindowGuard = NewWindows(f.store, nil), GuardEnforce
			}
			answer := []byte(`{"messaging_product":"whatsapp","contacts":[{"input":"15551234567","wa_id":"15551234567"}],"messages":[{"id":"wamid.HBgLMTU1NTEyMzQ1NjcVAgARGBI2RTBENjkwMDAwMDAwMDAwMDEA"}]}`)
			up := func(w http.ResponseWriter, r *http.Request) error {
				h := w.Header()
				h["Content-Type"] = []string{"application/json; charset=UTF-8"}
				h["X-Fb-Trace-Id"] = []string{"AbCdEfGhIjK"}
				h["Content-Length"] = []string{strconv.Itoa(len(answer))}
				w.WriteHeader(200)
				w.Write(answer)
				return nil
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key := ""
				if keyed {
					key = "k" + strconv.FormatInt(seq.Add(1), 10)
				}
				r := httptest.NewRequest("POST", "http://relay.example.com/"+tPNID+"/messages", strings.NewReader(sendBody("hi", key)))
				r.Header.Set("Authorization", "Bearer "+f.token)
				w := httptest.NewRecorder()
				f.relay.Serve(w, r, up)
				if w.Code != 200 || tc.window && w.Header().Get(WindowHeader) != "open" {
					b.Fatalf("%d %s %v", w.Code, w.Body, w.Header())
				}
			}
			b.StopTimer()
			if err := f.pending.Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}
