package relay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// discardLog is a CallLog that drops every call.
type discardLog struct{}

func (discardLog) Record(Call) {}

// BenchmarkServeSend measures the relay's own work for one send (token lookup from the cache,
// scope, key removal, admission in memory, token swap, passing the answer on) with an upstream
// that answers at once. Run: go test -run '^$' -bench ServeSend -benchmem ./relay
// (the -log variants: with a call log, the relay's own part of the relay log's cost).
func BenchmarkServeSend(b *testing.B) {
	for _, tc := range []struct{ keyed, logged bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		keyed := tc.keyed
		name := "no-key"
		if keyed {
			name = "key"
		}
		if tc.logged {
			name += "-log" // a call log that takes each call (the relay's part of the log's cost)
		}
		b.Run(name, func(b *testing.B) {
			f := newRelayFixture(b, 1<<30, nil)
			if tc.logged {
				f.relay.CallLog = discardLog{}
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
				if w.Code != 200 {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			b.StopTimer()
			if err := f.pending.Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}
