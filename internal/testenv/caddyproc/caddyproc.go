// Package caddyproc starts and stops the child processes of tests and benchmark programs: a
// wabarelay Caddy run from a Caddyfile, or any other server. It has no testing imports, so the
// benchmark programs (bench/internal/benchkit) and the tests (internal/testenv) start Caddy the
// same way.
//
// A child writes its output to a log file, is killed when its parent dies (Pdeathsig, forked
// from one long-lived thread, see Spawn) and stops with SIGTERM, then SIGKILL.
package caddyproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ReadyLine is what Caddy logs once every app has started (the HTTP listener opens before the
// wabarelay app has finished starting: ping, migrations).
const ReadyLine = `"msg":"serving initial configuration"`

// StopGrace is how long Stop waits after SIGTERM before it kills: the dispatcher waits for its
// attempts in flight, at most its timeout + 1 s.
const StopGrace = 15 * time.Second

// Child processes are started from one goroutine locked to its own OS thread, which never exits.
// On Linux the children are asked for a signal when their parent dies (Pdeathsig), and "parent"
// there means the thread that forked them: forking from an ordinary goroutine would let the
// child be killed whenever the Go runtime retires that thread.
var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// Spawn starts cmd from the long-lived spawner thread (see the package comment).
func Spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for req := range spawnCh {
				req.done <- req.cmd.Start()
			}
		}()
	})
	req := spawnReq{cmd: cmd, done: make(chan error, 1)}
	spawnCh <- req
	return <-req.done
}

// Binary is how to run Caddy: an executable built from ./cmd/caddy, or a test binary that runs
// Caddy when ArgsEnv is set in its environment (see internal/testenv.MainCaddy).
type Binary struct {
	Path string
	// ArgsEnv, when set, names the environment variable that carries Caddy's arguments (a JSON
	// array) instead of the command line.
	ArgsEnv string
}

// Command returns the command that runs Caddy with args, with env added to this process's
// environment.
func (b Binary) Command(env []string, args ...string) *exec.Cmd {
	return b.command(os.Environ(), env, args)
}

func (b Binary) command(base, env, args []string) *exec.Cmd {
	cmd := exec.Command(b.Path)
	if b.ArgsEnv == "" {
		cmd.Args = append(cmd.Args, args...)
	} else {
		j, _ := json.Marshal(args)
		env = append([]string{b.ArgsEnv + "=" + string(j)}, env...)
	}
	cmd.Env = append(base, env...)
	return cmd
}

// ChildArgs decodes the arguments that Binary.Command put in the environment variable
// ArgsEnv; ok is false when it is not set.
func ChildArgs(argsEnv string) (args []string, ok bool) {
	v := os.Getenv(argsEnv)
	if v == "" {
		return nil, false
	}
	if err := json.Unmarshal([]byte(v), &args); err != nil {
		args = strings.Fields(v)
	}
	return args, true
}

// Child is a process started by Start or StartCaddy.
type Child struct {
	Name string
	Cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited
	once sync.Once
}

// Start starts cmd (its Env set by the caller, or inherited) with its output to the file
// logPath, killed with us and in its own process group (so that Ctrl-C reaches only the parent,
// which stops its children in order).
func Start(name, logPath string, cmd *exec.Cmd) (*Child, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := Spawn(cmd); err != nil {
		_ = f.Close() // the error returned is what went wrong
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &Child{Name: name, Cmd: cmd, log: f, done: make(chan struct{})}
	// Wait's error is how the process exited, which cmd.ProcessState keeps.
	go func() { _ = cmd.Wait(); close(c.done) }()
	return c, nil
}

// CaddyConfig says how StartCaddy runs a Caddy.
type CaddyConfig struct {
	Bin       Binary
	Dir       string   // for the Caddyfile, the log (caddy.log) and Caddy's data; created
	Caddyfile string   // the configuration
	Env       []string // added to the environment
	// Ready is how long to wait for ReadyLine in the log (default 30 s).
	Ready time.Duration
}

// StartCaddy writes the Caddyfile into cfg.Dir, runs `caddy run` on it and returns once Caddy
// logged ReadyLine. A Caddy that exits first or does not get ready in time is stopped, and the
// error holds its log.
func StartCaddy(ctx context.Context, cfg CaddyConfig) (*Child, error) {
	path, err := writeCaddyfile(cfg.Dir, cfg.Caddyfile)
	if err != nil {
		return nil, err
	}
	cmd := cfg.Bin.Command(caddyEnv(cfg.Dir, cfg.Env), "run", "--config", path, "--adapter", "caddyfile")
	ch, err := Start("caddy "+filepath.Base(cfg.Dir), filepath.Join(cfg.Dir, "caddy.log"), cmd)
	if err != nil {
		return nil, err
	}
	limit := cfg.Ready
	if limit == 0 {
		limit = 30 * time.Second
	}
	if err := ch.WaitLog(ctx, ReadyLine, limit); err != nil {
		ch.Kill()
		return nil, fmt.Errorf("caddy: %w\n%s", err, ch.Logs())
	}
	return ch, nil
}

// RunCaddy runs `caddy <args…> --config <Caddyfile> --adapter caddyfile` to its end (validate,
// adapt) in dir and returns its combined output. The variables of this process's environment
// that start with one of dropPrefixes are left out; env is added.
func RunCaddy(bin Binary, dir, caddyfile string, env, dropPrefixes []string, args ...string) (string, error) {
	path, err := writeCaddyfile(dir, caddyfile)
	if err != nil {
		return "", err
	}
	var base []string
	for _, kv := range os.Environ() {
		if !hasAnyPrefix(kv, dropPrefixes) {
			base = append(base, kv)
		}
	}
	cmd := bin.command(base, caddyEnv(dir, env), append(args, "--config", path, "--adapter", "caddyfile"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func writeCaddyfile(dir, caddyfile string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("caddy directory: %w", err)
	}
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		return "", fmt.Errorf("writing the Caddyfile: %w", err)
	}
	return path, nil
}

// caddyEnv keeps Caddy's data and configuration (certificates, autosave) in dir.
func caddyEnv(dir string, env []string) []string {
	return append([]string{"XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "HOME=" + dir}, env...)
}

// WaitLog waits until the child's log holds s, the child exits, ctx ends or limit passes.
func (c *Child) WaitLog(ctx context.Context, s string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for !bytes.Contains(c.LogBytes(), []byte(s)) {
		if c.Exited() {
			return errors.New("exited")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s in the log after %s", s, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Exited reports whether the process has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// PID returns the process id.
func (c *Child) PID() int { return c.Cmd.Process.Pid }

// LogBytes returns what the process wrote so far.
func (c *Child) LogBytes() []byte {
	b, _ := os.ReadFile(c.log.Name())
	return b
}

// Logs returns what the process wrote so far.
func (c *Child) Logs() string { return string(c.LogBytes()) }

// Stop ends the process: SIGTERM, then SIGKILL after StopGrace. It returns once the process
// has exited; later calls do nothing.
func (c *Child) Stop() {
	c.once.Do(func() {
		// It fails only if the process has exited already (done is closed then) or cannot be
		// signalled, and then SIGKILL ends it after StopGrace.
		_ = c.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(StopGrace):
			_ = c.Cmd.Process.Kill() // fails only if it has exited meanwhile, which <-c.done sees as well
			<-c.done
		}
		// The process wrote its log through its own descriptor, and LogBytes reads it by name.
		_ = c.log.Close()
	})
}

// Kill ends the process with SIGKILL and waits for it; later calls (and Stop) do nothing.
func (c *Child) Kill() {
	c.once.Do(func() {
		_ = c.Cmd.Process.Kill() // fails only if it has exited already, which <-c.done sees as well
		<-c.done
		_ = c.log.Close() // as in Stop
	})
}
