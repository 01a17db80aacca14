package testenv

import (
	"errors"
	"os/exec"
	"runtime"
	"sync"
)

// Server processes are started from one goroutine locked to its own OS thread, which never
// exits. On Linux the children are asked for a signal when their parent dies (Pdeathsig), and
// "parent" there means the thread that forked them: forking from an ordinary goroutine would let
// the child be killed whenever the Go runtime retires that thread.
var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startChild starts cmd from the spawner thread.
func startChild(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for req := range spawnCh {
				req.done <- req.cmd.Start()
			}
		}()
	})
	req := spawnReq{cmd: cmd, done: make(chan error, 1)}
	spawnCh <- req
	return <-req.done
}

// launchOnFreePort picks a free port into *port and calls launch, retrying (up to 10 times)
// when another process took the port in between.
func launchOnFreePort(port *int, launch func() error) error {
	var err error
	for attempt := 0; ; attempt++ {
		if *port, err = freePort(); err != nil {
			return err
		}
		if err = launch(); !errors.Is(err, errPortInUse) || attempt >= 10 {
			return err
		}
	}
}

// StartChild starts cmd (for example a Caddy process under test, with a Pdeathsig in its
// SysProcAttr) from the same long-lived thread as the servers, so that its parent-death signal
// fires when the test process dies and not when the Go runtime retires the thread of whatever
// goroutine happened to start it.
func StartChild(cmd *exec.Cmd) error { return startChild(cmd) }
