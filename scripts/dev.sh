#!/usr/bin/env bash
# Runs wabarelay locally: makes sure Postgres is up, creates the `wabarelay` database, migrates,
# creates a demo org and API key (once; kept in .dev/), prints the key and a curl example, then
# starts Caddy with the repo's Caddyfile on http://localhost:8080.
set -euo pipefail
cd "$(dirname "$0")/.."

PGHOST_URL=${WABARELAY_PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
export WABARELAY_DATABASE_URL=${WABARELAY_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/wabarelay?sslmode=disable}
export WABARELAY_UPSTREAM=${WABARELAY_UPSTREAM:-https://graph.facebook.com/v26.0}
mkdir -p .dev

# 1. Postgres: install and start it if this machine has none running.
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
	if ! command -v pg_ctlcluster >/dev/null; then
		echo "Installing PostgreSQL (apt-get)..." >&2
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
	fi
	ver=$(ls /etc/postgresql | sort -V | tail -n1)
	pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
	# local trust auth for the demo, as on the project's dev machines
	for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
fi
psql "$PGHOST_URL" -tAc "SELECT 1 FROM pg_database WHERE datname = 'wabarelay'" | grep -q 1 ||
	psql "$PGHOST_URL" -qc "CREATE DATABASE wabarelay"

# 2. Encryption key, generated once for this checkout.
[ -s .dev/encryption.key ] || head -c 32 /dev/urandom | base64 > .dev/encryption.key
export WABARELAY_ENCRYPTION_KEY
WABARELAY_ENCRYPTION_KEY=$(cat .dev/encryption.key)

# 3. Build, migrate, demo org and key.
echo "Building bin/caddy..." >&2
go build -o bin/caddy ./cmd/caddy
bin/caddy wabarelay migrate >&2
if [ -s .dev/demo.env ]; then
	# shellcheck disable=SC1091
	. .dev/demo.env
	psql "$WABARELAY_DATABASE_URL" -tAc "SELECT 1 FROM orgs WHERE id = '$DEMO_ORG_ID'" | grep -q 1 || rm .dev/demo.env
fi
if [ ! -s .dev/demo.env ]; then
	org=$(bin/caddy wabarelay org create --name "Demo org")
	DEMO_ORG_ID=$(sed -E 's/.*"id":"([^"]+)".*/\1/' <<<"$org")
	key=$(bin/caddy wabarelay apikey create --org "$DEMO_ORG_ID" --name demo)
	DEMO_API_KEY=$(sed -E 's/.*"key":"([^"]+)".*/\1/' <<<"$key")
	printf 'DEMO_ORG_ID=%s\nDEMO_API_KEY=%s\n' "$DEMO_ORG_ID" "$DEMO_API_KEY" > .dev/demo.env
	chmod 600 .dev/demo.env
fi
# shellcheck disable=SC1091
. .dev/demo.env

cat <<MSG

  wabarelay is starting on http://localhost:8080 (management API under /v1)
  demo org:     $DEMO_ORG_ID
  demo API key: $DEMO_API_KEY

  Try, in another terminal:
    curl -s -X POST http://localhost:8080/v1/channels \\
      -H 'x-api-key: $DEMO_API_KEY' -H 'Content-Type: application/json' \\
      -d '{"name":"Support line"}'
    curl -s http://localhost:8080/v1/channels -H 'x-api-key: $DEMO_API_KEY'

MSG
exec bin/caddy run --config Caddyfile --adapter caddyfile
