#!/usr/bin/env bash
# Installs what Sheaf needs to build, test and benchmark on Debian 12, from
# Debian's own packages. OpenBLAS matters: Debian's default reference BLAS is
# ~40x slower and would make every figure meaningless.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake \
  libtorch-dev libopenblas0-pthread libgloo-dev \
  libboost-dev librange-v3-dev catch2 libcli11-dev \
  gnuplot-nox > /dev/null
echo "dependencies installed"
