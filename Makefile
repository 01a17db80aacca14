# wabarelay — build, run and test.
GO ?= go
BIN ?= bin/caddy

.PHONY: build run test fuzz bench bench-smoke vet lint fmt clean

build: ## Build the Caddy binary with every wabarelay module
	$(GO) build -trimpath -o $(BIN) ./cmd/caddy

run: ## Run locally against the local Postgres, with a demo org and API key
	bash scripts/dev.sh

# -parallel 4: the parallel tests (package e2e's) mostly wait on the Caddy processes they start;
# four at a time keep two cores busy, more add nothing.
# -p 4: four test binaries (and builds: -p counts both) at once, not GOMAXPROCS' two. Many of
# them wait (on Chromium, on the Caddy children, on Redis restarts); with two, the cores idled
# between them and the package runs went in near-alphabetical order, the last ones alone.
# -trimpath (in GOFLAGS, so that the tests' own `go build ./cmd/caddy` has it too): the build
# cache then holds for any checkout of the same code. A fresh clone otherwise recompiles and
# relinks every package of the module under -race: 128 s of 2 cores' wall time before the
# tests, against 52 s with -trimpath (`go test -race -count=1 -run XXX_NONE ./...` in a new
# clone, warm cache, 2026-11-30).
# -ldflags=-w: test binaries without DWARF (stack traces keep their files and lines): linking
# e2e's under -race takes 7.4-8.4 s of CPU instead of 11.6, and 43 are linked per run.
# The whole change, on a fresh clone with a warm cache (go test -json spans, 2026-11-30): 489 s
# before; 350 s with -trimpath and the volume tests apart; 315 s with Chromium's omnibox popups
# off (internal/browsertest); 278 s with -p 4 and -w.
#
VOLUME_TESTS = ^(TestMutatedRequests|TestBroadcastLargest|TestInboundHugeFields|TestInboundMutations|TestRelayTokenNeverLeaks|TestRelayMedia)$$
VOLUME_PKGS = ./e2e ./managementapi
test: ## Run every test (starts throwaway Postgres/Redis unless WABARELAY_TEST_* are set)
	export GOFLAGS='-trimpath -ldflags=-w'; \
	$(GO) test -count=1 -parallel 4 -timeout 15m -run '$(VOLUME_TESTS)' $(VOLUME_PKGS) & volume=$$!; \
	$(GO) test -race -count=1 -p 4 -parallel 4 -timeout 15m -skip '$(VOLUME_TESTS)' ./...; race=$$?; \
	wait $$volume; volume=$$?; \
	[ $$race -eq 0 ] && [ $$volume -eq 0 ]

FUZZTIME ?= 30s
fuzz: ## Run every fuzz target for FUZZTIME each (`make test` runs their seed corpora)
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$(dirname $$f) $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./$$(dirname $$f); \
		done; \
	done

bench: build ## Go micro-benchmarks, then the relay and events benchmark programs (local Postgres)
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./bench/relay
	$(GO) run ./bench/events

bench-smoke: build ## Short relay (wrk), events and media runs; fails if a ratio drops >10% below bench/smoke-baseline.json (< 2 min)
	$(GO) run ./bench/smoke -caddy $(BIN)

vet:
	$(GO) vet ./...
	test -z "$$(gofmt -l .)"

# golangci-lint is pinned, and built with this machine's Go: a binary built with an older Go
# refuses a module that needs a newer one. A fresh machine builds it once (a few minutes of CPU).
# -trimpath: the type-checking and analysis caches then hold for any checkout of the same code, not
# only for the folder that filled them (a fresh clone otherwise re-checks everything).
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT_BIN ?= $(shell $(GO) env GOPATH)/bin
GOLANGCI_LINT = $(GOLANGCI_LINT_BIN)/golangci-lint
lint: ## golangci-lint with .golangci.yml, tests included (installs the pinned version when missing)
	@case "$$($(GOLANGCI_LINT) version 2>/dev/null)" in \
	*"has version $(GOLANGCI_LINT_VERSION:v%=%) built with $$($(GO) env GOVERSION) "*) ;; \
	*) echo "installing golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOLANGCI_LINT_BIN)"; \
		GOBIN=$(GOLANGCI_LINT_BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION);; \
	esac
	GOFLAGS=-trimpath $(GOLANGCI_LINT) run ./...

clean:
	rm -rf bin
