// Changing VRAMSWAP_* variables inside a test process. The options read the environment
// once per process, so every change made here is followed by the options' test-only re-read;
// a spawned child (a client, vramswapd) reads its own environment at its start anyway.
#pragma once

#include <cstdlib>

#include "core/options.hpp"

namespace vramswap::detail::test {

inline void set_env(const char* name, const char* value) {
  ::setenv(name, value, 1);
  options_reread_for_testing();
}

inline void unset_env(const char* name) {
  ::unsetenv(name);
  options_reread_for_testing();
}

}  // namespace vramswap::detail::test
