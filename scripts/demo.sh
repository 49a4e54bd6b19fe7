#!/usr/bin/env bash
# The README's first command: install what is missing, build, run the demo: several
# processes whose memory does not fit on the device together take turns on it, with a
# timeline of who held it and what moved. Arguments go to the demo
# ([processes] [MiB each] [turns]). Uses the cuda backend where a GPU is usable, else the
# host emulation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build/demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DVRAMSWAP_BUILD_TESTS=OFF -DVRAMSWAP_GPU_KERNELS=OFF >/dev/null
cmake --build build/demo --target vramswap_time_sharing_demo
./build/demo/examples/vramswap_time_sharing_demo "$@"
