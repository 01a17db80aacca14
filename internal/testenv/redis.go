package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis returns a redis:// URL for this test. If WABARELAY_TEST_REDIS_URL is set it is returned
// as is (tests use random, per-test keys, so sharing the server is safe); otherwise a throwaway
// redis-server is started for this test (it starts in milliseconds) and stopped in t.Cleanup.
func Redis(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(envRedisURL); u != "" {
		return u
	}
	return StartRedis(t).URL()
}

// RedisClient returns a go-redis client of url (a redis:// URL such as Redis returns), closed
// at the end of the test; tune, when given, changes its options first (ShortTimeouts, say).
func RedisClient(t testing.TB, url string, tune ...func(*redis.Options)) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	for _, f := range tune {
		f(opt)
	}
	c := redis.NewClient(opt)
	// An error means the test closed it already, or a connection failed to close: nothing is
	// left to release either way.
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ShortTimeouts is a RedisClient option for tests that stop their server: dials, reads and
// writes time out after 500 ms, so that a dead server shows promptly.
func ShortTimeouts(o *redis.Options) {
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
}

// RedisServer is a throwaway redis-server owned by one test, for fault tests. It keeps no data on
// disk: a restarted server is empty.
type RedisServer struct {
	bin  string
	port int
	// clusterDir, when set, makes the server a Redis Cluster node keeping its node
	// configuration in this directory.
	clusterDir string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *lockedBuffer
}

// StartRedis starts a redis-server on a free port of 127.0.0.1 and waits until it answers. It is
// killed in t.Cleanup.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	s := &RedisServer{bin: redisBinary(t, "redis-server")}
	t.Cleanup(func() { s.kill() })
	s.mu.Lock()
	defer s.mu.Unlock()
	err := launchOnFreePort(&s.port, s.launch)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return s
}

// redisBinary finds a Redis program (redis-server, redis-cli) on PATH or in /usr/bin.
func redisBinary(t testing.TB, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err == nil {
		return bin
	}
	if isExecutable("/usr/bin/" + name) {
		return "/usr/bin/" + name
	}
	t.Fatalf("testenv: %s was not found on PATH nor in /usr/bin; install it with: "+
		"apt-get install -y redis-server (or set %s)", name, envRedisURL)
	return ""
}

// URL returns redis://127.0.0.1:<port>/0.
func (s *RedisServer) URL() string { return "redis://" + s.Addr() + "/0" }

// Addr returns 127.0.0.1:<port>.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Kill kills the server with SIGKILL and waits for it to exit.
func (s *RedisServer) Kill(t testing.TB) {
	t.Helper()
	s.kill()
}

// Restart starts the server again on the same port, with no data, and waits until it answers.
func (s *RedisServer) Restart(t testing.TB) {
	t.Helper()
	s.kill()
	s.mu.Lock()
	defer s.mu.Unlock()
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

func (s *RedisServer) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill() // fails only if it has exited already, which <-s.exited sees as well
	<-s.exited
	s.cmd, s.exited = nil, nil
}

// launch starts redis-server on s.port and waits until it answers; to be sure it is ours and not
// another server that took the port, it compares the process id the server reports. It returns
// an error wrapping errPortInUse if the port was taken. s.mu must be held.
func (s *RedisServer) launch() error {
	out := &lockedBuffer{}
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no"}
	if s.clusterDir != "" {
		args = append(args, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
			"--cluster-require-full-coverage", "no",
			"--cluster-config-file", filepath.Join(s.clusterDir, "nodes-"+strconv.Itoa(s.port)+".conf"))
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = os.TempDir()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = childAttr(nil, syscall.SIGKILL)
	if err := startChild(cmd); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan struct{})
	// Wait's error is how redis-server exited, which cmd.ProcessState keeps.
	go func() { _ = cmd.Wait(); close(exited) }()

	client := redis.NewClient(&redis.Options{
		Addr: s.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1, PoolSize: 1,
	})
	defer func() { _ = client.Close() }() // a probe's connection: nothing is left to release
	want := "process_id:" + strconv.Itoa(cmd.Process.Pid)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			if strings.Contains(out.String(), "Address already in use") {
				return fmt.Errorf("redis-server on port %d: %w", s.port, errPortInUse)
			}
			return fmt.Errorf("redis-server exited at start (%v); its output:\n%s", cmd.ProcessState, out)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := client.Info(ctx, "server").Result()
		cancel()
		if err == nil && strings.Contains(info, want+"\r\n") {
			s.cmd, s.exited, s.out = cmd, exited, out
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill() // fails only if it has exited already, which <-exited sees as well
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer within 30 s (%v); its output:\n%s", s.port, err, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lockedBuffer collects a child's output, keeping the first 64 KiB.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := 64<<10 - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
