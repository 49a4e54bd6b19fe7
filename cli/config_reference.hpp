// config_reference: every VRAMSWAP_* setting as a reader needs it, from the one options table
// (core/options.hpp), for `vramswap config`.
//
//   reference (--markdown)  the configuration reference: each option's variable, default, what
//                           it accepts and what it does, then the variables other parts of
//                           vramswap read. docs/configuration.md is this text, and a test
//                           (tests/cli/config_reference_test.sh) fails when they differ, so the
//                           page cannot drift from the code.
//   settings                this environment's effective settings: each option's value and
//                           where it came from (the environment or the default), a bad value
//                           marked with what is wrong with it.
#pragma once

#include <string>

namespace vramswap::detail {

std::string render_configuration_reference();

// *all_valid: false when some value is not accepted (the text says which and why).
std::string render_effective_settings(bool* all_valid);

}  // namespace vramswap::detail
