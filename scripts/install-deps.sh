#!/usr/bin/env bash
# Installs what building and testing vramswap needs on Debian 12 (or Ubuntu): compilers,
# CMake, Ninja, GoogleTest, Boost headers, liburing. Idempotent: installs only what is
# missing, so a second run is quick. Run as root (or with sudo available).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libgtest-dev libboost-dev liburing-dev python3 python3-dev python3-venv)
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
