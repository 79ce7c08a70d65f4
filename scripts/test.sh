#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite. This is the README's test
# command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/build.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
