# Thin wrapper over CMake for the commands people type. Every target installs what it needs.
#   make          build (release) into build/
#   make test     warnings-as-errors build + all tests, then again under ASan + UBSan, then
#                 the fuzz targets over their corpora
#   make bench    build and run the benchmarks (kvrouter bench all)
#   make demo     build, then router + 4 mocker engines on loopback: the conversation trace
#                 replayed under kv and round-robin routing, a table and demo-ttft.png
#   make fuzz     run each fuzz target for FUZZ_SECONDS (default 60) from its corpus

JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 15
CMAKE ?= cmake

.PHONY: all deps build build-werror build-asan build-fuzz test test-release test-asan \
        test-fuzz bench demo fuzz clean

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

build-fuzz: deps
	CC=clang $(CMAKE) -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKVR_WERROR=ON \
	  -DKVR_SANITIZE=ON -DKVR_FUZZ=ON -DKVR_TESTS=OFF -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
	$(CMAKE) --build build-fuzz -j $(JOBS)

test: test-release test-asan test-fuzz
	@echo "make test: all suites passed"

test-release: build-werror
	cd build-werror && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 KVR_TEST_SCALE=asan \
	  ctest --output-on-failure -j $(JOBS)

# Replays every corpus file, then fuzzes briefly from the corpus (a regression smoke test).
test-fuzz: build-fuzz
	@set -e; for f in build-fuzz/fuzz_*; do \
	  [ -x "$$f" ] || continue; n=$$(basename $$f); \
	  echo "== $$n: corpus replay + $(FUZZ_SMOKE_SECONDS)s"; \
	  $$f -runs=0 fuzz/corpus/$${n#fuzz_} >/dev/null 2>&1 || { $$f -runs=0 fuzz/corpus/$${n#fuzz_}; exit 1; }; \
	  mkdir -p build-fuzz/corpus-$$n; \
	  $$f -max_total_time=$(FUZZ_SMOKE_SECONDS) -print_final_stats=0 \
	    build-fuzz/corpus-$$n fuzz/corpus/$${n#fuzz_} >build-fuzz/$$n.log 2>&1 \
	    || { tail -50 build-fuzz/$$n.log; exit 1; }; \
	done

fuzz: build-fuzz
	@set -e; for f in build-fuzz/fuzz_*; do \
	  [ -x "$$f" ] || continue; n=$$(basename $$f); mkdir -p build-fuzz/corpus-$$n; \
	  $$f -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus-$$n fuzz/corpus/$${n#fuzz_}; \
	done

bench: build
	./build/kvrouter bench all

# Only the binary (no tests), so a fresh machine gets to the demo quickly.
demo: deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build build -j $(JOBS) --target kvrouter_bin
	./build/kvrouter demo

clean:
	rm -rf build build-werror build-asan build-fuzz
