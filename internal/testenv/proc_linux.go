package testenv

import "syscall"

// childAttr runs a server process as cred (nil: as ourselves) and has the kernel send it sig
// when the test process dies, so that no server outlives a killed or timed-out test binary.
func childAttr(cred *syscall.Credential, sig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: sig}
}

// memoryDir is /dev/shm when it is a tmpfs with at least 2 GiB free: the throwaway Postgres
// servers keep their data there. On a disk, cloning the template database costs 200-500 ms of
// mostly kernel time per test (every relation is a file created, written and removed); in
// memory 10-15 ms. The servers run with fsync off and lose their data with the machine either
// way. "" when there is no such directory.
func memoryDir() string {
	const dir, minFree = "/dev/shm", 2 << 30
	var st syscall.Statfs_t
	const tmpfsMagic = 0x01021994
	if syscall.Statfs(dir, &st) != nil || st.Type != tmpfsMagic || uint64(st.Bavail)*uint64(st.Bsize) < minFree {
		return ""
	}
	if syscall.Access(dir, 0x2 /* W_OK */) != nil {
		return ""
	}
	return dir
}
