#!/usr/bin/env bash
# build-rocksdb: build a release (NDEBUG, -O2) static RocksDB from Debian's
# own source package of the librocksdb-dev that is installed, into a cache
# directory outside the checkout that later builds reuse. Prints the
# directory (holding lib/librocksdb.a and include/) on stdout as its last
# line.
#
# Why: Debian's librocksdb is an assertion build (CMake build type "None"):
# thousands of assert call sites and software CRC32C. docs/BENCHMARKS.md
# has the measured difference.
#
# Environment: ROCKSDB_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/leaseq),
# JOBS (default nproc).
set -euo pipefail

CACHE=${ROCKSDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaseq}
JOBS=${JOBS:-$(nproc)}

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
		echo "build-rocksdb: need root (or sudo) to run: $*" >&2; return 1; fi
}

# The version of Debian's library: the release build must match the headers
# storage/rocksstore's binding (rdb.cc) compiles against.
if ! ver=$(dpkg-query -W -f='${Version}' librocksdb-dev 2>/dev/null) || [ -z "$ver" ]; then
	echo "build-rocksdb: librocksdb-dev is not installed (run make deps)" >&2
	exit 1
fi
upstream=${ver%%-*}
upstream=${upstream#*:}
out="$CACHE/rocksdb-$upstream-release"
if [ -f "$out/lib/librocksdb.a" ] && [ -f "$out/.complete" ]; then
	echo "build-rocksdb: reusing $out" >&2
	echo "$out"
	exit 0
fi

# A deb-src entry for the suite the binary packages come from, with the
# same mirror and keyring, so apt-get source finds the matching source.
src_list=/etc/apt/sources.list.d/leaseq-deb-src.sources
if ! apt-get source --print-uris rocksdb >/dev/null 2>&1; then
	codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
	echo "build-rocksdb: adding $src_list (deb-src for $codename)" >&2
	as_root tee "$src_list" >/dev/null <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	as_root apt-get update -qq
fi
missing=()
for p in cmake dpkg-dev; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

work="$CACHE/src"
mkdir -p "$work"
cd "$work"
srcdir=$(find . -maxdepth 1 -type d -name "rocksdb-$upstream*" | head -1)
if [ -z "$srcdir" ]; then
	echo "build-rocksdb: apt-get source rocksdb=$ver" >&2
	apt-get source -qq "rocksdb=$ver" >&2
	srcdir=$(find . -maxdepth 1 -type d -name "rocksdb-$upstream*" | head -1)
fi
[ -n "$srcdir" ] || { echo "build-rocksdb: source of rocksdb $upstream not found in $work" >&2; exit 1; }

# Release build of the static library only: no tests, tools or benchmarks.
# PORTABLE keeps the library runnable on any x86-64 CPU; FORCE_SSE42 adds
# SSE4.2 and PCLMUL for hardware CRC32C (every x86-64 CPU since 2009-2011):
# 5-19 % less CPU per item in BenchmarkCycle than a build without it
# (docs/BENCHMARKS.md, "Hardware CRC32C on its own").
build="$work/build-release"
cmake -S "$srcdir" -B "$build" -DCMAKE_BUILD_TYPE=Release \
	-DWITH_TESTS=OFF -DWITH_TOOLS=OFF -DWITH_BENCHMARK_TOOLS=OFF -DWITH_CORE_TOOLS=OFF \
	-DWITH_GFLAGS=OFF -DWITH_LZ4=ON -DWITH_ZSTD=ON -DWITH_SNAPPY=ON -DWITH_ZLIB=ON -DWITH_BZ2=ON \
	-DPORTABLE=ON -DFORCE_SSE42=ON -DROCKSDB_BUILD_SHARED=OFF -DFAIL_ON_WARNINGS=OFF >&2
start=$SECONDS
cmake --build "$build" --target rocksdb -j "$JOBS" >&2
echo "build-rocksdb: built in $((SECONDS - start))s" >&2

rm -rf "$out"
mkdir -p "$out/lib"
cp "$build/librocksdb.a" "$out/lib/"
cp -r "$srcdir/include" "$out/include"
echo "$ver" >"$out/.complete"
echo "build-rocksdb: installed $out" >&2
echo "$out"
