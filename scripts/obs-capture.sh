#!/usr/bin/env bash
# Capture the README's `vramswap status` screen and a trace from a real run.
#
#   device: run(command="bash scripts/obs-capture.sh", carry=[".devdeps"])   (after device-run.sh built build/device)
#   here:   BUILD=build/plain VRAMSWAP_BACKEND=host bash scripts/obs-capture.sh
#
# Starts vramswapd in the foreground with a metrics port, runs three session_worker processes
# whose memory together is ~1.8x the pool (MIB_EACH, POOL), records a trace for the whole run,
# and takes `vramswap status` (text and JSON) and a metrics scrape while they take turns.
# Writes status.txt, status.json, metrics.txt, trace.json, run.log under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vramswap-obs-out}
BUILD=${BUILD:-build/device}
mkdir -p "$OUT"
prefix=$PWD/.devdeps/root
[ -d "$prefix" ] && export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export VRAMSWAP_RUNTIME_DIR=$(mktemp -d /tmp/vso-XXXXXX) VRAMSWAP_SHM_PREFIX=obs- VRAMSWAP_LOG=${VRAMSWAP_LOG:-info}
if [ "${VRAMSWAP_BACKEND:-}" = host ]; then
  export VRAMSWAP_HOST_DEVICE_MEMORY=${VRAMSWAP_HOST_DEVICE_MEMORY:-512MiB} VRAMSWAP_FRAME_SIZE=${VRAMSWAP_FRAME_SIZE:-2MiB}
  POOL=${POOL:-256MiB}; MIB_EACH=${MIB_EACH:-150}; HOLD_MS=${HOLD_MS:-800}
else
  POOL=${POOL:-16GiB}; MIB_EACH=${MIB_EACH:-9500}; HOLD_MS=${HOLD_MS:-1500}  # 1.74x the pool; pinned host memory stays well under 128 GiB
fi
ROUNDS=${ROUNDS:-3}
"$BUILD/vramswapd" --foreground --pool-size "$POOL" --metrics-port 0 2>"$OUT/run.log" &
server=$!
for i in $(seq 100); do ls "$VRAMSWAP_RUNTIME_DIR"/${VRAMSWAP_SHM_PREFIX}vramswap-*-pool-* >/dev/null 2>&1 && break; sleep 0.1; done
"$BUILD/vramswap" trace --out "$OUT/trace.json" 2>>"$OUT/run.log" &
tracer=$!
sleep 0.3
workers=()
for i in 1 2 3; do
  "$BUILD/tests/cpp_api/session_worker" $((MIB_EACH * 1024 * 1024)) "$ROUNDS" "$i" "$HOLD_MS" >>"$OUT/run.log" 2>&1 &
  workers+=($!)
  sleep 0.2
done
sleep $(( (HOLD_MS * 3) / 1000 + 1 ))
"$BUILD/vramswap" status | tee "$OUT/status.txt"
"$BUILD/vramswap" status --json >"$OUT/status.json"
port=$(python3 -c "import json; print(json.load(open('$OUT/status.json'))['devices'][0]['metrics_port'])")
curl -s "http://127.0.0.1:$port/metrics" >"$OUT/metrics.txt" || python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" >"$OUT/metrics.txt"
rc=0
for w in "${workers[@]}"; do wait "$w" || rc=1; done
sleep 0.2
kill -INT "$tracer"; wait "$tracer"
kill -TERM "$server"; wait "$server"
rm -rf "$VRAMSWAP_RUNTIME_DIR"  # the segments are in it
python3 tests/cli/json_check.py trace "$OUT/trace.json" "${workers[@]}" | tee -a "$OUT/run.log"
echo "obs-capture: workers $([ $rc = 0 ] && echo ok || echo FAILED); files in $OUT"
exit $rc
