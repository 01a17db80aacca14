package main

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// runReceiver serves the webhook over HTTPS and its counts over plain HTTP (GET /stats), and
// writes "<webhook URL>\n<stats URL>\n<CA PEM>" to out. It serves until the process is
// killed: it returns only when it cannot start or the counts can no longer be served.
func runReceiver(out string) error {
	var mu sync.Mutex
	seen := map[string]struct{}{}
	var receipts atomic.Int64
	hook := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(body, &ev)
		receipts.Add(1)
		mu.Lock()
		seen[ev.ID] = struct{}{}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	hook.StartTLS()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hook.Certificate().Raw})
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, []byte(hook.URL+"/hook\nhttp://"+ln.Addr().String()+"/stats\n"+string(ca)), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	// The listener queues the generator's first connections until Serve accepts them.
	return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		fmt.Fprintf(w, "%d %d", n, receipts.Load())
	}))
}

// statsReader reads the receiver's counts.
type statsReader struct {
	client *http.Client
	url    string
}

func newStatsReader(u string) statsReader {
	return statsReader{client: &http.Client{Timeout: 5 * time.Second}, url: u}
}

// read returns the distinct event ids and receipts the receiver has counted.
func (s statsReader) read() (distinct, receipts int64, err error) {
	resp, err := s.client.Get(s.url)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_, err = fmt.Sscanf(string(b), "%d %d", &distinct, &receipts)
	return distinct, receipts, err
}

// startReceiver runs this program again as the receiver (-receiver), its files in dir, and
// returns the process, the webhook's URL, the URL of its counts and the path of its CA.
func startReceiver(ctx context.Context, dir string) (rcv *benchkit.Child, hookURL, statsURL, caPath string, err error) {
	rcvFile := filepath.Join(dir, "receiver")
	rcv, err = benchkit.StartSelf("receiver", filepath.Join(dir, "receiver.log"), nil, "-receiver", rcvFile)
	if err != nil {
		return nil, "", "", "", err
	}
	var rcvInfo []byte
	for deadline := time.Now().Add(10 * time.Second); ; {
		if rcvInfo, err = os.ReadFile(rcvFile); err == nil {
			break
		}
		if time.Now().After(deadline) || rcv.Exited() || ctx.Err() != nil {
			rcv.Stop()
			return nil, "", "", "", fmt.Errorf("receiver did not start\n%s", rcv.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	lines := strings.SplitN(string(rcvInfo), "\n", 3)
	caPath = filepath.Join(dir, "receiver-ca.pem")
	if err := os.WriteFile(caPath, []byte(lines[2]), 0o600); err != nil {
		rcv.Stop()
		return nil, "", "", "", err
	}
	return rcv, lines[0], lines[1], caPath, nil
}
