package benchkit

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The names SampleCPU gives the Postgres processes.
const (
	PGBackends = "postgres (bench db backends)"
	PGOther    = "postgres (other processes)"
)

// clockTicks is USER_HZ, 100 on every Linux platform Go supports.
const clockTicks = 100

// ProcCPU returns the user + system CPU time of a process (/proc/<pid>/stat, in clock ticks).
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

// ThreadCPU returns the CPU time of a process to the nanosecond: the sum of its threads' run
// times in /proc/<pid>/task/*/schedstat (the clock ticks of ProcCPU are too coarse for phases
// of a few ms); ProcCPU when that is not readable. Threads that ended are not counted: Go
// keeps its threads.
func ThreadCPU(pid int) time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var sum time.Duration
	for _, t := range tasks {
		b, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		f := strings.Fields(string(b))
		if rerr != nil || len(f) == 0 {
			continue
		}
		ns, perr := strconv.ParseInt(f[0], 10, 64)
		if perr != nil {
			err = perr
			break
		}
		sum += time.Duration(ns)
	}
	if err != nil || len(tasks) == 0 {
		d, _ := ProcCPU(pid)
		return d
	}
	return sum
}

// Syscalls returns a process's read and write system calls so far (/proc/<pid>/io: syscr +
// syscw; 0 when not readable): a count that machine noise does not move.
func Syscalls(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && (k == "syscr" || k == "syscw") {
			c, _ := strconv.ParseInt(v, 10, 64)
			n += c
		}
	}
	return n
}

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

// Procs names the processes whose CPU time is accounted: several pids under one name add up
// (the masters of a Redis Cluster).
type Procs map[string][]int

// SampleCPU returns the CPU time so far of the named processes and, under PGBackends and
// PGOther, of the Postgres processes (see PostgresCPU).
func SampleCPU(procs Procs, db string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pids := range procs {
		for _, pid := range pids {
			if d, ok := ProcCPU(pid); ok {
				out[name] += d
			}
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
