package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/store"
)

type generator struct {
	c      config
	url    string
	pnids  []string
	runID  string
	client *http.Client
	seq    atomic.Int64
}

type counts struct{ accepted, skipped, failed atomic.Int64 }

// sign returns the upstream's X-Hub-Signature-256 of body.
func sign(body []byte) string {
	m := hmac.New(sha256.New, []byte(appSecret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// body returns a post of n items on channel pnid: messages, or statuses of outgoing messages.
func (g *generator) body(pnid string, n int, statuses bool, tag string) []byte {
	now := strconv.FormatInt(time.Now().Unix(), 10)
	var b bytes.Buffer
	b.WriteString(`{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"1","phone_number_id":"` + pnid + `"},`)
	if statuses {
		b.WriteString(`"statuses":[`)
	} else {
		b.WriteString(`"contacts":[{"profile":{"name":"L"},"wa_id":"1666"}],"messages":[`)
	}
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		id := "wamid.lg." + g.runID + "." + tag + "." + strconv.FormatInt(g.seq.Add(1), 10)
		if statuses {
			b.WriteString(`{"id":"` + id + `","status":"delivered","timestamp":"` + now + `","recipient_id":"1666` + strconv.Itoa(i) + `"}`)
		} else {
			b.WriteString(`{"from":"1666` + strconv.Itoa(i) + `","id":"` + id + `","timestamp":"` + now + `","type":"text","text":{"body":"hello"}}`)
		}
	}
	b.WriteString(`]}}]}]}`)
	return b.Bytes()
}

// load offers rate events/s for d (open loop) and returns the counts and every post's ack time.
func (g *generator) load(ctx context.Context, rate int, d time.Duration, tag string) (*counts, []time.Duration) {
	var res counts
	posts := int(int64(rate) * int64(d) / int64(time.Second) / int64(g.c.perPost))
	interval := time.Duration(float64(time.Second) * float64(g.c.perPost) / float64(rate))
	slots := make(chan struct{}, g.c.maxInflight)
	var mu sync.Mutex
	acks := make([]time.Duration, 0, posts)
	var wg sync.WaitGroup
	start := time.Now()
	for k := range posts {
		if wait := time.Until(start.Add(time.Duration(k) * interval)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return &res, acks
			}
		}
		select {
		case slots <- struct{}{}:
		default:
			res.skipped.Add(1)
			continue
		}
		body := g.body(g.pnids[k%len(g.pnids)], g.c.perPost, mrand.Float64() < g.c.statuses, tag)
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Hub-Signature-256", sign(body))
			t0 := time.Now()
			resp, err := g.client.Do(req)
			if err != nil {
				res.failed.Add(1)
				return
			}
			rb, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var ans struct{ Events int }
			if resp.StatusCode != http.StatusOK || json.Unmarshal(rb, &ans) != nil {
				res.failed.Add(1)
				return
			}
			el := time.Since(t0)
			res.accepted.Add(int64(ans.Events))
			mu.Lock()
			acks = append(acks, el)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return &res, acks
}

// createData makes the org, the channels (one phone number id each) and the webhook.
func createData(ctx context.Context, dsn string, key []byte, pnids []string, hookURL string) error {
	st, pool, err := benchkit.SetupStore(ctx, dsn, key, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	org, err := st.CreateOrg(ctx, "loadgen")
	if err != nil {
		return err
	}
	if _, err := benchkit.CreateChannels(ctx, st, org.ID, len(pnids), 1, func(i int) (string, store.Connection) {
		return "loadgen " + strconv.Itoa(i), store.Connection{PhoneNumberID: pnids[i], WabaID: wabaID,
			DisplayPhoneNumber: fmt.Sprintf("+1 555-%07d", i), VerifiedName: "Loadgen", UpstreamToken: "EAAGload" + benchkit.RandHex(8)}
	}); err != nil {
		return err
	}
	_, _, err = st.CreateWebhook(ctx, org.ID, store.NewWebhook{Name: "loadgen", URL: hookURL,
		Events: []string{store.EventMessages, store.EventMessageStatus}})
	return err
}
