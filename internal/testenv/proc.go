package testenv

import (
	"errors"
	"os/exec"

	"github.com/wabarelay/wabarelay/internal/testenv/caddyproc"
)

// startChild starts a server process from caddyproc's long-lived spawner thread, so that its
// parent-death signal (Pdeathsig) fires when the test process dies.
func startChild(cmd *exec.Cmd) error { return caddyproc.Spawn(cmd) }

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
