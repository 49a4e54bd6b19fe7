#!/usr/bin/env bash
# Description: the configuration reference cannot drift from the code, and `vramswap config`
# says what is in effect.
#
#   config_reference_test.sh VRAMSWAP VRAMSWAPD SOURCE_DIR
#
# 1. docs/configuration.md is exactly `vramswap config --markdown` (the options table's text);
# 2. `vramswap config` shows a value set in the environment as such, the default as such, and a
#    bad value as INVALID with exit 1;
# 3. `vramswap --version` and `vramswapd --version` print the version of version.hpp.
set -uo pipefail
cli=$1 daemon=$2 source=$3
fail() {
  echo "config_reference_test: FAILED: $*" >&2
  exit 1
}
clean_env=(env -u VRAMSWAP_FRAME_SIZE -u VRAMSWAP_EVICT_TIMEOUT VRAMSWAP_LOG=warn)

if ! diff -u "$source/docs/configuration.md" <("${clean_env[@]}" "$cli" config --markdown); then
  fail "docs/configuration.md differs from the options table (above): regenerate it with
  $cli config --markdown > docs/configuration.md"
fi
rows=$(grep -c '^| `VRAMSWAP_' "$source/docs/configuration.md")
options=$(grep -c '^  X(' "$source/core/options.hpp")
((rows >= options)) || fail "docs/configuration.md has $rows variables, the options table $options"

out=$("${clean_env[@]}" VRAMSWAP_EVICT_TIMEOUT=45 "$cli" config) || fail "vramswap config with good settings exited $?"
grep -qE '^VRAMSWAP_EVICT_TIMEOUT +45  \(environment\)$' <<<"$out" || fail "the set value is not shown as from the environment:
$(grep EVICT_TIMEOUT <<<"$out")"
grep -qE '^VRAMSWAP_FRAME_SIZE +32MiB  \(default\)$' <<<"$out" || fail "the default is not shown as the default:
$(grep FRAME_SIZE <<<"$out")"
bad=$("${clean_env[@]}" VRAMSWAP_FRAME_SIZE=abc "$cli" config)
rc=$?
((rc == 1)) || fail "vramswap config with a bad value exited $rc, not 1"
grep -q '^VRAMSWAP_FRAME_SIZE .*abc  (environment)  INVALID: VRAMSWAP_FRAME_SIZE="abc" is not a size' <<<"$bad" ||
  fail "the bad value is not marked with what is wrong: $(grep FRAME_SIZE <<<"$bad")"

version=$(sed -n 's/^#define VRAMSWAP_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' "$source/cpp_api/include/vramswap/version.hpp" | paste -sd.)
[[ $("$cli" --version) == "vramswap $version" ]] || fail "vramswap --version printed '$("$cli" --version)', not 'vramswap $version'"
[[ $("$daemon" --version) == "vramswapd $version" ]] || fail "vramswapd --version printed '$("$daemon" --version)', not 'vramswapd $version'"
echo "config_reference_test: docs/configuration.md matches the options table ($rows variables); config and --version answer as they should"
