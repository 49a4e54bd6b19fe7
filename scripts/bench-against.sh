#!/usr/bin/env bash
# bench_pager and bench_handoff of this tree beside those of an earlier commit, built and run
# on one machine in one run, so that their ratios can be compared without run-to-run noise.
#
#   here:   bash scripts/bench-against.sh prepare REV      (exports REV into build/against/)
#   device: run(command="bash scripts/bench-against.sh run", carry=[".devdeps", "build/against"])
#
# run builds this tree (build/device, as scripts/device-run.sh does) and REV's benchmarks,
# then alternates them for two rounds: bench_pager --sizes 8,32 --frames 32 and
# bench_handoff --sizes 16,32 --fit 0. Output: $OUT/bench_against.md (and build logs).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    rev=${2:?usage: bench-against.sh prepare REV}
    rm -rf build/against && mkdir -p build/against/src
    git archive "$rev" | tar -x -C build/against/src || exit 1
    git rev-parse --short "$rev" >build/against/rev
    echo "build/against: $(cat build/against/rev); carry it with .devdeps"
    ;;
  run)
    OUT=${OUT:-/tmp/vramswap-device-out}
    mkdir -p "$OUT"
    [[ -d build/against/src ]] || { echo "bench-against: no build/against (run prepare here, and carry it)" >&2; exit 2; }
    bash scripts/device-run.sh bench:none >"$OUT/build-head.txt" 2>&1  # builds build/device
    prefix=$PWD/.devdeps/root
    export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
    base=build/against/src
    rev=$(cat build/against/rev)
    cmake -S "$base" -B "$base/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$prefix/usr" \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DVRAMSWAP_BUILD_TESTS=OFF -DVRAMSWAP_BUILD_EXAMPLES=OFF >"$OUT/build-against.log" 2>&1 &&
      cmake --build "$base/build" -j "$(nproc)" --target bench_pager bench_handoff vramswapd >>"$OUT/build-against.log" 2>&1 ||
      { tail -20 "$OUT/build-against.log"; exit 2; }
    {
      for round in 1 2; do
        for who in head "$rev"; do
          b=build/device
          [[ $who == head ]] || b=$base/build
          echo "## round $round, $who: bench_pager --sizes 8,32 --frames 32"
          "$b/bench/core/bench_pager" --sizes 8,32 --frames 32
          echo "## round $round, $who: bench_handoff --sizes 16,32 --fit 0"
          VRAMSWAP_SERVER=$PWD/$b/vramswapd VRAMSWAP_SHM_PREFIX="vsag$round$who-" "$b/bench/cpp_api/bench_handoff" --sizes 16,32 --fit 0
        done
      done
    } >"$OUT/bench_against.md" 2>"$OUT/bench.err"
    grep -E "^## |^\| (8|16|32) GiB" "$OUT/bench_against.md"
    ;;
  *)
    echo "usage: bench-against.sh prepare REV | run" >&2
    exit 2
    ;;
esac
