# wabarelay — build, run and test.
GO ?= go
BIN ?= bin/caddy

.PHONY: build run test bench vet fmt clean

build: ## Build the Caddy binary with every wabarelay module
	$(GO) build -trimpath -o $(BIN) ./cmd/caddy

run: ## Run locally against the local Postgres, with a demo org and API key
	bash scripts/dev.sh

test: ## Run every test (starts throwaway Postgres/Redis unless WABARELAY_TEST_* are set)
	$(GO) test -race -count=1 -timeout 15m ./...

bench: build ## Go micro-benchmarks, then the relay and events benchmark programs (local Postgres)
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./bench/relay
	$(GO) run ./bench/events

vet:
	$(GO) vet ./...
	test -z "$$(gofmt -l .)"

clean:
	rm -rf bin
