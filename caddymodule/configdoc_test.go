package caddymodule

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// configStructs are the structs whose fields are configuration options (the global option, its
// blocks and the handler directives).
var configStructs = map[string]bool{
	"App": true, "MetaConfig": true, "DeliveryConfig": true, "LimitsConfig": true, "RateLimitConfig": true,
	"RedisConfig": true, "RelayLogConfig": true, "BroadcastsConfig": true, "RelayHandler": true, "ConnectHandler": true, "DashboardHandler": true, "DashboardDemo": true,
}

// caddyfileName is the Caddyfile option of a field whose JSON name differs from it.
var caddyfileName = map[string]string{
	"RelayHandler.requests": "rate_limit", // wabarelay_proxy { rate_limit <requests> [<window>] }
	"RelayHandler.window":   "rate_limit",
	"RelayLogConfig.off":    "relay_log", // relay_log off
}

// defaultRe finds a field godoc's default: "Default: <value>" or "Default (unset): <value>",
// the value ending at the first sentence end, parenthesis or comma.
var defaultRe = regexp.MustCompile(`Default(?: \(unset\))?: (.+?)(?:\.\s|\.$|\s\(|,|$)`)

// TestConfigDefaultsDocumented: each config default is stated once, in its field's godoc
// ("Default: X"), and docs/configuration.md states the same value in the row of the same option
// (a table row with a cell that starts with the option's name).
func TestConfigDefaultsDocumented(t *testing.T) {
	// The package's non-test files, each parsed with its comments.
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == "caddymodule" {
			files = append(files, f)
		}
	}
	raw, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{} // option → the table rows naming it, normalised
	cellRe := regexp.MustCompile("^`([a-z_]+)")
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		for _, cell := range strings.Split(line, "|") {
			if m := cellRe.FindStringSubmatch(strings.TrimSpace(cell)); m != nil {
				rows[m[1]] = append(rows[m[1]], normalise(line))
			}
		}
	}
	checked := 0
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !configStructs[ts.Name.Name] {
				return true
			}
			for _, field := range ts.Type.(*ast.StructType).Fields.List {
				if field.Tag == nil || field.Doc == nil || len(field.Names) == 0 {
					continue
				}
				tag, _ := strconv.Unquote(field.Tag.Value)
				jsonName, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
				doc := strings.Join(strings.Fields(field.Doc.Text()), " ")
				m := defaultRe.FindStringSubmatch(doc)
				if m == nil || jsonName == "" {
					continue
				}
				option := jsonName
				if name, ok := caddyfileName[ts.Name.Name+"."+jsonName]; ok {
					option = name
				}
				want := normalise(m[1])
				found := false
				for _, row := range rows[option] {
					found = found || strings.Contains(row, want)
				}
				checked++
				if !found {
					t.Errorf("%s.%s: godoc default %q; docs/configuration.md's row for `%s` does not state it (rows: %q)",
						ts.Name.Name, field.Names[0].Name, m[1], option, rows[option])
				}
			}
			return false
		})
	}
	if checked < 15 {
		t.Fatalf("only %d defaults found in the godoc: the parsing is broken", checked)
	}
}

// normalise makes a godoc value and a table row comparable: lower case, no backticks, "false"
// written as the docs write a switch's default ("off"), "N per W" as the Caddyfile writes it.
func normalise(s string) string {
	s = strings.ToLower(strings.ReplaceAll(s, "`", ""))
	s = strings.ReplaceAll(s, " per ", " ")
	if s == "false" {
		s = "off"
	}
	return s
}
