// Package e2e holds the end-to-end tests of the wabarelay Caddy build. Each test runs Caddy as
// a child process — the test binary itself, with the modules of cmd/caddy (testenv.MainCaddy)
// — on a database of its own, against the fake upstream (internal/fakegraph), real HTTPS
// receivers, Postgres and Redis, and talks to it over HTTP as a caller, the upstream, a
// receiver and an operator would. The tests use only the exported API of the repository's
// packages; the Caddyfile adapt, provisioning and CLI tests, and the ones that load Caddy in
// process, are in caddymodule.
//
// The kit: newRelayEnv is a test world (a fake upstream with three numbers, a database and an
// org) whose caddy, caddyWith, caddySite, caddyFile and repoCaddy start Caddy processes on it
// (kit_test.go); call, apiCall, signedPost and runCLI are a client, the upstream and an
// operator (calls_kit_test.go); startDemo runs the repo's Caddyfile as `make run` runs the demo
// (demo_kit_test.go); broadcastCaddy runs the broadcast sender, and sendFront stands before the
// fake upstream recording each send's arrival, answer and instance (broadcast_kit_test.go).
//
// Every test owns its database, ports, fake upstream and Caddy processes, and runs in parallel
// with the others; go test runs at most -parallel of them at once (GOMAXPROCS by default):
//
//	go test -race ./e2e
//	go test -race ./e2e -run 'TestRelay' -parallel 4 -v
//	WABARELAY_SKIP_BROWSER=1 go test ./e2e
package e2e
