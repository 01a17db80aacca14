package testenv

import (
	"os"
	"strconv"
	"strings"
)

// ProcMemory returns a process's resident set (VmRSS) and its peak since the last
// [ResetPeakMemory] or its start (VmHWM), in bytes; ok is false without /proc.
func ProcMemory(pid int) (cur, peak int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			cur = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return cur, peak, true
}

// ResetPeakMemory starts a new peak (VmHWM) period for a process (/proc/<pid>/clear_refs 5).
func ResetPeakMemory(pid int) error {
	return os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0)
}
