package docs_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// linkRe finds Markdown links and images: [text](target) or ![alt](target "title").
var linkRe = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// markdownFiles are the repository's manual pages.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../README.md", "../bench/README.md"}
	more, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append(files, more...)
}

// TestRelativeLinksResolve: every relative link of the README, docs/ and bench/README.md names a
// file or folder of the repository (outside code spans and fenced blocks), and none leaves it.
func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range markdownFiles(t) {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		fenced := false
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			line = regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "")
			for _, m := range linkRe.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				abs := filepath.Join(filepath.Dir(f), target)
				if a, _ := filepath.Abs(abs); !strings.HasPrefix(a, root+string(filepath.Separator)) && a != root {
					t.Errorf("%s:%d: %s points outside the repository", f, n, m[1])
					continue
				}
				if _, err := os.Stat(abs); err != nil {
					t.Errorf("%s:%d: %s: no such file in the repository", f, n, m[1])
				}
				checked++
			}
		}
		if err := sc.Err(); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		_ = fh.Close() // read only: nothing was lost
	}
	if checked < 50 {
		t.Fatalf("only %d links checked: the scan is broken", checked)
	}
}

// TestNothingPointsOutside: no tracked file names the documents kept beside the repository
// (../shared): the repository must stand on its own.
func TestNothingPointsOutside(t *testing.T) {
	// The pattern is assembled so that this file does not match it.
	pattern := `\.\./` + "shared/|/work/" + "shared"
	out, err := exec.Command("git", "-C", "..", "grep", "-n", "-I", "-E", pattern).CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
			return // no match
		}
		t.Skipf("git grep unavailable: %v %s", err, out)
	}
	t.Fatalf("files point outside the repository:\n%s", out)
}
