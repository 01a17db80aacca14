package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/spf13/cobra"
)

// RunCLI runs a Caddy subcommand in process: the command that cobraFunc (a caddycmd.Command's
// CobraFunc, such as the wabarelay CLI's) builds, with args. It returns what the command printed,
// one JSON object a line as the wabarelay CLI prints it (a line that is not JSON fails the
// test), and the command's error. The command reads only its flags and the environment, so
// tests that pass everything as flags may run it in parallel.
func RunCLI(t testing.TB, cobraFunc func(*cobra.Command), args ...string) ([]map[string]any, error) {
	t.Helper()
	root := &cobra.Command{Use: "cli"}
	cobraFunc(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(args)
	root.SetContext(context.Background())
	err := root.Execute()
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if jerr := json.Unmarshal(l, &m); jerr != nil {
			t.Fatalf("CLI output line is not JSON: %q", l)
		}
		lines = append(lines, m)
	}
	return lines, err
}
