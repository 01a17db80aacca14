package testenv

import (
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreePort returns a TCP port that nothing listens on, for a server the test starts next.
//
// The port comes from below the kernel's ephemeral range (net.ipv4.ip_local_port_range), from
// which the kernel takes the ports of sockets that did not ask for one — listeners on port 0,
// outgoing connections — and this process hands it out once. Between FreePort and the server's
// bind, then, neither a parallel test's listener nor a connection takes the port; only another
// process that picks ports at random the same way could (the kit's own servers then start
// again on another: launchOnFreePort).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return p
}

// lowestPort is the bottom of the range FreePort picks from; the top is the kernel's lowest
// ephemeral port.
const lowestPort = 10000

// handedPorts are the ports FreePort returned in this process.
var handedPorts struct {
	mu   sync.Mutex
	seen map[int]bool
}

func freePort() (int, error) {
	top := ephemeralLow()
	if top-lowestPort < 1000 {
		return kernelPort() // an unusual ephemeral range: take what the kernel gives
	}
	handedPorts.mu.Lock()
	defer handedPorts.mu.Unlock()
	if handedPorts.seen == nil {
		handedPorts.seen = map[int]bool{}
	}
	for range 1000 {
		p := lowestPort + mathrand.IntN(top-lowestPort)
		if handedPorts.seen[p] {
			continue
		}
		// every address, as a Caddy site listens
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		_ = l.Close() // only a probe: the port was free
		handedPorts.seen[p] = true
		return p, nil
	}
	return 0, errors.New("finding a free port: none free below the ephemeral range")
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range (Linux's default where
// it cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil {
				return low
			}
		}
	}
	return 32768
}

// kernelPort returns a port the kernel picked for a listener on 127.0.0.1, free a moment ago.
func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close() // only a probe: the port was free
	return port, nil
}
