#include "config_reference.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

#include "core/options.hpp"
#include "core/status.hpp"

namespace vramswap::detail {
namespace {

// A table cell: '|' would end it.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

constexpr size_t k_option_count = static_cast<size_t>(option_id::count_);

}  // namespace

std::string render_configuration_reference() {
  std::string t =
      "# Configuration reference\n"
      "\n"
      "Every setting vramswap reads from the environment. The library, vramswapd and the `vramswap`\n"
      "command read them once per process; a malformed value is refused at start (a program's first\n"
      "session, vramswapd's start, each `vramswap` command), naming the variable, the value and what\n"
      "it accepts, and a misspelled `VRAMSWAP_*` name gets one warning naming the closest known one.\n"
      "An empty default means the setting is off unless set.\n"
      "`vramswap config` shows the values in effect in your environment.\n"
      "\n"
      "This page is generated from the options table (`core/options.hpp`) by\n"
      "`vramswap config --markdown > docs/configuration.md`; a test fails when it is out of date.\n"
      "\n"
      "| variable | default | accepts | what it does |\n"
      "| --- | --- | --- | --- |\n";
  for (size_t i = 0; i < k_option_count; ++i) {
    const option_id id = static_cast<option_id>(i);
    const option_desc& d = describe(id);
    const std::string def = *d.default_text == '\0' ? "(unset)" : "`" + std::string(d.default_text) + "`";
    t += "| `" + std::string(d.env_name) + "` | " + def + " | " + cell(option_accepted(id)) + " | " + cell(d.help) + " |\n";
  }
  t +=
      "\n"
      "## Read by other parts of vramswap\n"
      "\n"
      "Not settings of the library, but known names (never reported as misspelled):\n"
      "\n"
      "| variable | read by |\n"
      "| --- | --- |\n";
  size_t count = 0;
  const other_variable* others = other_variables(&count);
  for (size_t i = 0; i < count; ++i) t += "| `" + std::string(others[i].env_name) + "` | " + cell(others[i].read_by) + " |\n";
  return t;
}

std::string render_effective_settings(bool* all_valid) {
  *all_valid = true;
  size_t width = 0;
  for (size_t i = 0; i < k_option_count; ++i) width = std::max(width, std::string(describe(static_cast<option_id>(i)).env_name).size());
  std::string t;
  for (size_t i = 0; i < k_option_count; ++i) {
    const option_id id = static_cast<option_id>(i);
    const option_desc& d = describe(id);
    const std::string value = option_text(id);
    std::string line = d.env_name;
    line.resize(width + 2, ' ');
    line += (value.empty() ? std::string("(unset)") : value);
    line += option_is_default(id) ? "  (default)" : "  (environment)";
    if (option_check(id, value.c_str()) != ok) {
      *all_valid = false;
      line += "  INVALID: " + std::string(last_error());
    }
    t += line + "\n";
  }
  return t;
}

}  // namespace vramswap::detail
