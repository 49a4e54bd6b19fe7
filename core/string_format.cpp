#include "core/string_format.hpp"

#include <cstdarg>
#include <cstdio>

namespace vramswap::detail {

std::string string_format(const char* format, ...) {
  char small[256];
  va_list ap;
  va_start(ap, format);
  va_list again;
  va_copy(again, ap);
  const int n = std::vsnprintf(small, sizeof small, format, ap);
  va_end(ap);
  std::string out;
  if (n < 0) {
    out = "(unformattable text)";
  } else if (static_cast<size_t>(n) < sizeof small) {
    out.assign(small, static_cast<size_t>(n));
  } else {
    out.resize(static_cast<size_t>(n));
    std::vsnprintf(out.data(), out.size() + 1, format, again);
  }
  va_end(again);
  return out;
}

}  // namespace vramswap::detail
