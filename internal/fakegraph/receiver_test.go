package fakegraph_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
	"github.com/wabarelay/wabarelay/internal/testenv"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReceiver: the receiver serves HTTPS with a certificate that a client trusting only the
// written CA file accepts for 127.0.0.1 and localhost, logs each delivery and lists them.
func TestReceiver(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	logs := new(syncBuf)
	u, srv, err := fakegraph.ListenTLS("127.0.0.1:0", caFile, &fakegraph.Receiver{Log: logs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	client := testenv.TLSClient(t, caFile)

	body := `{"id":"evt_1","type":"messages","data":{"message":{"text":{"body":"Hello"}}}}`
	req, _ := http.NewRequest("POST", u+"/receiver", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", "evt_1")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 204 {
		t.Fatalf("POST: %d", res.StatusCode)
	}
	if l := logs.String(); !strings.Contains(l, "receiver: delivery messages (evt_1) /receiver ") || !strings.Contains(l, `"body":"Hello"`) {
		t.Fatalf("log %q", l)
	}

	// the same certificate is good for localhost
	port := u[strings.LastIndex(u, ":")+1:]
	res, err = client.Get("https://localhost:" + port + "/receiver")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got []fakegraph.Delivery
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil || len(got) != 1 || got[0].Headers["Webhook-Id"] != "evt_1" {
		t.Fatalf("list: %+v %v", got, err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, got[0].Body); err != nil {
		t.Fatalf("listed body %s: %v", got[0].Body, err)
	}
	if compact.String() != body || string(got[0].Raw) != body || got[0].Path != "/receiver" {
		t.Fatalf("listed body %s", got[0].Body)
	}

	// an untrusting client refuses it
	if _, err := http.Get(u + "/receiver"); err == nil {
		t.Fatal("the receiver's certificate is trusted without its CA")
	}
}
