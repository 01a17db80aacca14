package dispatcher

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"code.dny.dev/ssrf"
	"go.uber.org/zap"
)

// Error classes: what the delivery log (the attempt's error, the delivery's last error) shows
// the tenant for an attempt that got no 2xx. A class names what went wrong from the receiver's
// side and nothing of this instance's network: no resolver, no address (a tenant who points a
// webhook at an internal name must not learn how it resolves, or that it does). The full error
// goes to the operator's log (Debug for every attempt, a rate-limited Warn).
//
// So a host name that does not resolve and one that resolves only to addresses deliveries may
// not go to are one class, ClassDNS: were they two, a tenant could tell which internal names
// this instance's resolver knows. ClassAddressNotAllowed is for a URL that names an address
// itself (an IP literal), whose class says nothing the URL did not.
const (
	// ClassDNS: the receiver's host name did not resolve to an address deliveries may go to:
	// it did not resolve, or only to addresses deliveries may not go to (which of the two is
	// not told).
	ClassDNS = "dns_error"
	// ClassConnectionRefused: nothing listens on the receiver's port.
	ClassConnectionRefused = "connection_refused"
	// ClassConnectionReset: the receiver closed or reset the connection before answering.
	ClassConnectionReset = "connection_reset"
	// ClassConnectionError: any other failure to reach the receiver.
	ClassConnectionError = "connection_error"
	// ClassAddressNotAllowed: the URL's host is an address (an IP literal) deliveries may not
	// go to (loopback, private, link-local and other special-purpose ranges; see
	// Config.AllowPrivateTargets). A host name whose addresses are all refused is ClassDNS.
	ClassAddressNotAllowed = "address_not_allowed"
	// ClassTLS: the TLS handshake failed (an untrusted, expired or mismatched certificate, no
	// TLS on the port, no common protocol version).
	ClassTLS = "tls_error"
	// ClassTimeout: no complete answer within Config.Timeout.
	ClassTimeout = "timeout"
	// ClassInvalidURL: the webhook's URL cannot be requested.
	ClassInvalidURL = "invalid_url"
)

// HTTPClass is the class of an answer with a status other than 2xx: "http_<status>". A 3xx is
// one too: redirects are never followed (the target must be the URL the tenant registered).
func HTTPClass(status int) string { return "http_" + strconv.Itoa(status) }

// classify returns the class of a failed request's error (see the Class constants); host is
// the request URL's host (without its port): an address refused for a host that is a name,
// not an IP literal, is ClassDNS, like a name that does not resolve.
func classify(err error, host string) string {
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	var alertErr tls.AlertError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	var timeoutErr interface{ Timeout() bool }
	switch {
	case errors.Is(err, ssrf.ErrProhibitedIP), errors.Is(err, ssrf.ErrProhibitedNetwork), errors.Is(err, ssrf.ErrProhibitedPort):
		if _, notIP := netip.ParseAddr(host); notIP != nil {
			return ClassDNS // a name: whether it resolves is not told
		}
		return ClassAddressNotAllowed
	case errors.As(err, &dnsErr):
		return ClassDNS
	case errors.As(err, &certErr), errors.As(err, &recordErr), errors.As(err, &alertErr), errors.As(err, &unknownAuth),
		errors.As(err, &hostErr), errors.As(err, &invalidCert):
		return ClassTLS
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &timeoutErr) && timeoutErr.Timeout():
		return ClassTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassConnectionRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ClassConnectionReset
	}
	// Errors the TLS stack returns without a type of their own ("tls: …", "x509: …").
	if msg := err.Error(); strings.Contains(msg, "tls: ") || strings.Contains(msg, "x509: ") {
		return ClassTLS
	}
	return ClassConnectionError
}

// failureLog logs failed attempts for the operator: every one at Debug, with the full error,
// and at most one Warn per failureWarnEvery, counting the failures since the last one (a
// receiver that is down fails every attempt; its tenant sees the classes in the delivery log).
type failureLog struct {
	log *zap.Logger

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// failureWarnEvery is the least time between two Warn lines about failed attempts.
const failureWarnEvery = 10 * time.Second

func (f *failureLog) failed(j job, attempt int, status int, class, detail string, final bool) {
	fields := []zap.Field{zap.Stringer("delivery_id", j.ID), zap.Stringer("webhook_id", j.WebhookID),
		zap.Stringer("org_id", j.OrgID), zap.Int("attempt", attempt), zap.Int("status", status), zap.String("class", class),
		zap.String("error", detail), zap.Bool("final", final)}
	f.log.Debug("delivery attempt failed", fields...)
	f.mu.Lock()
	now := time.Now()
	if now.Sub(f.last) < failureWarnEvery {
		f.suppressed++
		f.mu.Unlock()
		return
	}
	since := f.suppressed
	f.last, f.suppressed = now, 0
	f.mu.Unlock()
	f.log.Warn("delivery attempt failed (further failures until the next such line are logged at debug level)",
		append(fields, zap.Int("failures_since_last_warning", since))...)
}
