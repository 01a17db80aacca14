package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv/caddyproc"
)

// caddyArgsEnv carries Caddy's arguments to a test binary that MainCaddy runs as Caddy.
const caddyArgsEnv = "WABARELAY_TEST_CADDY_ARGS"

// selfCaddy is set by MainCaddy: this test binary can run as Caddy.
var selfCaddy bool

// built is the Caddy that CaddyBinary built for a test binary that cannot run as Caddy.
var built struct {
	once sync.Once
	dir  string
	bin  caddyproc.Binary
	err  error
}

// MainCaddy is Main for a package whose test binary holds the wabarelay Caddy modules: when
// StartCaddy (or RunCaddy) runs the test binary as Caddy, it calls caddyMain (caddycmd.Main)
// instead of the tests. Such a package's tests get a Caddy without a build:
//
//	func TestMain(m *testing.M) { testenv.MainCaddy(m, caddycmd.Main) }
//
// The functions after run after the tests, as Main's.
func MainCaddy(m *testing.M, caddyMain func(), after ...func()) {
	if args, ok := caddyproc.ChildArgs(caddyArgsEnv); ok {
		os.Args = append([]string{"caddy"}, args...)
		caddyMain()
		return
	}
	selfCaddy = true
	Main(m, after...)
}

// CaddyBinary returns how to run the wabarelay Caddy: this test binary when its TestMain is
// MainCaddy, otherwise ./cmd/caddy built once per test process (go build, into a temporary
// directory that Main removes).
func CaddyBinary(t testing.TB) caddyproc.Binary {
	t.Helper()
	if selfCaddy {
		return caddyproc.Binary{Path: os.Args[0], ArgsEnv: caddyArgsEnv}
	}
	built.once.Do(func() {
		root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			built.err = fmt.Errorf("finding the module root: %w", err)
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "wabarelay-caddy-"); built.err != nil {
			return
		}
		bin := filepath.Join(built.dir, "caddy")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
		cmd.Dir = strings.TrimSpace(string(root))
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
			return
		}
		built.bin = caddyproc.Binary{Path: bin}
	})
	if built.err != nil {
		t.Fatalf("testenv: %v", built.err)
	}
	return built.bin
}

// removeBuiltCaddy removes what CaddyBinary built (called by Main).
func removeBuiltCaddy() {
	if built.dir != "" {
		if err := os.RemoveAll(built.dir); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: removing the built Caddy: %v\n", err)
		}
	}
}

// Caddy is a wabarelay Caddy that StartCaddy started: a child process with its PID (for
// ProcMemory), its log and Stop/Kill.
type Caddy struct {
	*caddyproc.Child
	t   testing.TB
	dir string
	cfg string
	env []string
}

// StartCaddy runs `caddy run` on the Caddyfile cfg, with env added to its environment, and
// returns once every app has started (caddyproc.ReadyLine in its log); a Caddy that exits
// first fails the test with its log. The process is killed at the end of the test, and its log
// printed if the test failed.
func StartCaddy(t testing.TB, cfg string, env ...string) *Caddy {
	t.Helper()
	c := &Caddy{t: t, dir: t.TempDir(), cfg: cfg, env: env}
	c.start()
	return c
}

func (c *Caddy) start() {
	c.t.Helper()
	ch, err := caddyproc.StartCaddy(context.Background(), caddyproc.CaddyConfig{
		Bin: CaddyBinary(c.t), Dir: c.dir, Caddyfile: c.cfg, Env: c.env, Ready: Patience,
	})
	if err != nil {
		c.t.Fatalf("testenv: %v", err)
	}
	c.Child = ch
	c.t.Cleanup(func() {
		ch.Kill()
		if c.t.Failed() {
			c.t.Logf("caddy (%s) log:\n%s", c.dir, ch.Logs())
		}
	})
}

// Restart stops the process (SIGTERM) and starts a new one on the same Caddyfile, directory
// and environment; the log starts anew.
func (c *Caddy) Restart() {
	c.t.Helper()
	c.Stop()
	c.start()
}

// RunCaddy runs `caddy <args…> --config <Caddyfile> --adapter caddyfile` (validate, adapt) on
// cfg to its end and returns its combined output and whether it exited 0. The variables of the
// test's environment that start with one of dropPrefixes are left out; env is added.
func RunCaddy(t testing.TB, cfg string, env, dropPrefixes []string, args ...string) (string, bool) {
	t.Helper()
	out, err := caddyproc.RunCaddy(CaddyBinary(t), t.TempDir(), cfg, env, dropPrefixes, args...)
	if _, exit := err.(*exec.ExitError); err != nil && !exit {
		t.Fatalf("testenv: running caddy: %v", err)
	}
	return out, err == nil
}

// Patience is how long the kit waits for what takes milliseconds on an idle machine (a Caddy
// starting, a delivery arriving): a deadline for a failing test on a loaded 2-core machine,
// never a timing a test asserts.
const Patience = 60 * time.Second
