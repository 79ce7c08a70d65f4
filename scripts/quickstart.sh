#!/usr/bin/env bash
# The README's first command: installs the dependencies (Debian 12), builds
# everything, and runs the main demo: a TreeLSTM trained with Sheaf on
# synthetic sentiment trees, with its speed against per-example and
# hand-batched LibTorch code. Extra arguments go to the demo, e.g.
#   scripts/quickstart.sh --data ../shared/data/sst --epochs 3
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
./build/examples/tree_lstm "$@"
