#!/usr/bin/env bash
# The wheel, installed into a fresh venv and used where nothing could build it:
#
#   wheel_test.sh REPO WORK      (ctest: wheel_install)
#
# 1. The wheel: $VRAMSWAP_WHEEL when given (a wheel scripts/build-wheel.sh made), else
#    REPO/scripts/build-wheel.sh builds it.
# 2. liburing is bundled: auditwheel show, the wheel's file list (vramswap.libs/liburing-*),
#    and no ELF file in it needs the system's liburing.so.2 by that name.
# 3. A fresh venv (python3 -m venv, nothing but pip) gets it with pip install --no-index:
#    no build backend, no download, no compiler can take part.
# 4. ldd of each installed binary: liburing resolves to the bundled copy.
# 5. wheel_check.py runs in that venv under env -i with PATH=<venv>/bin alone, inside a
#    private mount namespace (unshare -m, where the kernel allows it) in which /usr/include
#    (Boost's and liburing's headers), /usr/lib/gcc (the compilers' back ends), CMake's
#    modules and the system's liburing.so* are hidden: the commands, the module, the
#    on-demand vramswapd and vramswap.status() must work there.
# Exit 77 (ctest: skipped) only for a missing prerequisite, printing which one.
set -euo pipefail
repo=$1
work=$2
skip() { echo "wheel_test: SKIPPED: $*" >&2; exit 77; }
fail() { echo "wheel_test: FAILED: $*" >&2; exit 1; }
say() { echo "wheel_test: $*" >&2; }

[[ $(uname -s -m) == "Linux x86_64" ]] || skip "the wheel is built for Linux x86_64; this is $(uname -s -m)"
# VRAMSWAP_WHEEL_PYTHON / VRAMSWAP_WHEEL_FIND_LINKS: another interpreter, and a directory with a
# pip wheel for one without ensurepip (the GPU machine; scripts/make-venv.sh).
python=${VRAMSWAP_WHEEL_PYTHON:-/usr/bin/python3}
[[ -x $python ]] || skip "no $python (Debian's python3) to make the venvs with"
if ! "$python" -c "import venv, ensurepip" 2>/dev/null && ! compgen -G "${VRAMSWAP_WHEEL_FIND_LINKS:-/nonexistent}/pip-*.whl" >/dev/null; then
  skip "$python has no venv/ensurepip (Debian: apt-get install python3-venv)"
fi

start=$SECONDS
wheel=${VRAMSWAP_WHEEL:-}
if [[ -z $wheel ]]; then
  # build-wheel.sh installs what it needs (apt-get, PyPI); without root or the network that
  # is a missing prerequisite, not a failure of the wheel.
  if [[ $(id -u) -ne 0 ]] && ! sudo -n true 2>/dev/null; then
    for tool in c++ cmake ninja; do
      command -v $tool >/dev/null || skip "$tool is missing and scripts/install-deps.sh cannot apt-get it here (not root, no sudo)"
    done
  fi
  if ! "$repo/build/wheel/venv/bin/python" -c "import scikit_build_core, pybind11, auditwheel" 2>/dev/null; then
    "$python" -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/auditwheel/', timeout=15)" 2>/dev/null ||
      skip "PyPI is unreachable and build/wheel/venv lacks scikit-build-core, pybind11 or auditwheel"
  fi
  out=$(bash "$repo/scripts/build-wheel.sh") || fail "scripts/build-wheel.sh failed (its output is above)"
  wheel=$(tail -n 1 <<<"$out")
fi
[[ -f $wheel ]] || fail "no wheel at '$wheel'"
[[ ${wheel##*/} == *manylinux*_x86_64.whl ]] || fail "${wheel##*/} is not a manylinux wheel (was it repaired?)"
say "wheel ${wheel##*/} ($((SECONDS - start)) s to have it)"

rm -rf "$work"
mkdir -p "$work"

# 2. What the wheel holds.
listing=$("$python" -c "import sys, zipfile; print('\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))" "$wheel")
for f in vramswap/vramswap vramswap/vramswapd vramswap/__main__.py vramswap/_launch.py vramswap/_status.py vramswap/preload.py; do
  grep -qx "$f" <<<"$listing" || fail "${wheel##*/} lacks $f"
done
grep -q '^vramswap/_vramswap.*\.so$' <<<"$listing" || fail "${wheel##*/} lacks the module vramswap/_vramswap*.so"
bundled=$(grep -E '^vramswap\.libs/liburing-[^/]*\.so' <<<"$listing") || fail "${wheel##*/} carries no liburing in vramswap.libs/"
say "bundled: $bundled"
if [[ -x $repo/build/wheel/venv/bin/auditwheel ]]; then
  "$repo/build/wheel/venv/bin/auditwheel" show "$wheel" | tee "$work/auditwheel-show.txt" >&2
fi
mkdir -p "$work/unpacked"
"$python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$work/unpacked"
while IFS= read -r f; do
  [[ -f $work/unpacked/$f && $(head -c 4 "$work/unpacked/$f" | od -An -c | tr -d ' ') == 177ELF ]] || continue
  needed=$(readelf -d "$work/unpacked/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  if grep -qx 'liburing\.so\.[0-9]*' <<<"$needed"; then fail "$f still needs the system's liburing: $(tr '\n' ' ' <<<"$needed")"; fi
done <<<"$listing"

# 3. A fresh venv: pip alone; the wheel installed without an index.
venv=$work/venv
bash "$repo/scripts/make-venv.sh" "$python" "$venv" "${VRAMSWAP_WHEEL_FIND_LINKS:-}"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$wheel"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
pkg=$site/vramswap
for t in vramswap vramswapd vramswap-preload-path; do
  [[ -x $venv/bin/$t ]] || fail "pip put no console script $t into $venv/bin"
done

# 4. The installed binaries load the bundled liburing (and nothing unresolved).
for f in "$pkg/vramswap" "$pkg/vramswapd" "$pkg"/_vramswap*.so "$pkg"/libvramswap_preload.so; do
  [[ -e $f ]] || continue
  deps=$(ldd "$f")
  ! grep -q "not found" <<<"$deps" || fail "ldd ${f#"$site"/}: $deps"
  uring=$(grep liburing <<<"$deps") || fail "ldd ${f#"$site"/} shows no liburing: $deps"
  loaded=$(sed -n 's/.*=> \(.*\) (0x.*/\1/p' <<<"$uring")
  [[ -n $loaded && $(realpath "$loaded") == "$site"/vramswap.libs/liburing-* ]] ||
    fail "${f#"$site"/} loads liburing from outside the wheel: $uring"
  say "ldd ${f#"$site"/}: liburing => $(realpath "$loaded")"
done

# 5. The checks, with nothing to build with.
# 0700: the runtime dir must be private (lock/runtime_dir.cpp refuses one open to others).
mkdir -p "$work/home"
mkdir -m 700 "$work/runtime"
env_args=(env -i PATH="$venv/bin" HOME="$work/home" LANG=C.UTF-8 WHEEL_CHECK_PKG="$pkg" WHEEL_CHECK_WORK="$work"
          VRAMSWAP_LOG=warn)
hide=$(cat <<'SH'
set -e
mount -t tmpfs -o ro,size=1M none /usr/include
mount -t tmpfs -o ro,size=1M none /usr/lib/gcc
for d in /usr/share/cmake*; do [ -d "$d" ] && mount -t tmpfs -o ro,size=1M none "$d"; done
for f in /usr/lib/x86_64-linux-gnu/liburing.so*; do
  [ -e "$f" ] && [ ! -L "$f" ] && mount --bind /dev/null "$f"
done
exec "$@"
SH
)
if [[ $(id -u) -eq 0 ]] && unshare -m true 2>/dev/null; then
  say "running wheel_check.py with /usr/include, /usr/lib/gcc, CMake's modules and the system's liburing hidden (unshare -m)"
  unshare -m --propagation private sh -c "$hide" hide "${env_args[@]}" WHEEL_CHECK_HIDDEN=1 \
    "$venv/bin/python" "$(dirname "$0")/wheel_check.py" || fail "wheel_check.py (above)"
else
  say "no private mount namespace here (not root, or unshare -m refused): wheel_check.py runs with PATH=$venv/bin alone; the system's headers and liburing stay visible, ldd above showed the bundled one is used"
  "${env_args[@]}" "$venv/bin/python" "$(dirname "$0")/wheel_check.py" || fail "wheel_check.py (above)"
fi
say "OK in $((SECONDS - start)) s"
