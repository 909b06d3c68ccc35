# Thin wrapper over CMake for the commands people type. Every target installs what it needs.
#   make          build (release) into build/
#   make test     warnings-as-errors build + all tests (with a 60 s soak), then again under
#                 ASan + UBSan, the threaded suites under TSan, then the fuzz targets
#   make soak     the soak for SOAK_SECONDS (default 1800): churn, kills, cancels; flat RSS
#   make soak-nats  two replicas under a NATS forgery flood for NATS_SOAK_SECONDS (default 600):
#                 local requests all served, RSS bounded by the peer budgets
#   make flake-check  every integration suite FLAKE_RUNS times (default 10); not in CI
#   make bench    build and run the benchmarks (kvrouter bench all)
#   make demo     build, then router + 4 mocker engines on loopback: the conversation trace
#                 replayed under kv and round-robin routing, a table and demo-ttft.png
#   make fuzz     run each fuzz target for FUZZ_SECONDS (default 60) from its corpus
#   make install  libkvrouter, its headers and kvrouter.pc into PREFIX (default /usr/local)

JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 8
# one input running longer than this is a failure (libFuzzer's own default waits 20 minutes)
FUZZ_INPUT_TIMEOUT ?= 10
SOAK_SECONDS ?= 1800
NATS_SOAK_SECONDS ?= 600
FLAKE_RUNS ?= 10
PREFIX ?= /usr/local
# The suites with more than one thread: the ingest thread, the listener it owns, the index's
# concurrent readers and writer, the mocker's loop and the processes driven end to end.
TSAN_TESTS = ^(test_index_concurrent|test_ingest|test_zmq_listener|test_kv_publisher|integration_test_(serve_events|mocker|frontend|warm_restart|replicas|indexer|disagg)|faults)$$
CMAKE ?= cmake

.PHONY: all deps build build-werror build-asan build-tsan build-fuzz test test-release \
        test-asan test-tsan test-fuzz soak soak-nats flake-check bench demo fuzz install clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build build -j $(JOBS)

build-werror: deps
	$(CMAKE) -S . -B build-werror -DCMAKE_BUILD_TYPE=Release -DKVR_WERROR=ON >/dev/null
	$(CMAKE) --build build-werror -j $(JOBS)

build-asan: deps
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVR_WERROR=ON -DKVR_SANITIZE=ON \
	  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
	$(CMAKE) --build build-asan -j $(JOBS)

build-tsan: deps
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKVR_WERROR=ON -DKVR_TSAN=ON \
	  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
	$(CMAKE) --build build-tsan -j $(JOBS)

build-fuzz: deps
	CC=clang $(CMAKE) -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKVR_WERROR=ON \
	  -DKVR_SANITIZE=ON -DKVR_FUZZ=ON -DKVR_TESTS=OFF -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
	$(CMAKE) --build build-fuzz -j $(JOBS)

test: test-release test-asan test-tsan test-fuzz
	@echo "make test: all suites passed"

test-release: build-werror
	cd build-werror && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 KVR_TEST_SCALE=asan \
	  ctest --output-on-failure -j $(JOBS)

# Suppressions cover only the uninstrumented libzmq; see tests/tsan/tsan.supp.
test-tsan: build-tsan
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan/tsan.supp" \
	  KVR_TEST_SCALE=asan ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)'

soak: build-werror
	/usr/bin/python3 tests/soak/soak.py build-werror/kvrouter --seconds $(SOAK_SECONDS) \
	  --report build-werror/soak.tsv

soak-nats: build-werror
	/usr/bin/python3 tests/soak/nats_forgery.py build-werror/kvrouter \
	  --seconds $(NATS_SOAK_SECONDS) --report build-werror/soak-nats.tsv

# Runs every integration suite FLAKE_RUNS times, one after another; stops at the first failure.
flake-check: build-werror
	@set -e; cd build-werror; for i in $$(seq 1 $(FLAKE_RUNS)); do \
	  echo "== flake-check run $$i/$(FLAKE_RUNS)"; \
	  ctest --output-on-failure -j $(JOBS) -R '^(integration_|faults$$)' || { echo "flake-check: run $$i failed"; exit 1; }; \
	done; echo "flake-check: $(FLAKE_RUNS) runs passed"

# Replays every corpus file, then fuzzes briefly from the corpus (a regression smoke test).
test-fuzz: build-fuzz
	@set -e; for f in build-fuzz/fuzz_*; do \
	  [ -x "$$f" ] || continue; n=$$(basename $$f); \
	  echo "== $$n: corpus replay + $(FUZZ_SMOKE_SECONDS)s"; \
	  $$f -runs=0 -timeout=$(FUZZ_INPUT_TIMEOUT) fuzz/corpus/$${n#fuzz_} >/dev/null 2>&1 \
	    || { $$f -runs=0 -timeout=$(FUZZ_INPUT_TIMEOUT) fuzz/corpus/$${n#fuzz_}; exit 1; }; \
	  mkdir -p build-fuzz/corpus-$$n; \
	  $$f -max_total_time=$(FUZZ_SMOKE_SECONDS) -timeout=$(FUZZ_INPUT_TIMEOUT) -print_final_stats=0 \
	    build-fuzz/corpus-$$n fuzz/corpus/$${n#fuzz_} >build-fuzz/$$n.log 2>&1 \
	    || { tail -50 build-fuzz/$$n.log; exit 1; }; \
	done

fuzz: build-fuzz
	@set -e; for f in build-fuzz/fuzz_*; do \
	  [ -x "$$f" ] || continue; n=$$(basename $$f); mkdir -p build-fuzz/corpus-$$n; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_INPUT_TIMEOUT) build-fuzz/corpus-$$n fuzz/corpus/$${n#fuzz_}; \
	done

bench: build
	./build/kvrouter bench all

# Only the binary (no tests), so a fresh machine gets to the demo quickly.
demo: deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build build -j $(JOBS) --target kvrouter_bin
	./build/kvrouter demo

clean:
	rm -rf build build-werror build-asan build-tsan build-fuzz

# The library, its headers and kvrouter.pc only: no test is built for an install.
install: deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build build -j $(JOBS) --target kvrouter
	$(CMAKE) --install build --prefix $(PREFIX)
