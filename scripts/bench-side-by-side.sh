#!/usr/bin/env bash
# Two commits' benchmarks side by side on one GPU machine, in one device call, so that a
# change's effect on the lock, the pager and the handoff is read against its own baseline
# rather than against another card's numbers.
#
#   here:   bash scripts/bench-side-by-side.sh --pack <base commit> [<new commit, default HEAD>]
#           (writes build/side/base-src.tar.gz and new-src.tar.gz with git archive)
#   device: run(command="bash scripts/bench-side-by-side.sh", carry=[".devdeps", "build/side"])
#
# On the device both are built (the benchmarks and vramswapd only, in parallel), then each
# benchmark runs for base and new in turn: bench_lock, bench_pager (1 and 8 GiB; 2 and 32 MiB
# frames), bench_handoff (2 x 16 GiB). $OUT gets the two build logs and one file per
# benchmark and build (8 files, the device tool's limit).
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --pack ]]; then
  [[ -n ${2:-} ]] || { echo "usage: $0 --pack <base commit> [<new commit>]" >&2; exit 64; }
  mkdir -p build/side
  git archive --format=tar.gz -o build/side/base-src.tar.gz "$2" && git archive --format=tar.gz -o build/side/new-src.tar.gz "${3:-HEAD}" ||
    exit 1
  echo "build/side: base $(git rev-parse --short "$2"), new $(git rev-parse --short "${3:-HEAD}")"
  exit 0
fi
for f in build/side/base-src.tar.gz build/side/new-src.tar.gz; do
  [[ -f $f ]] || { echo "$0: $f is missing: run '$0 --pack <base commit>' first and carry build/side" >&2; exit 64; }
done
OUT=${OUT:-/tmp/side-out}
mkdir -p "$OUT"
prefix=$PWD/.devdeps/root
mkdir -p "$prefix"
for deb in .devdeps/*.deb; do dpkg -x "$deb" "$prefix"; done
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
work=/tmp/side
mkdir -p "$work/base" "$work/new"
tar xzf build/side/base-src.tar.gz -C "$work/base" && tar xzf build/side/new-src.tar.gz -C "$work/new" || exit 1
build() {
  cmake -S "$work/$1" -B "$work/$1/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVRAMSWAP_WERROR=ON \
    -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_CUDA_ARCHITECTURES=90 -DVRAMSWAP_BUILD_TESTS=OFF -DVRAMSWAP_BUILD_PYTHON=OFF \
    -DVRAMSWAP_BUILD_EXAMPLES=OFF &&
    cmake --build "$work/$1/build" -j "$(($(nproc) / 2))" --target bench_pager bench_lock bench_handoff vramswapd
}
build base >"$OUT/base-build.log" 2>&1 &
build new >"$OUT/new-build.log" 2>&1 &
wait
for b in base new; do
  [[ -x $work/$b/build/bench/lock/bench_lock ]] || { echo "$b did not build:"; tail -20 "$OUT/$b-build.log"; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in base new; do
  echo "== $b: bench_lock"
  timeout 120 "$work/$b/build/bench/lock/bench_lock" >"$OUT/$b-lock.md" 2>&1
  grep "vramswap device_lock" "$OUT/$b-lock.md"
done
for b in base new; do
  echo "== $b: bench_pager --sizes 1,8 --frames 2,32"
  timeout 200 "$work/$b/build/bench/core/bench_pager" --sizes 1,8 --frames 2,32 >"$OUT/$b-pager.md" 2>&1
  grep "^| [0-9]" "$OUT/$b-pager.md"
done
for b in base new; do
  echo "== $b: bench_handoff --sizes 16 --processes 2"
  timeout 200 "$work/$b/build/bench/cpp_api/bench_handoff" --sizes 16 --processes 2 >"$OUT/$b-handoff.md" 2>&1
  grep -E "^\| [0-9]|pinned one-way|Both fit" "$OUT/$b-handoff.md"
done
