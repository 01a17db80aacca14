package testenv

import (
	"net/http"
	"sync/atomic"
	"testing"
)

// DownReceiver is the kit's HTTPS receiver (ReceiverOpts.TLS) with an outage switch: while
// down it answers every delivery 503 (a receiver behind its load balancer during an outage) and
// counts them; once up it answers 204. It starts down.
type DownReceiver struct {
	*Receiver
	down      atomic.Bool
	whileDown atomic.Int64
}

// NewDownReceiver starts a DownReceiver, down.
func NewDownReceiver(t testing.TB) *DownReceiver {
	r := &DownReceiver{}
	r.down.Store(true)
	r.Receiver = NewReceiver(t, &ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, _ *http.Request) {
		if r.down.Load() {
			r.whileDown.Add(1)
			http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}})
	return r
}

// SetDown takes the receiver down (true) or brings it up (false).
func (r *DownReceiver) SetDown(down bool) { r.down.Store(down) }

// WhileDown returns how many deliveries the receiver answered 503.
func (r *DownReceiver) WhileDown() int64 { return r.whileDown.Load() }
