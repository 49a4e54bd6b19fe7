#!/usr/bin/env bash
# The README's second command (and CI's, through .ci/run): install what is missing, build
# with -Werror and AddressSanitizer + UndefinedBehaviorSanitizer, run every test suite.
# GPU suites skip, saying why, where no GPU is usable; scripts/device-run.sh runs them on one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

build=build/test
jobs=$(nproc)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DVRAMSWAP_WERROR=ON -DVRAMSWAP_SANITIZE=ON \
  -DVRAMSWAP_GPU_KERNELS=OFF -DVRAMSWAP_BUILD_BENCH=ON
cmake --build "$build" -j "$jobs"

# detect_leaks: the host backend's worker threads and CUDA keep process-lifetime state.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export VRAMSWAP_LOG="${VRAMSWAP_LOG:-warn}"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 600
