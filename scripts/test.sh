#!/usr/bin/env bash
# The README's second command (and CI's, through .ci/run): install what is missing, build
# with -Werror and AddressSanitizer + UndefinedBehaviorSanitizer, run every test suite; then
# build the Python module in a second, unsanitized build (build/py) and run pytest.
# GPU suites skip, saying why, where no GPU is usable; scripts/device-run.sh runs them on one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

# cuda.h: the CUDA toolkit's where it is installed, else the one install-deps.sh put in the
# venv (NVIDIA's runtime wheel), so that the cuda backend and the preload shim are built and
# tested here too (tests/host_driver emulates libcuda for them).
cuda_args=()
if [[ ! -f /usr/local/cuda/include/cuda.h ]]; then
  site=$(build/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cuda_args=(-DVRAMSWAP_CUDA_INCLUDE_DIR="$site/nvidia/cu13/include")
fi

build=build/test
jobs=$(nproc)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DVRAMSWAP_WERROR=ON -DVRAMSWAP_SANITIZE=ON \
  -DVRAMSWAP_GPU_KERNELS=OFF -DVRAMSWAP_BUILD_BENCH=ON "${cuda_args[@]}"
cmake --build "$build" -j "$jobs"

# detect_leaks: the host backend's worker threads and CUDA keep process-lifetime state.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export VRAMSWAP_LOG="${VRAMSWAP_LOG:-warn}"
ctest_rc=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 600 || ctest_rc=$?

# Python: its own build without sanitizers. An ASan-instrumented extension module cannot be
# loaded into the (uninstrumented) interpreter unless libasan is LD_PRELOADed, and then ASan
# and LeakSanitizer report on CPython itself; the C++ suites above already run the same
# library code under ASan/UBSan. The venv (pybind11, pytest) comes from install-deps.sh.
py=build/py
venv=build/venv
cmake -S . -B "$py" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVRAMSWAP_WERROR=ON -DPython_EXECUTABLE="$PWD/$venv/bin/python" \
  -DVRAMSWAP_BUILD_TESTS=OFF -DVRAMSWAP_BUILD_BENCH=OFF -DVRAMSWAP_BUILD_EXAMPLES=OFF -DVRAMSWAP_GPU_KERNELS=OFF "${cuda_args[@]}"
cmake --build "$py" -j "$jobs"
pytest_rc=0
PYTHONPATH="$PWD/$py/python" VRAMSWAP_TEST_SERVER="$PWD/$py/vramswapd" \
  "$venv/bin/python" -m pytest tests/python -p no:cacheprovider -v -rs || pytest_rc=$?
if ((ctest_rc || pytest_rc)); then
  echo "vramswap: FAILED (ctest exit $ctest_rc, pytest exit $pytest_rc)" >&2
  exit 1
fi
