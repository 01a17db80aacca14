// Package benchkit holds what the benchmark programs share: child processes (Caddy, Redis, the
// program itself re-run as a helper), throwaway databases and their data, HTTP clients, CPU
// accounting from /proc, logging, signals and clean-up.
package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv/caddyproc"
)

// Child is a process the bench started: killed with us (Pdeathsig), in its own process group so
// that Ctrl-C reaches only the bench, which stops it in order. Tests start theirs the same way
// (internal/testenv/caddyproc).
type Child = caddyproc.Child

// Cleanups run in reverse order at the end of run, whatever happened.
type Cleanups []func()

// Add registers f to run at the end, before the cleanups added earlier.
func (c *Cleanups) Add(f func()) { *c = append(*c, f) }

// Run runs the cleanups, the last added first.
func (c *Cleanups) Run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// RunAfter runs the cleanups, saying so first when ctx was cancelled (Ctrl-C).
func (c *Cleanups) RunAfter(ctx context.Context) {
	if ctx.Err() != nil {
		Logf("interrupted: cleaning up")
	}
	c.Run()
}

// SignalContext returns a context cancelled by the first SIGINT or SIGTERM; a second one kills
// the bench at once (its children still die with it: Pdeathsig).
func SignalContext() context.Context {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx
}

// Exit ends the bench after run returned err: nothing on success, "bench: interrupted" when a
// signal cancelled ctx, else "bench: <err>"; exit status 1.
func Exit(ctx context.Context, err error) {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = errors.New("interrupted")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// Fatalf prints "bench: <message>" and exits with status 2 (bad flags, or a bench that failed
// before it could report).
func Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}

// Logf prints a progress line to stderr, prefixed with the time of day.
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// FreePort returns a loopback TCP port that was free a moment ago (it panics when none is).
func FreePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close() // only its port was wanted
	return port
}

// RandHex returns n random bytes, hex-encoded (2n characters).
func RandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewKey returns a random encryption key for the wabarelay app (32 bytes).
func NewKey() []byte {
	key := make([]byte, 32)
	rand.Read(key)
	return key
}

// TempDir creates a temporary directory named after pattern and registers its removal with cl.
func TempDir(cl *Cleanups, pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	cl.Add(func() {
		if err := os.RemoveAll(dir); err != nil {
			Logf("remove %s: %v", dir, err)
		}
	})
	return dir, nil
}

// CaddyBinary returns the absolute path of the Caddy build at path, or an error that says how
// to build it.
func CaddyBinary(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("%s not found: build it with `go build -o bin/caddy ./cmd/caddy` (or pass -caddy)", path)
	}
	return abs, nil
}

// StartCaddy runs the Caddy build bin on the Caddyfile cfg in dir, with env added to its
// environment, and returns once it has started every app (as tests start theirs:
// caddyproc.StartCaddy) and listens on port.
func StartCaddy(ctx context.Context, bin, dir, cfg string, env []string, port int) (*Child, error) {
	ch, err := caddyproc.StartCaddy(ctx, caddyproc.CaddyConfig{
		Bin: caddyproc.Binary{Path: bin}, Dir: dir, Caddyfile: cfg, Env: env,
	})
	if err != nil {
		return nil, err
	}
	if err := WaitPort(ctx, fmt.Sprintf("127.0.0.1:%d", port), 30*time.Second, ch); err != nil {
		ch.Stop()
		return nil, fmt.Errorf("%w\n%s", err, ch.Logs())
	}
	Logf("caddy (%s) on 127.0.0.1:%d", filepath.Base(dir), port)
	return ch, nil
}

// StartChild starts bin with args and env added to the environment, its output to logPath.
func StartChild(name, logPath string, env []string, bin string, args ...string) (*Child, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	return caddyproc.Start(name, logPath, cmd)
}

// StartSelf runs this program again as a helper process (a fake upstream, a receiver), told
// what to be by env or args; its output goes to logPath.
func StartSelf(name, logPath string, env []string, args ...string) (*Child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return StartChild(name, logPath, env, self, args...)
}

// WaitPort returns once addr accepts TCP connections, or an error when limit passes, ctx ends
// or the child ch (if not nil) exits first.
func WaitPort(ctx context.Context, addr string, limit time.Duration, ch *Child) error {
	deadline := time.Now().Add(limit)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close() // a probe: that it connected is the answer
			return nil
		}
		if ch != nil && ch.Exited() {
			return errors.New("exited")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening after %s", addr, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LoadAvg returns the 1, 5 and 15 minute load averages, or "?".
func LoadAvg() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			return strings.Join(f[:3], " ")
		}
	}
	return "?"
}

// Machine describes this machine for a report's header, with the load average taken at start.
func Machine(loadAvg string) string {
	return fmt.Sprintf("%s/%s, %d CPUs, load average %s at start, %s",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAvg, runtime.Version())
}
