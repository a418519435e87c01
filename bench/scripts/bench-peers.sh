#!/usr/bin/env bash
# bench-peers: install the peer systems (beanstalkd, redis-server from Debian;
# nats-server from the Go module proxy, since Debian bookworm's 2.9 has no
# sync_interval), build leaseq, and run `leaseq bench` against leaseq and
# every peer with matched durability. Results go to $OUT (results.json,
# results.md, chart.svg).
#
# Usage: bench/scripts/bench-peers.sh [--install-only | --test] [leaseq bench args...]
#   --install-only  install the peers and exit
#   --test          install, then run the short peer test (go test -tags peers)
#   anything else   passed to `leaseq bench` (e.g. e2e latency -duration 5s)
# Environment: OUT (default bench-results), NATS_SERVER_VERSION (default v2.12.15),
# LEASEQ_BIN (the leaseq binary to measure; default: go build).
set -euo pipefail

cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-results}
NATS_SERVER_VERSION=${NATS_SERVER_VERSION:-v2.12.15}
GOBIN_DIR=$(go env GOBIN)
[ -n "$GOBIN_DIR" ] || GOBIN_DIR="$(go env GOPATH)/bin"
export PATH="$PATH:$GOBIN_DIR"

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
		echo "bench-peers: need root (or sudo) to run: $*" >&2; return 1; fi
}

install_peers() {
	local missing=()
	command -v beanstalkd >/dev/null || missing+=(beanstalkd)
	command -v redis-server >/dev/null || missing+=(redis-server)
	if [ ${#missing[@]} -gt 0 ]; then
		echo "bench-peers: apt-get install ${missing[*]}" >&2
		as_root apt-get update -qq
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
	fi
	# nats-server >= 2.10 has jetstream sync_interval: always.
	local v=""
	if command -v nats-server >/dev/null; then
		v=$(nats-server --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
	fi
	if [ -z "$v" ] || [ "$(echo "$v" | awk '{print ($1 > 2 || ($1 == 2 && $2 >= 10))}')" != 1 ]; then
		echo "bench-peers: go install nats-server@$NATS_SERVER_VERSION" >&2
		(cd / && GOFLAGS= go install "github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION")
	fi
	echo "bench-peers: $(redis-server --version | cut -d' ' -f1-3); $(beanstalkd -v); $(nats-server --version)" >&2
}

mode=run
case "${1:-}" in
--install-only) mode=install; shift ;;
--test) mode=test; shift ;;
esac

install_peers
[ "$mode" = install ] && exit 0

if [ "$mode" = test ]; then
	exec go test -tags peers -count=1 -run 'TestPeers' ./bench/
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# LEASEQ_BIN (make bench-peers passes the static release build) or a
# plain build.
if [ -n "${LEASEQ_BIN:-}" ]; then
	cp "$LEASEQ_BIN" "$tmp/leaseq"
else
	go build -o "$tmp/leaseq" .
fi
if ! "$tmp/leaseq" bench -h >/dev/null 2>&1; then
	echo "bench-peers: this leaseq binary has no 'bench' command yet (main.go must call bench.Main)" >&2
	exit 1
fi
echo "bench-peers: $(nproc) CPUs, $(uname -sr), $(go version | cut -d' ' -f3); results in $OUT" >&2
"$tmp/leaseq" bench -leaseq-bin "$tmp/leaseq" -out "$OUT" "$@"
