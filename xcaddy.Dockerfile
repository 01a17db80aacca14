# Builds Caddy with wabarelay using xcaddy, on the official Caddy images.
#   docker build -f xcaddy.Dockerfile -t wabarelay .
# Add more plugins (e.g. a DNS provider) with further --with lines.
FROM caddy:2.11-builder AS builder
COPY . /src
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    xcaddy build v2.11.9 --with github.com/wabarelay/wabarelay=/src

FROM caddy:2.11
COPY --from=builder /usr/bin/caddy /usr/bin/caddy
# /data keeps certificates and the instance id; mount it as a volume.
