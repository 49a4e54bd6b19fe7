#include "core/log.hpp"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "core/options.hpp"

namespace vramswap {
namespace {

log_level read_level() noexcept {
  try {
    const std::string text = option_text(option_id::log_level);
    if (text == "error") return log_level::error;
    if (text == "warn") return log_level::warn;
    if (text == "info") return log_level::info;
    if (text == "debug") return log_level::debug;
    std::fprintf(stderr, "vramswap[%d]: warn: VRAMSWAP_LOG=\"%s\" is not one of error|warn|info|debug; using info\n",
                 static_cast<int>(getpid()), text.c_str());
  } catch (...) {
  }
  return log_level::info;
}

log_level current_level() noexcept {
  static const log_level level = read_level();
  return level;
}

const char* level_name(log_level level) noexcept {
  switch (level) {
    case log_level::error: return "error";
    case log_level::warn: return "warn";
    case log_level::info: return "info";
    case log_level::debug: return "debug";
  }
  return "?";
}

}  // namespace

bool log_enabled(log_level level) noexcept { return level <= current_level(); }

void log(log_level level, const char* fmt, ...) noexcept {
  if (!log_enabled(level)) return;
  char line[1200];
  int n = std::snprintf(line, sizeof line, "vramswap[%d]: %s: ", static_cast<int>(getpid()), level_name(level));
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line + n, sizeof line - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  const size_t len = std::strlen(line);
  line[len] = '\n';
  // One write(2) per line so that lines from several processes do not interleave.
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line, len + 1);
}

}  // namespace vramswap
