package testenv

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CommandStat is one command's line of Redis' INFO commandstats: how often it ran and the
// microseconds the server spent in it (a script's time includes the commands it calls).
type CommandStat struct {
	Calls, Usec int64
}

// UsecPerCall is Usec / Calls (0 when the command never ran).
func (s CommandStat) UsecPerCall() float64 {
	if s.Calls == 0 {
		return 0
	}
	return float64(s.Usec) / float64(s.Calls)
}

// CommandStats returns INFO commandstats of c's server by lower-case command name ("evalsha").
// Benchmarks use it to report Redis' own time per operation; they should run on a server of
// their own (StartRedis), whose statistics no other test moves, and reset them first
// (CONFIG RESETSTAT).
func CommandStats(t testing.TB, c *redis.Client) map[string]CommandStat {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("testenv: INFO commandstats: %v", err)
	}
	stats := map[string]CommandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var s CommandStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				s.Calls = n
			case "usec":
				s.Usec = n
			}
		}
		stats[name] = s
	}
	return stats
}
