#!/usr/bin/env bash
# Installs what building and testing vramswap needs on Debian 12 (or Ubuntu): compilers,
# CMake, Ninja, GoogleTest, Boost headers, liburing, and the header-only CLI11 and
# nlohmann/json that the `vramswap` command is built with (cli/CMakeLists.txt). Idempotent: installs only what is
# missing, so a second run is quick. Run as root (or with sudo available).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libgtest-dev libboost-dev liburing-dev libcli11-dev nlohmann-json3-dev
  python3 python3-dev python3-venv)
# tests/slurm runs real munged, slurmctld and slurmd (with a private config; the packages'
# own services are not used).
packages+=(slurmd slurmctld slurm-client munge)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "vramswap: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Python side: Debian's pip is "externally managed" (PEP 668), so pybind11, scikit-build-core,
# pytest and kubernetes-validate (which bundles the Kubernetes object schemas, for the
# offline check of deploy/kubernetes/ in tests/deploy) go into a virtual environment of the
# build tree, made with Debian's python3 (whose headers python3-dev installed).
# scripts/test.sh uses it; `pip install .` needs none of it.
venv=build/venv
python=/usr/bin/python3
[[ -x $python ]] || python=python3
cd "$(dirname "$0")/.."
if ! "$venv/bin/python" -c "import pybind11, pytest, scikit_build_core, kubernetes_validate" >/dev/null 2>&1; then
  echo "vramswap: making $venv (pybind11, scikit-build-core, pytest, kubernetes-validate)"
  [[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check pybind11 scikit-build-core pytest kubernetes-validate
fi

# cuda.h, where no CUDA toolkit provides it (CI: a machine without a GPU or CUDA). With it the
# cuda backend, the preload shim and the host driver emulation (tests/host_driver) are built
# and tested; libcuda itself is only ever loaded at run time. NVIDIA's runtime wheel carries
# the header (nvidia/cu13/include); pinned to the CUDA 13.0 of the GPU machine.
# scripts/test.sh passes that directory to CMake (VRAMSWAP_CUDA_INCLUDE_DIR).
cuda_wheel=nvidia-cuda-runtime==13.0.96
if [[ ! -f /usr/local/cuda/include/cuda.h ]]; then
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if [[ ! -f $site/nvidia/cu13/include/cuda.h ]]; then
    echo "vramswap: no /usr/local/cuda/include/cuda.h: installing cuda.h from $cuda_wheel into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$cuda_wheel"
  fi
fi

# promtool, for tests/deploy's checks of deploy/prometheus/ (check rules, test rules, check
# config, and the lint of a real scrape). Debian ships it only in the prometheus server
# package, whose installation would also start a Prometheus service on a systemd host: take
# promtool (one static binary) out of the package instead, into build/tools/.
tools=build/tools
if [[ ! -x $tools/promtool ]]; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "vramswap: taking promtool out of Debian's prometheus package into $tools"
  mkdir -p "$tools"
  unpack=$(mktemp -d)
  (cd "$unpack" && { apt-get download prometheus >/dev/null 2>&1 || { $sudo apt-get update -q && apt-get download prometheus; }; })
  dpkg-deb --fsys-tarfile "$unpack"/prometheus_*.deb | tar -x -C "$unpack" ./usr/bin/promtool
  mv "$unpack/usr/bin/promtool" "$tools/promtool"
  rm -rf "$unpack"
  "$tools/promtool" --version | head -1
fi
