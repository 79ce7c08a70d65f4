#!/usr/bin/env bash
# Builds the test suite with AddressSanitizer and UndefinedBehaviorSanitizer and
# runs it (CI runs this after the README's test command). Any report fails the
# run: ASan aborts on the first error; UBSan is made fatal.
#
#   scripts/sanitize-test.sh [CTEST_ARGS...]      (BUILD_DIR default: build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-asan}
start=$SECONDS
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DSHEAF_BUILD_EXAMPLES=OFF -DSHEAF_BUILD_BENCH=OFF > "$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)"
# LibTorch's own allocations at exit are not ours to report; everything else is.
# detect_stack_use_after_return: a frame's locals stay poisoned after it
# returns, so a reference kept past its frame (a callback's captured local, a
# temporary bound to a member reference) is reported, not read by luck.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Random programs: a tenth of the Release run's count (everything is ~10x slower here).
export SHEAF_RANDOM_PROGRAMS=${SHEAF_RANDOM_PROGRAMS:-10}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@"
echo "sanitize-test: ASan+UBSan suite passed in $((SECONDS - start)) s"
