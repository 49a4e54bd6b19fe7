#!/usr/bin/env bash
# Description: the installed package as a program outside this tree sees it. ctest runs each
# step as its own test (tests/install/CMakeLists.txt); the last two need the first (fixture).
#
#   install_test.sh install BUILD PREFIX SOURCE CMAKE CXX
#     `cmake --install BUILD --prefix PREFIX` (PREFIX emptied first). The installed CMake files
#     must name no internal target and no dependency of the library (a consumer needs neither
#     Boost nor liburing nor Threads) and no path of the source or build tree (relocatable);
#     the installed headers must pull in no header of Boost, liburing, CUDA or the source tree;
#     the systemd unit template must start PREFIX's vramswapd.
#   install_test.sh find_package PREFIX WORK CMAKE GENERATOR MAKE CXX FLAGS
#     Configure, build and run consumer/ with find_package(vramswap 0.1), finding vramswap in
#     PREFIX and nowhere else; find_package(vramswap 1.0) must fail (SameMajorVersion).
#   install_test.sh pkg_config PREFIX WORK CXX FLAGS
#     Build consumer/main.cpp with `pkg-config --cflags --libs vramswap` (PREFIX's .pc only)
#     on a plain compiler command line, and run it.
#
# FLAGS: the compiler flags of the consumer; in a sanitized build they hold the sanitizer
# flags, because a program that loads the sanitized library needs the ASan runtime first.
# Either way the consumer is built with -Wall -Wextra -Werror: the public headers must be
# clean in a strict user's build. Exit status: 0 pass, 1 fail, 77 skip (no pkg-config).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:?usage: install_test.sh install|find_package|pkg_config ...}
shift
strict="-Wall -Wextra -Werror"

fail() {
  echo "install_test $mode: FAILED: $*" >&2
  exit 1
}

# run_consumer BINARY PREFIX: runs it; libvramswap must come from PREFIX, not the build tree.
run_consumer() {
  local lib
  lib=$(ldd "$1" | awk '/libvramswap\.so/ { print $3 }')
  [[ $lib == "$2"/* ]] || fail "$1 loads libvramswap from '${lib:-nowhere}', not from $2"
  "$1" || fail "$1 exited with status $?"
}

case $mode in
install)
  build=$1 prefix=$2 source=$3 cmake=$4 cxx=$5
  rm -rf "$prefix"
  "$cmake" --install "$build" --prefix "$prefix" || fail "cmake --install $build --prefix $prefix"
  shopt -s nullglob
  cmake_files=("$prefix"/lib*/cmake/vramswap/*.cmake "$prefix"/lib/*/cmake/vramswap/*.cmake)
  ((${#cmake_files[@]} >= 4)) || fail "expected vramswap{Config,ConfigVersion,Targets,Targets-<config>}.cmake, found: ${cmake_files[*]}"
  if grep -nE 'vramswap_[a-z_]+|Boost|uring|Threads|pthread' "${cmake_files[@]}"; then
    fail "the installed CMake package names an internal target or a private dependency (above)"
  fi
  if grep -nF -e "$source" -e "$build" "${cmake_files[@]}"; then
    fail "the installed CMake package holds a path of the source or build tree (above)"
  fi
  # Every file the public headers pull in, with only PREFIX on the include path.
  deps=$(printf '#include <vramswap/vramswap.hpp>\n#include <vramswap/vramswap.h>\n' |
    "$cxx" -std=c++17 -M -I"$prefix/include" -x c++ -) || fail "the installed headers do not compile on their own"
  if tr ' \\' '\n\n' <<<"$deps" | grep -vF "$prefix/" | grep -E '/(boost|liburing|cuda)[^/]*(/|\.h)|'"$source"; then
    fail "the installed headers pull in a dependency's or the source tree's headers (above)"
  fi
  [[ -n $(find "$prefix" -name vramswap.pc) ]] || fail "no vramswap.pc under $prefix"
  # The programs: the pool server (started on demand from lib/../bin) and the command line.
  [[ -x $prefix/bin/vramswapd ]] || fail "no bin/vramswapd under $prefix"
  "$prefix/bin/vramswap" --help >/dev/null 2>&1 || fail "$prefix/bin/vramswap --help failed (missing, or it finds no libvramswap)"
  # The systemd unit template, naming the daemon where this prefix holds it.
  unit=$prefix/lib/systemd/system/vramswapd@.service
  [[ -f $unit ]] || fail "no $unit"
  grep -qxF "ExecStart=$prefix/bin/vramswapd --foreground --service --device %i" "$unit" ||
    fail "$unit does not start $prefix/bin/vramswapd: $(grep ExecStart "$unit")"
  grep -qx "Type=notify" "$unit" || fail "$unit is not Type=notify"
  doc=$(sed -n 's|^Documentation=file://||p' "$unit")
  [[ -f $doc ]] || fail "$unit points at documentation that is not installed: $doc"
  if grep -n '@[A-Za-z_]*@' "$unit"; then fail "$unit holds unfilled template variables (above)"; fi
  echo "install_test install: $prefix holds the library, the headers, both package descriptions, vramswapd, vramswap and vramswapd@.service"
  ;;

find_package)
  prefix=$1 work=$2/find_package cmake=$3 generator=$4 make=$5 cxx=$6 flags=$7
  rm -rf "$work"
  configure() {  # configure BUILD_DIR WANTED_VERSION
    "$cmake" -S "$here/consumer" -B "$1" -G "$generator" -DCMAKE_MAKE_PROGRAM="$make" -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_CXX_FLAGS="$flags $strict" -DCMAKE_PREFIX_PATH="$prefix" -DVRAMSWAP_WANTED="$2"
  }
  configure "$work/build" 0.1 || fail "configuring the consumer with find_package(vramswap 0.1)"
  found=$(sed -n 's/^vramswap_DIR:[A-Z]*=//p' "$work/build/CMakeCache.txt")
  [[ $found == "$prefix"/* ]] || fail "find_package(vramswap) found '$found', not the package in $prefix"
  "$cmake" --build "$work/build" || fail "building the consumer against vramswap::vramswap"
  run_consumer "$work/build/consumer" "$prefix"
  if configure "$work/build-1.0" 1.0 >"$work/build-1.0.log" 2>&1; then
    fail "find_package(vramswap 1.0) accepted the 0.x package in $found"
  fi
  grep -q 'compatible with requested version "1.0"' "$work/build-1.0.log" ||
    { cat "$work/build-1.0.log"; fail "find_package(vramswap 1.0) failed, but not for the version"; }
  echo "install_test find_package: consumer built with find_package(vramswap 0.1) and ran; 1.0 refused"
  ;;

pkg_config)
  prefix=$1 work=$2/pkg_config cxx=$3 flags=$4
  command -v pkg-config >/dev/null || { echo "install_test pkg_config: SKIPPED: pkg-config not found"; exit 77; }
  rm -rf "$work" && mkdir -p "$work"
  pc=$(find "$prefix" -name vramswap.pc | head -1)
  [[ -n $pc ]] || fail "no vramswap.pc under $prefix"
  # PKG_CONFIG_LIBDIR replaces the default search path: this prefix's .pc and no other.
  export PKG_CONFIG_LIBDIR=$(dirname "$pc")
  unset PKG_CONFIG_PATH
  pkg_flags=$(pkg-config --cflags --libs vramswap) || fail "pkg-config --cflags --libs vramswap"
  libdir=$(pkg-config --variable=libdir vramswap)
  [[ $libdir == "$prefix"/* && -e $libdir/libvramswap.so ]] || fail "vramswap.pc's libdir '$libdir' holds no libvramswap.so"
  # The version the .pc declares is the headers' version.
  want=$(sed -nE 's/#define VRAMSWAP_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+)/\2/p' "$prefix/include/vramswap/version.hpp" | paste -sd.)
  [[ $(pkg-config --modversion vramswap) == "$want" ]] || fail "pkg-config --modversion is $(pkg-config --modversion vramswap), the headers say $want"
  # A plain command line, as a Makefile would write it; the rpath stands in for ldconfig.
  # shellcheck disable=SC2086  # the flags are words
  (set -x; "$cxx" $flags $strict "$here/consumer/main.cpp" -o "$work/consumer" $pkg_flags -Wl,-rpath,"$libdir") ||
    fail "building the consumer with: $pkg_flags"
  run_consumer "$work/consumer" "$prefix"
  echo "install_test pkg_config: consumer built with '$pkg_flags' and ran"
  ;;

*)
  fail "unknown mode (install, find_package or pkg_config)"
  ;;
esac
