#!/usr/bin/env bash
# Copies the header-only dependencies (and Gloo's headers, which LibTorch
# needs for its Gloo process group but does not ship) from this (Debian) machine into one
# directory, for building on a machine that lacks the packages (e.g. a GPU
# machine with a pip-installed torch). Then configure with:
#   cmake -S . -B build-cuda \
#     -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
#     -DSHEAF_HANA_INCLUDE_DIR=DIR -DSHEAF_CLI11_INCLUDE_DIR=DIR -DSHEAF_CATCH2_INCLUDE_DIR=DIR \
#     -DSHEAF_GLOO_INCLUDE_DIR=DIR
set -euo pipefail
dir=${1:?usage: scripts/vendor-headers.sh DIR}
mkdir -p "$dir/boost"
cp -r /usr/include/boost/hana "$dir/boost/"
cp /usr/include/boost/hana.hpp "$dir/boost/"
cp -r /usr/include/CLI "$dir/"
cp -r /usr/include/catch2 "$dir/"
cp -r /usr/include/gloo "$dir/"
echo "headers copied to $dir ($(du -sh "$dir" | cut -f1))"
