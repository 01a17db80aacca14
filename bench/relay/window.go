package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// benchRecipient is the "to" of every bench send (load.go, wrk.go).
const benchRecipient = "15551234567"

// openWindows makes every channel's bench recipient one who wrote a minute ago, as intake
// records it (-compare-window): (b) finds each window open and lets every send through.
func openWindows(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, `INSERT INTO contacts (channel_id, wa_id, last_inbound_at)
		SELECT id, $1, now() - interval '1 minute' FROM channels`, benchRecipient); err != nil {
		return fmt.Errorf("opening the windows: %w", err)
	}
	return nil
}

// windowHeader sends one text (without a key) through t on its first channel and returns its
// Wabarelay-Window header.
func windowHeader(ctx context.Context, t *target, token string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body := `{"messaging_product":"whatsapp","recipient_type":"individual","to":"` + benchRecipient + `","type":"text","text":{"body":"window check"}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.urls[0], strings.NewReader(body))
	if err != nil {
		return "error: " + err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Header.Get("Wabarelay-Window")
}
