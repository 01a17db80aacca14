package testenv

import "syscall"

// childAttr runs a server process as cred (nil: as ourselves) and has the kernel send it sig
// when the test process dies, so that no server outlives a killed or timed-out test binary.
func childAttr(cred *syscall.Credential, sig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: sig}
}
