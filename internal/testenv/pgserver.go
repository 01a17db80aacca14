package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const pgDirPrefix = "wabarelay-testenv-pg-"

// PGServer is a throwaway PostgreSQL server owned by one test, for fault tests that stop the
// server abruptly and start it again. Its data survives Stop and Start; commits are synchronous
// (only fsync is off), so a committed transaction survives Stop as it would survive a real crash
// of the server process.
type PGServer struct {
	dir      string // owned temporary directory: data/, log, the Unix socket
	port     int
	initdb   string
	postgres string
	cred     *syscall.Credential // non-nil when running as root: run as user postgres
	syncOff  bool                // synchronous_commit=off (the shared server only)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	tmpl   templateCache
}

// StartPostgres initialises a new PostgreSQL server in a temporary directory and starts it on a
// free port of 127.0.0.1. The server is stopped and its directory removed in t.Cleanup.
func StartPostgres(t testing.TB) *PGServer {
	t.Helper()
	s, err := newPGServer(false)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := s.destroy(); err != nil {
			t.Logf("testenv: %v", err)
		}
	})
	return s
}

// DSN returns the postgres:// URL of database db on this server, as the superuser postgres
// (trust authentication). Use "postgres" for the admin database.
func (s *PGServer) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Port returns the TCP port the server listens on (127.0.0.1 only).
func (s *PGServer) Port() int { return s.port }

// Stop kills the server as abruptly as PostgreSQL allows (an immediate shutdown, as
// pg_ctl stop -m immediate: no checkpoint, crash recovery on the next start) and waits for it
// to exit. Open connections fail.
func (s *PGServer) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts the server again on the same port and data directory after Stop, and waits until
// it accepts connections.
func (s *PGServer) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		t.Fatalf("testenv: postgres on port %d is already running", s.port)
	}
	// The port was ours until Stop; if someone took it since, wait a little for it.
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err = s.launch()
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// CreateDB creates a new, fully migrated database on this server (cloned from a template that is
// built on the first call) and returns its DSN. It is not dropped: it goes away with the server.
func (s *PGServer) CreateDB(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := s.DSN("postgres")
	conn, err := connect(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }() // closed even if Close returns an error
	name, err := createTestDB(admin, conn, &s.tmpl, false)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return s.DSN(name)
}

var errPortInUse = errors.New("port in use")

// newPGServer runs initdb in a new temporary directory and starts the server on a free port.
func newPGServer(syncOff bool) (*PGServer, error) {
	reapOnce.Do(reapStaleDirs)
	initdb, postgres, err := pgBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	dir, err := makeServerDir(cred)
	if err != nil {
		return nil, err
	}
	s := &PGServer{dir: dir, initdb: initdb, postgres: postgres, cred: cred, syncOff: syncOff}
	if err := s.runInitdb(); err != nil {
		_ = os.RemoveAll(dir) // what is left, reapStaleDirs removes once this process is gone
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err = launchOnFreePort(&s.port, s.launch)
	if err != nil {
		_ = os.RemoveAll(dir) // what is left, reapStaleDirs removes once this process is gone
		return nil, err
	}
	return s, nil
}

// pgBinaries finds initdb and postgres of one version: the newest under /usr/lib/postgresql
// (Debian and Ubuntu), else on PATH.
func pgBinaries() (initdb, postgres string, err error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "postgres")
		if isExecutable(i) && isExecutable(p) {
			return i, p, nil
		}
	}
	i, err1 := exec.LookPath("initdb")
	p, err2 := exec.LookPath("postgres")
	if err1 == nil && err2 == nil {
		return i, p, nil
	}
	return "", "", errors.New("the PostgreSQL server binaries initdb and postgres were found neither in " +
		"/usr/lib/postgresql/*/bin nor on PATH; install them with: apt-get install -y postgresql " +
		"(or set " + envDatabaseURL + " to the admin DSN of a running server)")
}

func pgVersion(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// postgresCredential returns nil unless we run as root; initdb and postgres refuse to run as
// root, so then they run as the user postgres.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but there is no user "+
			"postgres to run it as (%v); install PostgreSQL with: apt-get install -y postgresql", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user postgres has uid %q, gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// makeServerDir creates the server's directory, records our pid in it (for reapStaleDirs) and,
// when running as root, hands it to the user postgres. It goes in memory (memoryDir) when the
// machine has room there, else under the temporary directory. Its parents must be traversable
// by the user postgres, so under root a private TMPDIR is passed over for /tmp.
func makeServerDir(cred *syscall.Credential) (string, error) {
	base := memoryDir()
	if base == "" {
		base = os.TempDir()
	}
	if cred != nil && !traversableByOthers(base) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, pgDirPrefix)
	if err != nil {
		return "", fmt.Errorf("creating the postgres directory: %w", err)
	}
	// The Unix socket path (dir/.s.PGSQL.<port>) must fit in sun_path.
	if len(dir)+len("/.s.PGSQL.65535") > 107 {
		_ = os.RemoveAll(dir) // it holds nothing yet
		return "", fmt.Errorf("temporary directory %q is too long for a Unix socket path; set TMPDIR=/tmp", base)
	}
	err = os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err == nil && cred != nil {
		err = os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		_ = os.RemoveAll(dir) // best effort: the error returned is what went wrong
		return "", fmt.Errorf("preparing the postgres directory: %w", err)
	}
	return dir, nil
}

func traversableByOthers(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

func (s *PGServer) runInitdb() error {
	data := filepath.Join(s.dir, "data")
	var outs []string
	// C.UTF-8 is what the Debian server and the CI server use; fall back to the C locale where
	// the C library lacks it.
	for _, locale := range []string{"--locale=C.UTF-8", "--no-locale"} {
		cmd := exec.Command(s.initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", locale,
			"--no-sync", "--no-instructions")
		cmd.Dir = s.dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
		out, err := cmd.CombinedOutput()
		if err == nil {
			return nil
		}
		outs = append(outs, fmt.Sprintf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out))
		if err := os.RemoveAll(data); err != nil {
			outs = append(outs, fmt.Sprintf("removing %s for the next attempt: %v", data, err))
		}
	}
	return fmt.Errorf("initdb failed:\n%s", strings.Join(outs, "\n"))
}

// launch starts the postmaster as our child process and waits until it accepts connections on
// its private Unix socket (so that we never mistake another server on the same port for ours).
// It returns an error wrapping errPortInUse if the port was taken. s.mu must be held.
func (s *PGServer) launch() error {
	logPath := filepath.Join(s.dir, "log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// postgres writes the log through its own descriptor; ours is only for starting it.
	defer func() { _ = logf.Close() }()
	logStart, _ := logf.Seek(0, 2)
	syncCommit := "on"
	if s.syncOff {
		syncCommit = "off"
	}
	cmd := exec.Command(s.postgres, "-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit="+syncCommit,
		"-c", "full_page_writes=off", "-c", "max_connections=300")
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// If this test process dies, SIGQUIT makes the postmaster do an immediate shutdown.
	cmd.SysProcAttr = childAttr(s.cred, syscall.SIGQUIT)
	if err := startChild(cmd); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	exited := make(chan struct{})
	// Wait's error is how postgres exited, which cmd.ProcessState keeps.
	go func() { _ = cmd.Wait(); close(exited) }()

	socketDSN := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", s.dir, s.port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			log := readFrom(logPath, logStart)
			if strings.Contains(log, "Address already in use") || strings.Contains(log, "could not bind") {
				return fmt.Errorf("postgres on port %d: %w", s.port, errPortInUse)
			}
			return fmt.Errorf("postgres exited at start (%v); its log:\n%s", cmd.ProcessState, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := connect(ctx, socketDSN)
		cancel()
		if err == nil {
			_ = conn.Close(context.Background()) // only a probe; closed even if Close returns an error
			s.cmd, s.exited = cmd, exited
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill() // fails only if it has exited already, which <-exited sees as well
			<-exited
			return fmt.Errorf("postgres did not accept connections within a minute (%v); its log:\n%s",
				err, readFrom(logPath, logStart))
		}
		time.Sleep(15 * time.Millisecond)
	}
}

func (s *PGServer) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	cmd, exited := s.cmd, s.exited
	s.cmd, s.exited = nil, nil
	// SIGQUIT: immediate shutdown. It fails only if postgres has exited already (exited is
	// closed then) or cannot be signalled, which the timeout below reports.
	sigErr := cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill() // fails only if it has exited meanwhile, which <-exited sees as well
		<-exited
		if sigErr != nil {
			return fmt.Errorf("postgres on port %d: SIGQUIT: %w; killed after 30 s", s.port, sigErr)
		}
		return fmt.Errorf("postgres on port %d ignored SIGQUIT for 30 s and was killed", s.port)
	}
}

// destroy stops the server and removes its directory.
func (s *PGServer) destroy() error {
	err := s.stop()
	if rerr := os.RemoveAll(s.dir); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func readFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	b = b[offset:]
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

var reapOnce sync.Once

// reapStaleDirs removes the directories of throwaway servers whose test process is gone (killed
// before it could clean up), stopping any postmaster still running in them.
func reapStaleDirs() {
	bases := []string{os.TempDir()}
	if bases[0] != "/tmp" {
		bases = append(bases, "/tmp")
	}
	if m := memoryDir(); m != "" {
		bases = append(bases, m)
	}
	for _, base := range bases {
		dirs, _ := filepath.Glob(filepath.Join(base, pgDirPrefix+"*"))
		for _, dir := range dirs {
			b, err := os.ReadFile(filepath.Join(dir, "owner"))
			if err != nil {
				continue
			}
			owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || owner <= 0 || processAlive(owner) {
				continue
			}
			if b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
				first, _, _ := strings.Cut(string(b), "\n")
				if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && pid > 0 && isPostgres(pid) {
					// best effort, as all of the reaping
					_ = syscall.Kill(pid, syscall.SIGQUIT)
					for i := 0; i < 100 && processAlive(pid); i++ {
						time.Sleep(50 * time.Millisecond)
					}
				}
			}
			_ = os.RemoveAll(dir) // best effort: a later run tries again
		}
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), "postgres")
}
