#!/usr/bin/env bash
# Builds the test suite against LibTorch 2.x taken from PyPI's `torch` wheel and
# runs it on the CPU (Debian's LibTorch 1.13 stays the default: scripts/test.sh).
#
#   scripts/torch2-test.sh [CTEST_ARGS...]
#
# Environment:
#   SHEAF_TORCH_VERSION  torch version on PyPI (default below: the newest that passes)
#   SHEAF_CACHE_DIR      keeps the wheels and the unpacked LibTorch between runs
#                        (default ${XDG_CACHE_HOME:-~/.cache}/sheaf); ccache's cache too
#   BUILD_DIR            build directory (default build-torch<version>, -asan with SHEAF_SANITIZE)
#   SHEAF_SANITIZE=1     builds with AddressSanitizer + UndefinedBehaviorSanitizer
#                        (scripts/sanitizer-env.sh) instead of Release: CI's one
#                        build for both checks
#   JOBS                 parallel compile and test jobs (default nproc)
#
# What it installs, with pip from PyPI only: the torch wheel without its
# dependencies (--no-deps: no Python packages, none of the multi-GB nvidia-*
# wheels) plus the small CUDA runtime wheels that libtorch_cpu.so itself needs
# to load (libcudart, libcupti) and whose headers c10_cuda's interface names
# (cudart, crt), ~15 MB, at the versions torch pins. They go into
# $SHEAF_CACHE_DIR/torch-<version>/, laid out like site-packages so that the
# libraries' own RPATHs find each other. Tests link torch_cpu and c10 only (not
# libtorch.so / libtorch_cuda.so): no CUDA toolkit or GPU is needed, and the
# [cuda] tests skip. Uses ccache when it is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
start=$SECONDS

version=${SHEAF_TORCH_VERSION:-2.15.0}
cache=${SHEAF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sheaf}
sanitize=${SHEAF_SANITIZE:-0}
build_type=(-DCMAKE_BUILD_TYPE=Release) flavour=""
if [ "$sanitize" = 1 ]; then
  source scripts/sanitizer-env.sh
  build_type=("${sanitize_cmake_args[@]}") flavour=-asan
fi
build=${BUILD_DIR:-build-torch$version$flavour}
jobs=${JOBS:-$(nproc)}
prefix=$cache/torch-$version
pip=(python3 -m pip --disable-pip-version-check)

# ---- LibTorch: the wheel's torch/ (headers, libraries, CMake files) and nvidia/cu*/lib.
if [ ! -f "$prefix/.complete" ]; then
  if ! "${pip[@]}" --version >/dev/null 2>&1; then
    echo "torch2-test: needs pip for python3 (Debian: apt-get install python3-pip)" >&2
    exit 1
  fi
  wheels=$cache/wheels/torch-$version
  mkdir -p "$wheels"
  echo "torch2-test: fetching torch==$version from PyPI into $wheels"
  "${pip[@]}" download --quiet --no-deps --only-binary=:all: --dest "$wheels" "torch==$version"
  pytag=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  wheel=$(ls "$wheels"/torch-"$version"-"$pytag"-*.whl | head -n1)
  # The CUDA runtime libraries libtorch_cpu.so links against, at the versions
  # torch pins: cuda-toolkit[...]==V (torch >= 2.9) or nvidia-cuda-*-cuXX==V.
  python3 - "$wheel" >"$wheels/cuda-runtime.txt" <<'EOF'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if re.fullmatch(r"torch-[^/]*\.dist-info/METADATA", n))
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].split(";")[0].strip()
    m = re.fullmatch(r"cuda-toolkit\[[^\]]*\]\s*(.*)", req)
    if m:
        print("cuda-toolkit[cudart,cupti,crt]" + m.group(1))
    elif re.match(r"nvidia-cuda-(runtime|cupti)(-cu\d+)?\s*[=<>~!]", req):
        print(req)
EOF
  echo "torch2-test: CUDA runtime wheels: $(tr '\n' ' ' <"$wheels/cuda-runtime.txt")"
  runtime=()
  if [ -s "$wheels/cuda-runtime.txt" ]; then
    mkdir -p "$wheels/runtime"
    "${pip[@]}" download --quiet --only-binary=:all: --dest "$wheels/runtime" -r "$wheels/cuda-runtime.txt"
    runtime=("$wheels"/runtime/*.whl)
  fi
  rm -rf "$prefix" "$prefix.tmp"
  "${pip[@]}" install --quiet --root-user-action=ignore --no-deps --no-compile --target "$prefix.tmp" "$wheel" "${runtime[@]}"
  missing=$(ldd "$prefix.tmp/torch/lib/libtorch_cpu.so" | grep "not found" || true)
  if [ -n "$missing" ]; then
    echo "torch2-test: libtorch_cpu.so cannot load:"$'\n'"$missing" >&2
    exit 1
  fi
  touch "$prefix.tmp/.complete"
  mv "$prefix.tmp" "$prefix"
fi

# A CMake package named Torch that loads the wheel's own TorchConfig.cmake, CPU only:
#  - Caffe2_DIR: the wheel's; otherwise find_dependency(Caffe2) prefers a system
#    LibTorch (Debian's 1.13) and mixes the two;
#  - torch::cudart defined first, from the CUDA runtime wheel: the wheel's
#    public/cuda.cmake then returns at once instead of requiring a CUDA toolkit
#    (and enabling CUDA in the project); c10_cuda, which tests/ links when it
#    exists, needs only it;
#  - TORCH_LIBRARIES: torch_cpu and c10 instead of libtorch.so, which would pull
#    in libtorch_cuda.so and with it cuDNN, NCCL, cuSPARSELt, NVSHMEM... (GBs);
#    torch_cpu gets the C++ API include directory that TorchConfig gives `torch`.
shim=$prefix/sheaf-cmake/TorchConfig.cmake
mkdir -p "$(dirname "$shim")"
cat >"$shim.new" <<'EOF'
# Written by scripts/torch2-test.sh: PyPI's LibTorch, used on the CPU only.
set(_sheaf_torch_cmake "${CMAKE_CURRENT_LIST_DIR}/../torch/share/cmake")
set(Caffe2_DIR "${_sheaf_torch_cmake}/Caffe2" CACHE PATH "The pip LibTorch's Caffe2 package" FORCE)
if(NOT TARGET torch::cudart)
  # The CUDA runtime wheel's headers and library (c10_cuda's interface needs them).
  file(GLOB _sheaf_cudart_h "${CMAKE_CURRENT_LIST_DIR}/../nvidia/*/include/cuda_runtime.h")
  file(GLOB _sheaf_cudart_so "${CMAKE_CURRENT_LIST_DIR}/../nvidia/*/lib/libcudart.so.*")
  add_library(torch::cudart INTERFACE IMPORTED)
  if(_sheaf_cudart_h AND _sheaf_cudart_so)
    list(GET _sheaf_cudart_h 0 _sheaf_cudart_h)
    list(GET _sheaf_cudart_so 0 _sheaf_cudart_so)
    get_filename_component(_sheaf_cudart_h "${_sheaf_cudart_h}" DIRECTORY)
    set_target_properties(torch::cudart PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_sheaf_cudart_h}"
                                                   INTERFACE_LINK_LIBRARIES "${_sheaf_cudart_so}")
  endif()
endif()
include("${_sheaf_torch_cmake}/Torch/TorchConfig.cmake")
set_property(TARGET torch_cpu APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${TORCH_INCLUDE_DIRS})
set(TORCH_LIBRARIES torch_cpu_library c10)
EOF
if cmp -s "$shim.new" "$shim"; then rm "$shim.new"; else mv "$shim.new" "$shim"; fi

torch_version=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$prefix/torch/version.py")
echo "torch2-test: LibTorch $torch_version (PyPI torch==$version, CPU only) from $prefix"

# ---- Build the tests and sheaf-bench (its bench-set-* entries run every
# workload with the set's systems, small: under ASan+UBSan too) and run them.
# The examples are left out: their ctest entries are the README stage's.
launcher=()
if command -v ccache >/dev/null; then
  # pch_defines,time_macros: else ccache caches no file built with sheaf-tests' precompiled header.
  export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache} CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1 \
    CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$build"
cmake -S . -B "$build" "${build_type[@]}" "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix/torch" -DTorch_DIR="$prefix/sheaf-cmake" \
  -DSHEAF_BUILD_TESTS=ON -DSHEAF_BUILD_EXAMPLES=OFF -DSHEAF_BUILD_BENCH=ON >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs" "$@"
echo "torch2-test: LibTorch $torch_version${flavour:+ (ASan+UBSan)} passed in $((SECONDS - start)) s"
