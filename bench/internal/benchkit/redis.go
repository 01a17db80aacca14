package benchkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedis starts a throwaway redis-server (no persistence) on a free port, files in dir, and
// returns its URL.
func StartRedis(ctx context.Context, dir string) (string, *Child, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("redis-server not found (apt-get install redis-server) and no -redis given")
	}
	port := FreePort()
	ch, err := StartChild("redis-server", filepath.Join(dir, "redis.log"), nil, bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err != nil {
		return "", nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := WaitPort(ctx, addr, 10*time.Second, ch); err != nil {
		ch.Stop()
		return "", nil, fmt.Errorf("redis-server: %w\n%s", err, ch.Logs())
	}
	Logf("redis-server on %s", addr)
	return "redis://" + addr, ch, nil
}

// StartRedisCluster starts n redis-server cluster nodes (masters only) and joins them with
// redis-cli --cluster create; it returns their addresses once every node reports
// cluster_state:ok. The children are returned even on error, to be stopped.
func StartRedisCluster(ctx context.Context, dir string, n int) ([]string, []*Child, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, nil, errors.New("redis-server not found (apt-get install redis-server)")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, nil, errors.New("redis-cli not found (apt-get install redis-tools)")
	}
	var addrs []string
	var children []*Child
	for i := range n {
		port := FreePort()
		nodeDir := filepath.Join(dir, "redis-"+strconv.Itoa(i))
		if err := os.MkdirAll(nodeDir, 0o700); err != nil {
			return addrs, children, err
		}
		ch, err := StartChild("redis-server", filepath.Join(nodeDir, "redis.log"), nil, bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", nodeDir,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			return addrs, children, err
		}
		children = append(children, ch)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := WaitPort(ctx, addr, 10*time.Second, ch); err != nil {
			return addrs, children, fmt.Errorf("redis-server: %w\n%s", err, ch.Logs())
		}
		addrs = append(addrs, addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return addrs, children, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	for _, a := range addrs {
		node := redis.NewClient(&redis.Options{Addr: a})
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				_ = node.Close() // a probe client: its close changes nothing
				return addrs, children, fmt.Errorf("redis cluster node %s not ready: %v", a, err)
			}
		}
		_ = node.Close() // a probe client: its close changes nothing
	}
	Logf("redis cluster of %d masters on %s", n, strings.Join(addrs, " "))
	return addrs, children, nil
}

// RedisVersion returns the server's redis_version.
func RedisVersion(ctx context.Context, rdb *redis.Client) (string, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "?", nil
}

// RedisCommandStats renders Redis' INFO commandstats, summed over the servers, as a markdown table,
// busiest command first, followed by how many reads and writes of client connections the
// servers made (INFO stats total_reads_processed, total_writes_processed): scripts per read
// tell how many calls each of Redis' reads carried (the pipelining of concurrent calls).
func RedisCommandStats(ctx context.Context, nodes []*redis.Client) string {
	var reads, writes int64
	for _, rdb := range nodes {
		info, err := rdb.Info(ctx, "stats").Result()
		if err != nil {
			return ""
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "total_reads_processed":
				reads += n
			case "total_writes_processed":
				writes += n
			}
		}
	}
	byName := map[string]*commandRow{}
	for _, rdb := range nodes {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			return ""
		}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			name, isCmd := strings.CutPrefix(name, "cmdstat_")
			if !ok || !isCmd {
				continue
			}
			r := byName[name]
			if r == nil {
				r = &commandRow{name: name}
				byName[name] = r
			}
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					r.calls += n
				case "usec":
					r.usec += n
				}
			}
		}
	}
	var rows []commandRow
	for _, r := range byName {
		r.usecPerCall = float64(r.usec) / float64(max(r.calls, 1))
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b commandRow) int { return int(b.usec - a.usec) })
	var sb strings.Builder
	sb.WriteString("| command | calls | µs total | µs/call |\n|---|--:|--:|--:|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s | %d | %d | %.2f |\n", r.name, r.calls, r.usec, r.usecPerCall)
	}
	scripts := byName["evalsha"].callsOrZero() + byName["eval"].callsOrZero()
	fmt.Fprintf(&sb, "\nReads of client connections %d, writes %d (INFO stats): %.2f scripts per read.\n",
		reads, writes, float64(scripts)/float64(max(reads, 1)))
	return sb.String()
}

// commandRow is one command's line of RedisCommandStats.
type commandRow struct {
	name        string
	calls       int64
	usec        int64
	usecPerCall float64
}

// callsOrZero returns r's calls, 0 for a command that never ran (nil).
func (r *commandRow) callsOrZero() int64 {
	if r == nil {
		return 0
	}
	return r.calls
}

// DeleteKeys removes the keys matching pattern (SCAN, UNLINK), at most for 30 s.
func DeleteKeys(rdb *redis.Client, pattern string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cursor uint64
	n := 0
	for {
		keys, next, err := rdb.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			Logf("redis cleanup: %v", err)
			return
		}
		if len(keys) > 0 {
			rdb.Unlink(ctx, keys...)
			n += len(keys)
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	Logf("redis: %d idempotency records of this run deleted", n)
}
