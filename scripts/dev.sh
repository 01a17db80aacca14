#!/usr/bin/env bash
# Runs wabarelay locally: makes sure Postgres is up, creates the `wabarelay` database, migrates,
# creates a demo org and API key (once; kept in .dev/), prints the key and what to try, then
# starts Caddy with the repo's Caddyfile on http://localhost:8080.
#
# Without a Meta app (META_APP_ID unset) it runs the demo, which needs nothing from outside: it
# also starts the fake upstream (cmd/fakegraph, built to bin/fakegraph) on 127.0.0.1:8090 and
# points the service at it. The fake plays Meta's Embedded Signup on the connect page (each page
# load makes up a phone number), answers the relay's calls, sends incoming messages and status
# changes (sent, delivered, read; failed 131026 for a made-up +999 number) to the service's
# callback, and runs a webhook receiver on https://127.0.0.1:8091 that
# logs what it gets here. It is stopped when this script ends; its request log is
# .dev/fakegraph.log. With META_APP_ID, META_APP_SECRET, META_CONFIG_ID and META_VERIFY_TOKEN
# set, the service runs against the real upstream (WABARELAY_UPSTREAM, default
# https://graph.facebook.com/v26.0) and no fake is started.
set -euo pipefail
cd "$(dirname "$0")/.."

PGHOST_URL=${WABARELAY_PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
export WABARELAY_DATABASE_URL=${WABARELAY_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/wabarelay?sslmode=disable}
DEMO=
[ -n "${META_APP_ID:-}" ] || DEMO=1
FAKE_ADDR=127.0.0.1:8090
RECEIVER_ADDR=127.0.0.1:8091
if [ -n "$DEMO" ]; then
	export WABARELAY_UPSTREAM=http://$FAKE_ADDR/v26.0
else
	export WABARELAY_UPSTREAM=${WABARELAY_UPSTREAM:-https://graph.facebook.com/v26.0}
fi
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
if [ -n "$DEMO" ]; then
	echo "Building bin/fakegraph..." >&2
	go build -o bin/fakegraph ./cmd/fakegraph
fi
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

if [ -z "$DEMO" ]; then
	cat <<MSG

  wabarelay is starting on http://localhost:8080 (management API under /v1), against
  $WABARELAY_UPSTREAM with the Meta app $META_APP_ID
  demo org:     $DEMO_ORG_ID
  demo API key: $DEMO_API_KEY
  dashboard:    http://localhost:8080/dashboard/

  Try, in another terminal:
    curl -s -X POST http://localhost:8080/v1/channels \\
      -H 'x-api-key: $K' -H 'Content-Type: application/json' \\
      -d '{"name":"Support line"}'
    curl -s http://localhost:8080/v1/channels -H 'x-api-key: $DEMO_API_KEY'

MSG
	exec bin/caddy run --config Caddyfile --adapter caddyfile
fi

# 4. Demo: the fake upstream. Its app, made up for this run, is the service's Meta app; the
# Caddyfile reads the other settings below (see its comments).
rand() { head -c 18 /dev/urandom | base64 | tr '+/' '-_'; }
export META_APP_ID=demo-app META_CONFIG_ID=demo-config
export META_APP_SECRET META_VERIFY_TOKEN
META_APP_SECRET=$(rand)
META_VERIFY_TOKEN=$(rand)
export WABARELAY_SDK_URL=http://$FAKE_ADDR/sdk.js
export WABARELAY_CONNECT_ORIGIN_SUFFIX=localhost
export WABARELAY_ALLOW_PRIVATE_TARGETS=true
export WABARELAY_DELIVERY_ROOT_CA=$PWD/.dev/demo-receiver-ca.pem
# the dashboard's demo page: the fake's incoming-message button and its webhook receiver (its
# "Send 10 demo messages" button calls the relay at the Caddyfile's proxy_url)
export WABARELAY_DEMO_FAKE_UPSTREAM=http://$FAKE_ADDR WABARELAY_DEMO_RECEIVER=https://$RECEIVER_ADDR

pids=()
stop() {
	trap - EXIT INT TERM
	[ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -f .dev/fakegraph.url .dev/fakegraph.log "$WABARELAY_DELIVERY_ROOT_CA"
bin/fakegraph -addr "$FAKE_ADDR" -app-id "$META_APP_ID" -app-secret "$META_APP_SECRET" \
	-callback http://localhost:8080/webhooks/upstream \
	-receiver "$RECEIVER_ADDR" -receiver-ca "$WABARELAY_DELIVERY_ROOT_CA" \
	-log .dev/fakegraph.log >.dev/fakegraph.url &
pids+=($!)
for _ in $(seq 1 100); do
	[ -s .dev/fakegraph.url ] && break
	if ! kill -0 "${pids[0]}" 2>/dev/null; then
		echo "The fake upstream did not start (is $FAKE_ADDR or $RECEIVER_ADDR in use?)" >&2
		exit 1
	fi
	sleep 0.1
done

K=$DEMO_API_KEY
cat <<MSG

  wabarelay DEMO on http://localhost:8080, against the fake upstream on http://$FAKE_ADDR
  (no META_APP_ID set: nothing leaves this machine; set META_APP_ID, META_APP_SECRET,
  META_CONFIG_ID and META_VERIFY_TOKEN to run against the real upstream)
  demo org:     $DEMO_ORG_ID
  demo API key: $K
  dashboard:    http://localhost:8080/dashboard/

  In another terminal:

  1. Create a channel (or in the dashboard):
       curl -s -X POST http://localhost:8080/v1/channels -H 'x-api-key: $K' \\
         -H 'Content-Type: application/json' -d '{"name":"Support line"}'
     and keep its token:  CHANNEL_TOKEN=<its channel_token>

  2. Connect a number: open its connect_url in a browser and click "Connect WhatsApp"; a demo
     signup (made up by the fake upstream, not Meta's) connects a number such as +1 555 0101.
     Without a browser, the same in one line:
       curl -s -X POST http://$FAKE_ADDR/_fake/signup | curl -s -X POST \\
         http://localhost:8080/connect/\$CHANNEL_TOKEN -H 'Content-Type: application/json' -d @-
     The channel is now active; its number:  PHONE_NUMBER_ID=<its phone_number_id>
     (also in: curl -s http://localhost:8080/v1/channels -H 'x-api-key: $K')

  3. Have its events delivered to the demo receiver: on the dashboard's Demo page
     (http://localhost:8080/dashboard/demo) click "Create the demo webhook", or:
       curl -s -X POST http://localhost:8080/v1/webhooks -H 'x-api-key: $K' \\
         -H 'Content-Type: application/json' -d '{"name":"Demo receiver",
         "url":"https://$RECEIVER_ADDR/$DEMO_ORG_ID","events":["messages","message_status","channel_health"]}'
     The receiver logs each delivery in this terminal; the Demo page lists them and checks
     each signature with the webhook's secret.

  4. Send a message through the relay (its "sent", "delivered" and "read" statuses follow, a
     second apart; a "to" starting with 999 is a made-up number: "failed", error 131026):
       curl -s http://localhost:8080/upstream-proxy/\$PHONE_NUMBER_ID/messages \\
         -H "Authorization: Bearer \$CHANNEL_TOKEN" -H 'Content-Type: application/json' \\
         -d '{"messaging_product":"whatsapp","to":"16505551234","type":"text","text":{"body":"Hello from wabarelay"}}'

     Or, on the Demo page, click "Send 10 demo messages": ten sends through the relay with the
     channel's token, one of them to +999 555 0100; each wamid links to its timeline.

  5. A customer writes to the number last connected (the Demo page's "Send an incoming
     message" button, or: "phone_number_id" picks another number, "type":"image" a picture):
       curl -s http://$FAKE_ADDR/_fake/inbound -d '{"text":"Hello"}'
     It shows up on the Demo page, signature verified; the receiver's last 50 deliveries:
       curl -s --cacert $WABARELAY_DELIVERY_ROOT_CA https://$RECEIVER_ADDR/

  6. A number's health: the Demo page's "Lower this number's quality" (or the line below) has
     the fake lower the number's quality to YELLOW and post phone_number_quality_update; the
     service reads the number's health 30 s later, and the Channels page shows the badge
     ("field" may also be phone_number_name_update, account_update, business_capability_update):
       curl -s http://$FAKE_ADDR/_fake/account_webhook -d '{"event":"FLAGGED"}'

  7. A closed window: the Demo page's "Show a closed window" (or the line below) has a customer
     whose last message is 25 hours old write in; a text sent to them afterwards (as in 4, to
     16505550125) shows the window closed on its message page and in
     GET /v1/channels/{id}/contacts/16505550125:
       curl -s http://$FAKE_ADDR/_fake/inbound -d '{"from":"16505550125","text":"Hi","age":"25h"}'

  8. A broadcast: the Demo page's "Send a demo broadcast" sends the hello_world template to ten
     made-up customers at 60 a minute; the fake answers one of them 130429 once (retried, then
     accepted) and another 131047 (failed); its page shows the progress, the counts moving with
     the statuses, the retried and the failed recipient. Through the API (docs/broadcasts.md):
       curl -s http://localhost:8080/v1/channels/\$CHANNEL_ID/broadcasts -H 'x-api-key: $K' \\
         -H 'Content-Type: application/json' -d '{"name":"Hello","template":{"name":"hello_world",
         "language":{"code":"en_US"}},"recipients":[{"to":"16505551234"},{"to":"16505551235"}]}'
     The fake can be told to refuse a recipient's next sends with upstream errors:
       curl -s http://$FAKE_ADDR/_fake/script -d '{"to":"16505551235","errors":[131056]}'

  The fake upstream keeps its numbers in memory only: after a restart of \`make run\`, channels
  connected before it are unknown upstream (their tokens are refused, so the relay answers 503
  CHANNEL_DISCONNECTED); create new channels.

MSG
bin/caddy run --config Caddyfile --adapter caddyfile &
pids+=($!)
wait "${pids[1]}"
