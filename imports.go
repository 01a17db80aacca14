// Package wabarelay registers every wabarelay Caddy module. Import it (or
// build with `xcaddy build --with github.com/wabarelay/wabarelay`) to get the
// wabarelay app, its HTTP handlers, Caddyfile directives and CLI commands.
package wabarelay

import (
	_ "github.com/wabarelay/wabarelay/caddymodule"
)
