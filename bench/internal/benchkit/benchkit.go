// Package benchkit holds what the benchmark programs share: child processes (Caddy, Redis),
// throwaway databases, free ports, CPU accounting from /proc, logging and clean-up.
package benchkit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/testenv/caddyproc"
	"github.com/wabarelay/wabarelay/store"
)

// Child is a process the bench started: killed with us (Pdeathsig), in its own process group so
// that Ctrl-C reaches only the bench, which stops it in order. Tests start theirs the same way
// (internal/testenv/caddyproc).
type Child = caddyproc.Child

// Cleanups run in reverse order at the end of run, whatever happened.
type Cleanups []func()

func Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}

func FreePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ProcCPU returns the user + system CPU time of a process.
func ProcCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// Fields after the command (which may contain spaces) start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14: utime
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15: stime
	return time.Duration(ut+st) * time.Second / clockTicks, true
}

func RandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
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

func WaitPort(ctx context.Context, addr string, limit time.Duration, ch *Child) error {
	deadline := time.Now().Add(limit)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
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

// WithDatabase returns dsn naming database db instead.
func WithDatabase(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("-pg: invalid URL")
		}
		u.Path = "/" + db
		return u.String(), nil
	}
	return dsn + " dbname=" + db, nil // key=value form: the last dbname wins
}

func (c *Cleanups) Add(f func()) { *c = append(*c, f) }

func (c *Cleanups) Run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// clockTicks is USER_HZ, 100 on every Linux platform Go supports.
const clockTicks = 100

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

// LoadAvg returns the 1, 5 and 15 minute load averages, or "?".
func LoadAvg() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			return strings.Join(f[:3], " ")
		}
	}
	return "?"
}

// NewDatabase creates the database name on the server of adminDSN, migrates it, and registers
// its removal (DROP … WITH (FORCE)) with cl. It returns the database's DSN.
func NewDatabase(ctx context.Context, adminDSN, name string, cl *Cleanups) (string, error) {
	dsn, err := WithDatabase(adminDSN, name)
	if err != nil {
		return "", err
	}
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return "", fmt.Errorf("postgres admin connection (-pg): %w", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close(context.Background())
		return "", fmt.Errorf("create database: %w", err)
	}
	Logf("database %s created", name)
	cl.Add(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if _, err := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			Logf("drop database %s: %v", name, err)
		} else {
			Logf("database %s dropped", name)
		}
		admin.Close(dctx)
	})
	return dsn, store.MigrateDSN(ctx, dsn)
}
