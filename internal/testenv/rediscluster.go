package testenv

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a throwaway Redis Cluster of masters only (no replicas), for tests of
// clustering and of a master's loss. Its nodes keep no data on disk and run with
// cluster-require-full-coverage no: when a master dies, the others go on serving their slots
// (with Redis' default, yes, the whole cluster refuses queries once the node timeout of 2 s has
// passed).
type RedisCluster struct {
	nodes []*RedisServer
}

// StartRedisCluster starts masters redis-server cluster nodes on free ports of 127.0.0.1, joins
// them with `redis-cli --cluster create` (the slots split evenly), and waits until every node
// reports cluster_state:ok. The nodes are killed in t.Cleanup.
func StartRedisCluster(t testing.TB, masters int) *RedisCluster {
	t.Helper()
	bin, cli := redisBinary(t, "redis-server"), redisBinary(t, "redis-cli")
	dir := t.TempDir()
	c := &RedisCluster{}
	for range masters {
		s := &RedisServer{bin: bin, clusterDir: dir}
		t.Cleanup(func() { s.kill() })
		s.mu.Lock()
		err := launchOnFreePort(&s.port, s.launch)
		s.mu.Unlock()
		if err != nil {
			t.Fatalf("testenv: cluster node: %v", err)
		}
		c.nodes = append(c.nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.nodes {
		client := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			info, err := client.ClusterInfo(ctx).Result()
			cancel()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if time.Now().After(deadline) {
				_ = client.Close() // a probe's connection: nothing is left to release
				t.Fatalf("testenv: cluster node %s not ready within 30 s: %v %s", n.Addr(), err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = client.Close() // a probe's connection: nothing is left to release
	}
	return c
}

// Addrs returns the nodes' host:port addresses.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a cluster client of the nodes, closed in t.Cleanup.
func (c *RedisCluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(),
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	// An error means the test closed it already, or a connection failed to close: nothing is
	// left to release either way.
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// MasterOf returns the index of the node that serves key's slot.
func (c *RedisCluster) MasterOf(t testing.TB, key string) int {
	t.Helper()
	client := c.Client(t)
	m, err := client.MasterForKey(context.Background(), key)
	if err != nil {
		t.Fatalf("testenv: master of %q: %v", key, err)
	}
	for i, n := range c.nodes {
		if m.Options().Addr == n.Addr() {
			return i
		}
	}
	t.Fatalf("testenv: master of %q is %s, not a node of this cluster", key, m.Options().Addr)
	return -1
}

// Kill kills node i with SIGKILL (its slots become unavailable: there are no replicas).
func (c *RedisCluster) Kill(t testing.TB, i int) {
	t.Helper()
	c.nodes[i].kill()
}
