# wabarelay — build, run and test.
GO ?= go
BIN ?= bin/caddy

.PHONY: build run test fuzz bench bench-smoke vet fmt clean

build: ## Build the Caddy binary with every wabarelay module
	$(GO) build -trimpath -o $(BIN) ./cmd/caddy

run: ## Run locally against the local Postgres, with a demo org and API key
	bash scripts/dev.sh

test: ## Run every test (starts throwaway Postgres/Redis unless WABARELAY_TEST_* are set)
	$(GO) test -race -count=1 -timeout 15m ./...

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

clean:
	rm -rf bin
