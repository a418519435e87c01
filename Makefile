# leaseq build, test and tooling. `make help` lists the targets.
#
# Options (make VAR=value target):
#   RACE=1        run every test package with -race (default: only RACE_PKGS)
#   COUNT=N       go test -count (default 1: never use cached results)
#   TIMEOUT=D     go test -timeout (default 20m)
#   FUZZTIME=D    time per fuzz target for `make fuzz` (default 30s)
#   ITERATIONS=N  `make bench`: run each benchmark exactly N times (-benchtime=Nx)
#   BENCH=regex   `make bench`: which benchmarks (default .)
#   PKGS=pattern  packages for `make bench` (default ./...)
#   DATA=dir      database directory for `make run` (default ./data)
#   ARGS=...      extra flags for `make run`, e.g. ARGS='--sync=none'
#   STRESS_PKG=   package for `make stress` (default ./sweeper); STRESS_N=runs; RUN=regex
#   CPU=list      go test -cpu for `make test`, `make bench` and `make bench-compare` (e.g. CPU=1,2)
#   REF=gitref    `make bench-compare`: the revision to compare the working tree with (default HEAD~1)
#   ROCKSDB=debian  `make static`, `make bench`, `make bench-peers`: link Debian's assertion-enabled
#                 librocksdb.a instead of the release build of `make rocksdb`
#   ROCKSDB_CACHE=dir  where `make rocksdb` builds and keeps the release library
#                 (default $${XDG_CACHE_HOME:-~/.cache}/leaseq)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
RACE ?=
COUNT ?= 1
TIMEOUT ?= 20m
FUZZTIME ?= 30s
ITERATIONS ?=
BENCH ?= .
PKGS ?= ./...
DATA ?= ./data
ARGS ?=
STRESS_PKG ?= ./sweeper
STRESS_N ?= 50
RUN ?=
CPU ?=
REF ?= HEAD~1
# CPU_FLAG is the go test -cpu flag when CPU is set.
CPU_FLAG = $(if $(CPU),-cpu $(CPU))

# Build tags of every test run: invariants turns on the costly internal
# consistency checks (STYLE.md §3).
TEST_TAGS := invariants

# Directories whose packages start goroutines or have concurrent tests;
# `make test` runs them (and their sub-packages) with -race, the rest
# without, to stay well inside CI's time on 2 cores. "." is the root package
# (main: serve's signal handling). Missing directories are skipped.
# bench itself is left out: its in-process workload tests assert throughput
# in 300 ms windows, which -race on a loaded 2-core machine breaks about one
# run in four (measured); its concurrent helpers leaseqt, procx and
# tracestat (whose test traces a store under concurrent calls) stay in.
# `make test-race` still runs everything with -race.
RACE_PKGS ?= . sweeper rpc storage/memstore storage/rocksstore fdbsync bench/leaseqt bench/procx bench/tracestat

# Debian packages the build needs: RocksDB (shared and static libraries
# and headers, and through it snappy, lz4, zstd, zlib, bz2), the capnp
# compiler, and a C++ toolchain for cgo. libcapnp-dev (the C++ reference
# implementation of Cap'n Proto) and pkg-config build the C++ clients in
# docs/cpp, which the interop test (TestCpp_Interop) runs against a node;
# Chromium is driven headless by rpc/webui's browser test. Those tests fail
# without them.
APT_PKGS := librocksdb-dev capnproto g++ libcapnp-dev pkg-config chromium
# capnpc-go must match the capnp runtime in go.mod, or generated code differs.
CAPNP_VERSION := v3.1.0-alpha.2

# Tools installed with `go install` (capnpc-go) land here; put it on PATH.
GO_BIN_DIR := $(or $(shell $(GO) env GOBIN 2>/dev/null),$(addsuffix /bin,$(shell $(GO) env GOPATH 2>/dev/null)))
ifneq ($(GO_BIN_DIR),)
export PATH := $(GO_BIN_DIR):$(PATH)
endif

# The fully static binary (VERSIONS.md): link RocksDB and its compression
# libraries statically ourselves (leaseq_no_link drops storage/rocksstore's
# own dynamic link flags, rdb_link.go); netgo and osusergo avoid glibc's NSS,
# which cannot be linked statically.
STATIC_CGO_LDFLAGS := -lrocksdb -lsnappy -llz4 -lzstd -lz -lbz2 -lstdc++ -lm -ldl -pthread
STATIC_TAGS := leaseq_no_link netgo osusergo
STATIC_LDFLAGS := -s -w -linkmode external -extldflags "-static"

# The release RocksDB (`make rocksdb`): Debian's own source of the installed
# librocksdb-dev, built with CMAKE_BUILD_TYPE=Release (NDEBUG), static, with
# hardware CRC32C, into a cache outside the checkout. Debian's library is an
# assertion build; docs/BENCHMARKS.md has the measured difference. Static
# builds and benchmarks link the release library unless ROCKSDB=debian;
# `make test` and CI keep Debian's (its asserts catch misuse in tests, and
# the release build takes longer than CI's budget).
ROCKSDB ?= release
ROCKSDB_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/leaseq
export ROCKSDB_CACHE
ROCKSDB_RELEASE_DIR = $(ROCKSDB_CACHE)/rocksdb-$(shell dpkg-query -W -f='$${Version}' librocksdb-dev 2>/dev/null | sed 's/^[0-9]*://; s/-.*//')-release
# static_env sets CGO_CPPFLAGS/CGO_LDFLAGS for a static link against the
# chosen library. storage/rocksstore's C++ binding (rdb.cc) is compiled
# against the same library's headers, with NDEBUG as the library was.
static_env = $(if $(filter debian,$(ROCKSDB)),CGO_LDFLAGS="$(STATIC_CGO_LDFLAGS)",CGO_CPPFLAGS="-I$(ROCKSDB_RELEASE_DIR)/include -DNDEBUG" CGO_LDFLAGS="-L$(ROCKSDB_RELEASE_DIR)/lib $(STATIC_CGO_LDFLAGS)")
# rocksdb_dep is the prerequisite that provides the chosen library.
rocksdb_dep = $(if $(filter debian,$(ROCKSDB)),deps,rocksdb)

# race_list prints the existing RACE_PKGS as go package patterns.
race_list = for d in $(RACE_PKGS); do if [ "$$d" = . ]; then echo .; elif [ -d "$$d" ]; then echo "./$$d/..."; fi; done

.PHONY: help deps rocksdb build static run test test-race test-fdb stress fuzz bench bench-peers bench-compare generate verify fmt lint tidy build-fdb clean

help: ## list the targets and options
	@echo "Usage: make <target> [VAR=value ...]"
	@echo
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo
	@sed -n '/^# Options/,/^$$/p' $(MAKEFILE_LIST) | sed 's/^# \{0,1\}//'

deps: ## install what is missing (Debian): librocksdb-dev, capnproto, g++, libcapnp-dev, pkg-config, chromium via apt; capnpc-go via go install
	@command -v $(GO) >/dev/null || { echo "deps: Go 1.26 is required and not on PATH (install it from go.dev/dl)" >&2; exit 1; }
	@missing=""; \
	for p in $(APT_PKGS); do dpkg -s "$$p" >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		sudo=""; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
		echo "deps: installing$$missing"; \
		$$sudo apt-get update; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi
	@if ! p=$$(command -v capnpc-go) || ! $(GO) version -m "$$p" | grep -q "capnproto.org/go/capnp/v3[[:space:]]*$(CAPNP_VERSION)"; then \
		echo "deps: installing capnpc-go@$(CAPNP_VERSION)"; \
		$(GO) install capnproto.org/go/capnp/v3/capnpc-go@$(CAPNP_VERSION); \
	fi

rocksdb: deps ## build the release RocksDB (static, NDEBUG, hardware CRC32C) from Debian's source once into ROCKSDB_CACHE; prints where
	@dir=$$(bash bench/scripts/build-rocksdb.sh | tail -1); echo "rocksdb: release library in $$dir"

build: ## build ./leaseq (dynamically linked against librocksdb)
	$(GO) build -o leaseq .

static: $(rocksdb_dep) ## build ./leaseq as one fully static binary (release RocksDB; ROCKSDB=debian for Debian's) and check that it is static and runs
	$(static_env) $(GO) build -tags '$(STATIC_TAGS)' -ldflags '$(STATIC_LDFLAGS)' -o leaseq .
	@if command -v file >/dev/null; then file leaseq; file leaseq | grep -q 'statically linked'; fi
	@if out=$$(ldd leaseq 2>&1); then echo "static: leaseq is dynamically linked:"; echo "$$out"; exit 1; else echo "ldd: $$out"; fi
	./leaseq help >/dev/null
	@ls -l leaseq

run: deps build ## install what is missing, build, and start a node on embedded RocksDB in ./data (Ctrl-C stops it)
	./leaseq serve --data $(DATA) $(ARGS)

test: deps ## go vet, then all tests (-tags invariants), with -race for RACE_PKGS
	$(GO) vet ./...
	@# Files behind the test tags are vetted too, when there are any.
	@if grep -rlq --include='*.go' '^//go:build.*invariants' .; then \
		echo "$(GO) vet -tags '$(TEST_TAGS)' ./..."; $(GO) vet -tags '$(TEST_TAGS)' ./...; fi
	@race="$$($(race_list))"; \
	if [ -n "$(RACE)" ]; then race="./..."; norace=""; \
	else \
		race_pkgs=$$($(GO) list $$race | sort); \
		norace=$$(comm -23 <($(GO) list ./... | sort) <(echo "$$race_pkgs")); \
	fi; \
	if [ -n "$$norace" ]; then \
		echo "$(GO) test -tags '$(TEST_TAGS)' -count=$(COUNT) -timeout $(TIMEOUT)" $$norace; \
		$(GO) test -tags '$(TEST_TAGS)' $(CPU_FLAG) -count=$(COUNT) -timeout $(TIMEOUT) $$norace; \
	fi; \
	echo "$(GO) test -race -tags '$(TEST_TAGS)' -count=$(COUNT) -timeout $(TIMEOUT)" $$race; \
	$(GO) test -race -tags '$(TEST_TAGS)' $(CPU_FLAG) -count=$(COUNT) -timeout $(TIMEOUT) $$race
	@# The rpc and HTTP API tests again on RocksDB with sync=always, the
	@# node's default store.
	LEASEQ_RPC_TEST_STORE=rocks $(GO) test -race -tags '$(TEST_TAGS)' $(CPU_FLAG) -count=$(COUNT) -timeout 10m ./rpc/ ./rpc/httpapi/
	@# Under -race the multi-node FDB history test runs 10k items; issue 5
	@# asks for >= 100k, which only a plain build finishes in time.
	$(GO) test -tags '$(TEST_TAGS)' -count=$(COUNT) -timeout $(TIMEOUT) -run '^TestFDBMultiNodeHistory$$' ./fdbsync/

test-race: deps ## all tests with -race
	$(MAKE) --no-print-directory test RACE=1

test-fdb: ## fdbsync tests against a real cluster (needs libfdb_c and FDB_CLUSTER_FILE; not possible on this project's machines)
	$(GO) test -tags 'fdb $(TEST_TAGS)' $(if $(RACE),-race) -count=$(COUNT) -timeout $(TIMEOUT) ./fdbsync/...

stress: ## run one package's tests in a loop until they fail (STRESS_PKG=./sweeper, RUN=regex, STRESS_N=50; -race)
	@mkdir -p bin; \
	$(GO) test -c -race -tags '$(TEST_TAGS)' -o bin/stress.test $(STRESS_PKG); \
	cd $(STRESS_PKG); \
	for i in $$(seq 1 $(STRESS_N)); do \
		echo "== stress run $$i/$(STRESS_N)"; \
		$(CURDIR)/bin/stress.test -test.count=1 -test.timeout=$(TIMEOUT) $(if $(RUN),-test.run '$(RUN)') >$(CURDIR)/bin/stress.log 2>&1 || { cat $(CURDIR)/bin/stress.log; echo "stress: failed on run $$i"; exit 1; }; \
	done; echo "stress: $(STRESS_N) runs passed"

fuzz: deps ## run every Fuzz* target for FUZZTIME (default 30s) each (rpc's once per RPC engine, so twice as long)
	@dirs=$$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u); \
	if [ -z "$$dirs" ]; then echo "fuzz: no Fuzz targets"; exit 0; fi; \
	for d in $$dirs; do \
		for f in $$($(GO) test -tags '$(TEST_TAGS)' -list '^Fuzz' "$$d" | grep '^Fuzz' | sort -u); do \
			echo "== fuzz $$d $$f for $(FUZZTIME)"; \
			$(GO) test -tags '$(TEST_TAGS)' -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) "$$d"; \
		done; \
	done

# Benchmarks link statically against the release RocksDB, as `make static`
# ships (a dynamically linked binary spends measurably more CPU in RocksDB's
# thread-local counters), and without the invariants tag.
BENCH_FLAGS = -tags '$(STATIC_TAGS)' -ldflags '-linkmode external -extldflags "-static"'
bench: $(rocksdb_dep) ## run Go benchmarks, statically linked (ITERATIONS=N for N iterations each, COUNT=, BENCH=regex, PKGS=, ROCKSDB=)
	$(static_env) $(GO) test $(BENCH_FLAGS) -run '^$$' -bench '$(BENCH)' -benchmem $(CPU_FLAG) $(if $(ITERATIONS),-benchtime=$(ITERATIONS)x) -count=$(COUNT) -timeout $(TIMEOUT) $(PKGS)

# bench-compare runs the same benchmarks on REF (in a temporary git
# worktree, so the working tree is untouched) and on the working tree, and
# compares them with benchstat. Use COUNT>=5 (the default here is 6) for
# benchstat's statistics to mean something; numbers on a shared machine
# are noisy.
bench-peers: static ## install beanstalkd, redis and nats-server, then compare them with the static leaseq side by side (ARGS= passes bench flags)
	LEASEQ_BIN=$(CURDIR)/leaseq bash bench/scripts/bench-peers.sh $(ARGS)

bench-compare: $(rocksdb_dep) ## compare Go benchmarks of REF (default HEAD~1) with the working tree via benchstat (BENCH=, PKGS=, COUNT=)
	@command -v benchstat >/dev/null || { echo "bench-compare: benchstat not on PATH: go install golang.org/x/perf/cmd/benchstat@<version>" >&2; exit 1; }
	@mkdir -p bin; rm -rf bin/bench-ref; \
	git worktree add --detach bin/bench-ref '$(REF)' >/dev/null; \
	trap 'git worktree remove --force bin/bench-ref' EXIT; \
	count=$(if $(filter 1,$(COUNT)),6,$(COUNT)); \
	echo "== $(REF)"; \
	(cd bin/bench-ref && $(static_env) $(GO) test $(BENCH_FLAGS) -run '^$$' -bench '$(BENCH)' -benchmem $(CPU_FLAG) -count=$$count -timeout $(TIMEOUT) $(PKGS)) | tee bin/bench-old.txt; \
	echo "== working tree"; \
	$(static_env) $(GO) test $(BENCH_FLAGS) -run '^$$' -bench '$(BENCH)' -benchmem $(CPU_FLAG) -count=$$count -timeout $(TIMEOUT) $(PKGS) | tee bin/bench-new.txt; \
	benchstat bin/bench-old.txt bin/bench-new.txt

# capnp compile runs inside schema/ (as schema/generate.go does): the
# generated code embeds the schema's path ("queue.capnp:Queue"), so compiling
# schema/queue.capnp from the root would change every interface name. A
# schema whose $Go.import names a sub-package of schema (queueber.capnp:
# github.com/leaseq/leaseq/schema/queueber) is generated into that
# directory, so its types do not clash with queue.capnp's.
generate: ## regenerate schema/**/*.capnp.go from schema/*.capnp (capnp + capnpc-go)
	@if ! compgen -G 'schema/*.capnp' >/dev/null; then echo "generate: no schema/*.capnp, nothing to do"; exit 0; fi; \
	$(GO) mod download capnproto.org/go/capnp/v3; \
	std="$$($(GO) list -m -f '{{.Dir}}' capnproto.org/go/capnp/v3)/std"; \
	cd schema; \
	for f in *.capnp; do \
		sub=$$(sed -n 's|^\$$Go.import("github.com/leaseq/leaseq/schema/\([^"]*\)");.*|\1|p' "$$f"); \
		mkdir -p "$${sub:-.}"; \
		echo "(cd schema && capnp compile -I$$std -ogo$${sub:+:$$sub} $$f)"; \
		capnp compile -I"$$std" -ogo$${sub:+:$$sub} "$$f"; \
	done

verify: generate ## regenerate, then fail if the committed generated code differs
	@git diff --exit-code --stat -- schema/ || { echo "verify: generated code in schema/ is out of date: run make generate and commit" >&2; exit 1; }
	@untracked=$$(git ls-files --others --exclude-standard -- schema/); \
	if [ -n "$$untracked" ]; then echo "verify: generated files not committed: $$untracked" >&2; exit 1; fi
	@echo "verify: generated code is up to date"

fmt: ## gofmt -w every Go file (and goimports -w when it is installed)
	gofmt -w $$(git ls-files '*.go')
	@if command -v goimports >/dev/null; then goimports -w -local github.com/leaseq/leaseq $$(git ls-files '*.go'); else echo "fmt: goimports not installed; gofmt only"; fi

tidy: ## go mod tidy (the lead runs it: others may have uncommitted imports)
	$(GO) mod tidy

lint: ## gofmt, go vet, and the repo's import and clock/logger rules
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt: needs formatting:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -count=1 -run '^(TestImports|TestLint)' .
	@if command -v staticcheck >/dev/null; then echo staticcheck ./...; staticcheck ./...; else echo "lint: staticcheck not installed; skipped"; fi

build-fdb: ## build bin/leaseq-fdb with the FoundationDB backend (needs libfdb_c)
	$(GO) build -tags fdb -o bin/leaseq-fdb .

clean: ## remove built binaries and test artifacts (keeps ./data)
	rm -f leaseq *.test *.prof
	rm -rf bin/ bench-results/

.PHONY: cpp-example
cpp-example: deps ## build the C++ client examples bin/leaseq-cpp-client (docs/cpp/client.c++) and bin/queueber-cpp-client (docs/cpp/queueber_client.c++)
	@mkdir -p bin/cpp
	std="$$($(GO) list -m -f '{{.Dir}}' capnproto.org/go/capnp/v3)/std"; \
	cd schema && capnp compile -I"$$std" -oc++:../bin/cpp queue.capnp queueber.capnp
	g++ -std=c++17 -O1 -Ibin/cpp docs/cpp/client.c++ bin/cpp/queue.capnp.c++ $$(pkg-config --cflags --libs capnp-rpc) -o bin/leaseq-cpp-client
	g++ -std=c++17 -O1 -Ibin/cpp docs/cpp/queueber_client.c++ bin/cpp/queueber.capnp.c++ $$(pkg-config --cflags --libs capnp-rpc) -o bin/queueber-cpp-client
	@echo "run: bin/leaseq-cpp-client [127.0.0.1:7700 | unix:/path] [--wait-done]"
	@echo "run: bin/queueber-cpp-client ADDR (a node's --queueber-listen address)"
