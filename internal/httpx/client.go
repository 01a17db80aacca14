// Package httpx holds the small HTTP helpers shared by wabarelay's handlers that do not depend on
// Caddy: the documented JSON answers ({"error": ...} and the shared messages), and what is known
// of the client behind a request (its address and whether it reached us over HTTPS, as the host
// server saw it through trusted proxies).
package httpx

import (
	"context"
	"net"
	"net/http"
)

// Client is what the host server knows of the client that made a request.
type Client struct {
	// Addr is the client's IP address; behind trusted proxies, the address they reported.
	Addr string
	// HTTPS is true when the client reached the service over HTTPS: TLS terminated by the host
	// server itself, or by a trusted proxy that said so.
	HTTPS bool
}

type clientKey struct{}

// WithClient returns a context carrying c. The Caddy glue sets it from Caddy's own view of the
// request (client_ip, trusted_proxy); without it, the helpers below fall back to the connection.
func WithClient(ctx context.Context, c Client) context.Context {
	return context.WithValue(ctx, clientKey{}, c)
}

func clientOf(r *http.Request) (Client, bool) {
	c, ok := r.Context().Value(clientKey{}).(Client)
	return c, ok
}

// ClientAddr returns the client's IP address: the one set by [WithClient], else the host part
// of the connection's remote address.
func ClientAddr(r *http.Request) string {
	if c, ok := clientOf(r); ok && c.Addr != "" {
		return c.Addr
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// IsHTTPS reports whether the client reached the service over HTTPS.
func IsHTTPS(r *http.Request) bool {
	if c, ok := clientOf(r); ok {
		return c.HTTPS
	}
	return r.TLS != nil
}

// Origin returns the scheme and host the client addressed, e.g. "https://relay.example.com".
func Origin(r *http.Request) string {
	if IsHTTPS(r) {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}
