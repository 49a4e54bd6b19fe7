#!/usr/bin/env bash
# On the GPU machine: tests/preload/vmm_program on the real driver, alone and under the
# preload shim (normal priority; oversubscribed while a lock user takes its frames), every
# byte checked by the program itself. Called by scripts/device-run.sh (tests:vmm) with the
# build directory; appends to $OUT/gpu-tests.log and returns non-zero on any failure.
set -uo pipefail
build=$1
log=${OUT:-/tmp}/gpu-tests.log
prog=$build/tests/preload/vmm_program
shim=$build/libvramswap_preload.so
status=0
common=(VRAMSWAP_LOG=info VRAMSWAP_POOL_IDLE_EXIT=2 VRAMSWAP_SHM_PREFIX="vsvmm$$-")
sig=$(mktemp -u /tmp/vmm-signal.XXXXXX)
say() { echo "$*" | tee -a "$log"; }
for lookup in proc dlsym; do
  rm -f "$sig"; touch "$sig"
  env "${common[@]}" "$prog" --lookup=$lookup 64 "$sig" 7 >>"$log" 2>&1 && say "vmm: alone ($lookup): ok" || { say "vmm: alone ($lookup): FAILED"; status=1; }
  rm -f "$sig"; touch "$sig"
  env "${common[@]}" VRAMSWAP_POOL_SIZE=4GiB LD_PRELOAD="$shim" "$prog" --lookup=$lookup 64 "$sig" 8 >>"$log" 2>&1 &&
    say "vmm: under the shim, normal priority ($lookup): ok" || { say "vmm: under the shim, normal priority ($lookup): FAILED"; status=1; }
done
# Oversubscribed: 3 GiB of granules on a 4 GiB pool, then a lock user of 3 GiB (plain_cuda,
# normal priority under the shim, its words checked) takes most of the frames; the program
# checks its bytes after.
rm -f "$sig"
out=$(mktemp)
env "${common[@]}" VRAMSWAP_POOL_SIZE=4GiB VRAMSWAP_OVERSUBSCRIBE=1 LD_PRELOAD="$shim" "$prog" --lookup=proc 1536 "$sig" 9 >"$out" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q '^written' "$out" && break; sleep 0.1; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee -a "$log"
say "vmm: job $job charged by the driver: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$job '$1==p{print $2}') MiB (3072 MiB of VMM memory in the pool)"
env "${common[@]}" VRAMSWAP_POOL_SIZE=4GiB LD_PRELOAD="$shim" "$build/examples/vramswap_plain_cuda" 3GiB 1 >>"$log" 2>&1 &&
  say "vmm: lock user (3 GiB, words checked): ok" || { say "vmm: lock user: FAILED"; status=1; }
touch "$sig"
wait $job && say "vmm: oversubscribed VMM program, every byte after the lock user: ok" || { say "vmm: oversubscribed VMM program: FAILED"; status=1; }
cat "$out" >>"$log"
grep -E "moved to host frames|at exit" "$out" | tee -a "$log"
rm -f "$out" "$sig"
exit $status
