# Thin wrapper over CMake. `make demo` and `make test` work on a fresh Debian
# machine: they install what is missing (scripts/deps.sh), configure and build.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan

.PHONY: all deps build demo test test-fast test-asan test-gpu clean

all: build

deps:
	@scripts/deps.sh

# The generated Makefile, not CMakeCache.txt, marks a finished configure: a
# configure that failed (a package missing) leaves the cache behind.
$(BUILD)/Makefile:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

build: deps $(BUILD)/Makefile
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)/replay

# The test command: the normal build, then the ASan+UBSan build, CPU tests in both.
test: test-fast test-asan

test-fast: build
	@scripts/fetch-tokenizers.sh
	@cd $(BUILD) && ctest -L cpu --output-on-failure -j $(JOBS)

test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DREPLAY_SANITIZE=ON -DREPLAY_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@scripts/fetch-tokenizers.sh
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest -L cpu --output-on-failure -j $(JOBS)

# On a machine with a GPU.
test-gpu: build
	@cd $(BUILD) && ctest -L gpu --output-on-failure

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
