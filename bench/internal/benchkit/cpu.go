package benchkit

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// The names SampleCPU gives the Postgres processes.
const (
	PGBackends = "postgres (bench db backends)"
	PGOther    = "postgres (other processes)"
)

// PostgresCPU returns the CPU time so far of this machine's Postgres processes, found by their
// process title: the backends of database db, and the rest (WAL writer, checkpointer, other
// databases' backends).
func PostgresCPU(db string) (backends, other time.Duration) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.HasPrefix(cmd, []byte("postgres")) && !bytes.Contains(cmd, []byte("/postgres\x00")) {
			continue
		}
		c, ok := ProcCPU(pid)
		if !ok {
			continue
		}
		if bytes.Contains(cmd, []byte(" "+db+" ")) {
			backends += c
		} else {
			other += c
		}
	}
	return backends, other
}

// SampleCPU returns the CPU time so far of the named processes and, under PGBackends and
// PGOther, of the Postgres processes (see PostgresCPU).
func SampleCPU(procs map[string]int, db string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pid := range procs {
		if d, ok := ProcCPU(pid); ok {
			out[name] = d
		}
	}
	out[PGBackends], out[PGOther] = PostgresCPU(db)
	return out
}

// DiffCPU returns after − before per name; a process that exited meanwhile counts 0, not less.
func DiffCPU(before, after map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, a := range after {
		out[name] = max(a-before[name], 0)
	}
	return out
}
