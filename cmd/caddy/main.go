// Command caddy is the wabarelay build of Caddy: the same program xcaddy
// generates for `xcaddy build --with github.com/wabarelay/wabarelay`, committed
// so that `go build ./cmd/caddy` works without xcaddy.
package main

import (
	_ "time/tzdata"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// plug in Caddy modules here
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/wabarelay/wabarelay"
)

func main() {
	caddycmd.Main()
}
