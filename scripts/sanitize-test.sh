#!/usr/bin/env bash
# Builds the test suite with AddressSanitizer and UndefinedBehaviorSanitizer
# against the default LibTorch (Debian's) and runs it. CI runs the same
# sanitizers against LibTorch 2.x instead (SHEAF_SANITIZE=1 scripts/torch2-test.sh),
# one build for both checks. Both build sheaf-bench, so that its bench-set-*
# entries run sanitized. Flags and options: scripts/sanitizer-env.sh.
#
#   scripts/sanitize-test.sh [CTEST_ARGS...]      (BUILD_DIR default: build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-asan}
start=$SECONDS
source scripts/sanitizer-env.sh
if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  cmake -S . -B "$build" "${sanitize_cmake_args[@]}" \
    -DSHEAF_BUILD_EXAMPLES=OFF -DSHEAF_BUILD_BENCH=ON > "$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@"
echo "sanitize-test: ASan+UBSan suite passed in $((SECONDS - start)) s"
