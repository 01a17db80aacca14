package benchkit

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Run is what every program sets up first: the Caddy build, the load average at start, an id
// for this run's names, and a temporary directory removed at the end.
type Run struct {
	CaddyBin string // absolute path
	LoadAvg  string
	ID       string // 8 hex digits
	Dir      string
}

// NewRun checks the Caddy build caddyBin and makes the run's temporary directory (named after
// dirPattern), registering its removal with cl.
func NewRun(cl *Cleanups, caddyBin, dirPattern string) (Run, error) {
	bin, err := CaddyBinary(caddyBin)
	if err != nil {
		return Run{}, err
	}
	r := Run{CaddyBin: bin, LoadAvg: LoadAvg(), ID: RandHex(4)}
	r.Dir, err = TempDir(cl, dirPattern)
	return r, err
}

// Pool opens a pool on dsn, closed by cl.
func Pool(ctx context.Context, dsn string, cl *Cleanups) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	cl.Add(pool.Close)
	return pool, nil
}

// Caddyfile returns a bench's Caddyfile: the global options — admin (empty: "admin off"), no
// persisted config, loopback only — then, when app is not empty, the wabarelay app with its
// database and encryption key from the environment (CaddyEnv) and app's lines (one option a
// line, indented by Caddyfile), and the sites.
func Caddyfile(admin, app, sites string) string {
	if admin == "" {
		admin = "admin off"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\t%s\n\tpersist_config off\n\tdefault_bind 127.0.0.1\n", admin)
	if app != "" {
		b.WriteString("\twabarelay {\n\t\tdatabase       {env.WBR_BENCH_DATABASE}\n\t\tencryption_key {env.WBR_BENCH_KEY}\n")
		for _, line := range strings.Split(strings.TrimRight(app, "\n"), "\n") {
			b.WriteString("\t\t" + line + "\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	b.WriteString(sites)
	return b.String()
}

// CaddyEnv returns the environment Caddyfile's placeholders read: the database dsn and the
// encryption key, then more.
func CaddyEnv(dsn string, key []byte, more ...string) []string {
	return append([]string{"WBR_BENCH_DATABASE=" + dsn, "WBR_BENCH_KEY=" + base64.StdEncoding.EncodeToString(key)}, more...)
}

// Errors counts a load's failures by message: the first ten distinct messages each, the rest
// together as "(other errors)". Safe for concurrent use.
type Errors struct {
	mu sync.Mutex
	m  map[string]int
}

// Add counts one failure with message msg.
func (e *Errors) Add(msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]int{}
	}
	if _, seen := e.m[msg]; seen || len(e.m) < 10 {
		e.m[msg]++
	} else {
		e.m["(other errors)"]++
	}
}

// Cut returns s cut to n bytes, with "…" when it was longer.
func Cut(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Summary returns "n × message" for every message counted, sorted, joined by "; ".
func (e *Errors) Summary() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var parts []string
	for k, n := range e.m {
		parts = append(parts, fmt.Sprintf("%d × %s", n, k))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}
