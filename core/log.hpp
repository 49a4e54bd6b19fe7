// Logging to stderr, one line per message, prefixed "vramswap[pid]: <level>: ".
// The level comes from VRAMSWAP_LOG (error | warn | info | debug), read once.
#pragma once

namespace vramswap {

enum class log_level { error = 0, warn = 1, info = 2, debug = 3 };

bool log_enabled(log_level level) noexcept;
void log(log_level level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

}  // namespace vramswap
