//go:build !linux

package testenv

import "syscall"

// childAttr runs a server process as cred (nil: as ourselves). Outside Linux there is no
// parent-death signal: servers of a killed test binary are cleaned up by the next run.
func childAttr(cred *syscall.Credential, _ syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}

// memoryDir is "" outside Linux: the throwaway servers keep their data under the temporary
// directory.
func memoryDir() string { return "" }
