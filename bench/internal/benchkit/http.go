package benchkit

import (
	"net"
	"net/http"
	"time"
)

// HTTPClient returns a client for load: no proxy, no compression, keep-alive with up to
// maxIdle idle connections (maxIdlePerHost per host); timeout 0 is none.
func HTTPClient(maxIdle, maxIdlePerHost int, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        maxIdle,
		MaxIdleConnsPerHost: maxIdlePerHost,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}
