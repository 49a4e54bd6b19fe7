#!/usr/bin/env bash
# On the GPU machine, in one go: record the machine's facts, build, run every test suite
# (the cuda backend's included) and the benchmarks, with logs under $OUT.
#
#   here:   bash scripts/fetch-device-deps.sh            (once; fills .devdeps/)
#   device: run(command="bash scripts/device-run.sh [tests|tests:gpu] [bench[:name,name]]", carry=[".devdeps"])
#
# tests:oversub runs only the oversubscription suites (oversubscription_test on cuda and
# tests/gpu/preload_test); VRAMSWAP_BENCH_PARTS=kernel,torch,torch_fused,reclaim picks sections of
# bench:oversubscribe.
# build:python (with bench:<a Python benchmark>) builds only the Python package, not the tree.
# With no argument it does both; bench:handoff,pager runs only bench_handoff and bench_pager
# (bench/python/bench_<name>.py count as benchmarks too: bench:torch; BENCH_ARGS_<name>="..." passes
# arguments to one, C++ or Python, e.g. BENCH_ARGS_models="--steps 500", BENCH_ARGS_handoff="--processes 3,5 --sizes 16"). Exit status: that of the test suites. $OUT gets at most
# 8 files (the device tool's limit): machine.txt, build.log, ctest.log, gpu-tests.log,
# wheel.log, bench.err and one bench_<name>.md per benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vramswap-device-out}
mkdir -p "$OUT"
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
what=${*:-tests bench}

# --- facts, for the logs and for the next session --------------------------------------
{
  date -u
  uname -a
  nvidia-smi --query-gpu=name,uuid,memory.total,memory.free,driver_version --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  g++ --version | head -1
  cmake --version | head -1
  ninja --version
  python3 --version
  echo "boost: $(ls -d /usr/include/boost 2>&1) $(grep -m1 'define BOOST_LIB_VERSION' /usr/include/boost/version.hpp 2>&1)"
  echo "gtest headers: $(ls -d /usr/include/gtest 2>&1); libs: $(ls /usr/lib/x86_64-linux-gnu/libgtest* 2>&1 | tr '\n' ' ')"
  echo "liburing (system): $(ls /usr/lib/x86_64-linux-gnu/liburing* 2>&1 | tr '\n' ' ')"
  free -g | head -2
  df -h . /tmp | tail -2
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# --- carried packages ---------------------------------------------------------------------
prefix=$PWD/.devdeps/root
if compgen -G ".devdeps/*.deb" >/dev/null; then
  mkdir -p "$prefix"
  for deb in .devdeps/*.deb; do dpkg -x "$deb" "$prefix"; done
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  echo "device-run: no .devdeps/*.deb carried (run scripts/fetch-device-deps.sh here and carry .devdeps)" >&2
fi

# pytest for the Python suites (vramswap.torch's included), from the carried wheels.
if ! python3 -c "import pytest" 2>/dev/null && compgen -G ".devdeps/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --find-links .devdeps/wheels pytest >/dev/null 2>&1 ||
    echo "device-run: installing pytest from .devdeps/wheels failed" >&2
fi

# torch_memory_saver, what bench_sleep_wake.py measures vramswap's sleep and wake beside.
if ! python3 -c "import torch_memory_saver" 2>/dev/null && compgen -G ".devdeps/wheels/torch_memory_saver-*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps .devdeps/wheels/torch_memory_saver-*.whl >/dev/null 2>&1 ||
    echo "device-run: installing torch_memory_saver from .devdeps/wheels failed" >&2
fi

# --- build --------------------------------------------------------------------------------
build=build/device
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVRAMSWAP_WERROR=ON \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 2; }
grep -E "^-- vramswap" "$OUT/build.log"
# build:python builds only what the Python benchmarks use (the module, which brings vramswapd,
# the CLI and the shim into the package): a fraction of the whole tree's build time.
targets=()
if [[ $what == *build:python* ]]; then
  targets=(--target vramswap_python)
  what=${what//build:python/}
fi
cmake --build "$build" -j "$(nproc)" "${targets[@]}" >>"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 2; }

status=0
# tests:restart: restarts of vramswapd under running jobs, the backend facts they rest on,
# and the pods that share a pool.
if [[ $what == *tests:restart* ]]; then
  : >"$OUT/gpu-tests.log"
  echo "=== backend_conformance_test (cuda)" >>"$OUT/gpu-tests.log"
  "$build/tests/core/backend_conformance_test" --gtest_filter='*cuda*' >>"$OUT/gpu-tests.log" 2>&1 || status=1
  for t in server/restart_test pods/pods_test; do
    echo "=== ${t#*/} (cuda)" >>"$OUT/gpu-tests.log"
    VRAMSWAP_TEST_BACKEND=cuda "$build/tests/$t" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  done
  grep -E "^===|\[  (PASSED|FAILED|SKIPPED) |^\[ *(OK|FAILED) " "$OUT/gpu-tests.log" | head -60
  what=${what//tests:restart/}
fi
# wheel: the manylinux wheel built here for this machine's python3, from the carried build
# tools (.devdeps/wheeltools), installed into a fresh venv and used there (tests/wheel).
if [[ $what == *wheel* ]]; then
  # The system's python3 where it has its headers (python3-dev), else the first python3 on PATH.
  has_headers='import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
  py=/usr/bin/python3
  "$py" -c "$has_headers" 2>/dev/null || py=$(command -v python3)
  export VRAMSWAP_WHEEL_FIND_LINKS=$PWD/.devdeps/wheeltools VRAMSWAP_WHEEL_PYTHON=${VRAMSWAP_WHEEL_PYTHON:-$py}
  {
    echo "=== python: $("$VRAMSWAP_WHEEL_PYTHON" --version 2>&1), ensurepip: $("$VRAMSWAP_WHEEL_PYTHON" -c 'import ensurepip; print("yes")' 2>&1 | tail -1)"
    echo "=== scripts/build-wheel.sh"
    CMAKE_PREFIX_PATH=$prefix/usr bash scripts/build-wheel.sh >"$build/wheel.path" && wheel=$(tail -n 1 "$build/wheel.path") &&
      echo "=== tests/wheel/wheel_test.sh $wheel" &&
      VRAMSWAP_WHEEL=$wheel bash tests/wheel/wheel_test.sh "$PWD" "$build/wheel-check" && echo "wheel: PASSED"
  } >"$OUT/wheel.log" 2>&1 || { echo "wheel: FAILED"; status=1; }
  grep -E "^===|wheel_test|wheel: |build-wheel: done|manylinux" "$OUT/wheel.log" | head -40
  what=${what//wheel/}
fi
# tests:vmm: the raw VMM program on the real driver, alone and under the shim.
if [[ $what == *tests:vmm* ]]; then
  : >"$OUT/gpu-tests.log"
  bash scripts/device-vmm.sh "$build" || status=1
  what=${what//tests:vmm/}
fi
# tests:oversub: only oversubscription: the multi-process suite on cuda and the
# preload shim's GPU suite.
if [[ $what == *tests:oversub* ]]; then
  : >"$OUT/gpu-tests.log"
  echo "=== oversubscription_test (cuda)" >>"$OUT/gpu-tests.log"
  VRAMSWAP_TEST_BACKEND=cuda "$build/tests/cpp_api/oversubscription_test" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  echo "=== preload_test" >>"$OUT/gpu-tests.log"
  "$build/tests/gpu/preload_test" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  grep -E "^===|\[  (PASSED|FAILED|SKIPPED) |^(job|user|torch): |Failure|wrong" "$OUT/gpu-tests.log" | head -60
  what=${what//tests:oversub/}
fi
if [[ $what == *tests* ]]; then
  # tests:gpu runs only the suites below (the GPU ones), not the whole ctest.
  if [[ $what != *tests:gpu* ]]; then
    # The Python suites run below, verbosely and alone (they load the GPU).
    VRAMSWAP_LOG=warn ctest --test-dir "$build" --output-on-failure -j 4 --timeout 600 -E '^python_tests$' >"$OUT/ctest.log" 2>&1 || status=$?
    grep -E "tests passed|tests failed|\*\*\*Failed|Failed  |\(Failed\)" "$OUT/ctest.log" | tail -30
  fi
  # The suites that exercise the GPU, verbosely, for the record: the cuda halves of the
  # parameterized suites and everything in tests/gpu/.
  : >"$OUT/gpu-tests.log"
  for t in "$build"/tests/core/backend_conformance_test "$build"/tests/core/pager_test "$build"/tests/core/pager_faults_test \
           "$build"/tests/core/pager_evict_frames_test "$build"/tests/core/pager_remap_test; do
    echo "=== $(basename "$t") (cuda)" >>"$OUT/gpu-tests.log"
    "$t" --gtest_filter='*cuda*' >>"$OUT/gpu-tests.log" 2>&1 || status=1
  done
  # The multi-process time-sharing and oversubscription suites again, on the cuda backend.
  echo "=== time_sharing_test (cuda)" >>"$OUT/gpu-tests.log"
  VRAMSWAP_TEST_BACKEND=cuda "$build/tests/cpp_api/time_sharing_test" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  echo "=== oversubscription_test (cuda)" >>"$OUT/gpu-tests.log"
  VRAMSWAP_TEST_BACKEND=cuda "$build/tests/cpp_api/oversubscription_test" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  # Restarts of vramswapd under running jobs: the next server takes the frames from the
  # descriptors the jobs kept, every byte checked.
  echo "=== restart_test (cuda)" >>"$OUT/gpu-tests.log"
  VRAMSWAP_TEST_BACKEND=cuda "$build/tests/server/restart_test" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  # Two "pods" (own PID, mount, IPC, UTS namespaces and uids; only the runtime dir shared)
  # taking turns on the GPU through the pool server.
  echo "=== pods_test (cuda)" >>"$OUT/gpu-tests.log"
  VRAMSWAP_TEST_BACKEND=cuda "$build/tests/pods/pods_test" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  for t in "$build"/tests/gpu/*_test; do
    [[ -x $t ]] || continue
    echo "=== $(basename "$t")" >>"$OUT/gpu-tests.log"
    "$t" >>"$OUT/gpu-tests.log" 2>&1 || status=1
  done
  # examples/train_loop: two copies at once on the cuda backend, taking turns a step at a
  # time. Each writes its own file in the build tree (two writers of one file interleave),
  # appended to gpu-tests.log once both are done.
  if [[ -x $build/examples/vramswap_train_loop ]]; then
    echo "=== train_loop (2 copies at once, cuda)" >>"$OUT/gpu-tests.log"
    pids=()
    for i in 1 2; do
      # A private, small pool that goes soon after: the default pool would hold nearly all of
      # the GPU's memory for a minute, starving the plain-PyTorch references below.
      VRAMSWAP_BACKEND=cuda VRAMSWAP_SHM_PREFIX="vstrain$$-" VRAMSWAP_POOL_SIZE=4GiB VRAMSWAP_POOL_IDLE_EXIT=2 \
        "$build/examples/vramswap_train_loop" 200 >"$build/train_loop.$i.log" 2>&1 &
      pids+=($!)
    done
    for i in 1 2; do
      wait "${pids[i - 1]}" || status=1
      cat "$build/train_loop.$i.log" >>"$OUT/gpu-tests.log"
    done
  fi
  # The Python suites, vramswap.torch on the GPU included (torch.compile, CUDA graphs, the
  # 3-process example at small sizes), then the PyTorch example at its full defaults:
  # 3 processes x 6 GiB against a 9 GiB pool, bit-exact against solo runs.
  echo "=== pytest tests/python" >>"$OUT/gpu-tests.log"
  PYTHONPATH=$PWD/$build/python VRAMSWAP_TEST_SERVER=$PWD/$build/vramswapd VRAMSWAP_LOG=warn \
    python3 -m pytest -v -rs -p no:cacheprovider tests/python >>"$OUT/gpu-tests.log" 2>&1 || status=1
  echo "=== examples/torch_time_sharing.py (3 x 6 GiB, pool 9 GiB)" >>"$OUT/gpu-tests.log"
  PYTHONPATH=$PWD/$build/python VRAMSWAP_SERVER=$PWD/$build/vramswapd VRAMSWAP_LOG=warn \
    VRAMSWAP_SHM_PREFIX="vsdemo$$-" VRAMSWAP_POOL_IDLE_EXIT=5 \
    python3 examples/torch_time_sharing.py >>"$OUT/gpu-tests.log" 2>&1 || status=1
  grep -E "^===|\[  (PASSED|FAILED|SKIPPED) |\[ info|^train_loop\[[0-9]+\]: (OK|FAILED)|PASSED|FAILED|SKIPPED|RESULT|^\| |x the pool|passed|failed" "$OUT/gpu-tests.log"
fi
if [[ $what == *bench* ]]; then
  only=""
  [[ $what =~ bench:([a-z_,]+) ]] && only=",${BASH_REMATCH[1]},"
  for b in "$build"/bench/*/bench_*; do
    [[ -x $b ]] || continue
    name=$(basename "$b")
    [[ -z $only || $only == *",${name#bench_},"* ]] || continue
    echo "== $name"
    args_var=BENCH_ARGS_${name#bench_}
    # shellcheck disable=SC2086  # the arguments are words on purpose
    "$b" ${!args_var:-} >"$OUT/$name.md" 2>>"$OUT/bench.err" || { echo "$name failed"; tail -5 "$OUT/bench.err"; status=1; }
    cat "$OUT/$name.md"
  done
  # Python benchmarks (bench/python/bench_<name>.py), run with the build's package.
  for b in bench/python/bench_*.py; do
    name=$(basename "$b" .py)
    [[ -z $only || $only == *",${name#bench_},"* ]] || continue
    echo "== $name"
    args_var=BENCH_ARGS_${name#bench_}
    # shellcheck disable=SC2086  # the arguments are words on purpose
    VRAMSWAP_BUILD_DIR=$PWD/$build PYTHONPATH=$PWD/$build/python VRAMSWAP_SERVER=$PWD/$build/vramswapd VRAMSWAP_LOG=warn \
      VRAMSWAP_SHM_PREFIX="vsbench$$-" \
      python3 "$b" ${!args_var:-} >"$OUT/$name.md" 2>>"$OUT/bench.err" || { echo "$name failed"; tail -5 "$OUT/bench.err"; status=1; }
    cat "$OUT/$name.md"
  done
fi
exit $status
