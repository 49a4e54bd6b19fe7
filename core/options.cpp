#include "core/options.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "core/status.hpp"

namespace vramswap {
namespace {

constexpr option_desc k_table[] = {
#define VRAMSWAP_OPTION_DESC(id, env, def, help) {env, def, help},
    VRAMSWAP_OPTIONS(VRAMSWAP_OPTION_DESC)
#undef VRAMSWAP_OPTION_DESC
};
static_assert(sizeof k_table / sizeof k_table[0] == static_cast<size_t>(option_id::count_));

std::mutex g_override_mutex;
std::optional<std::string> g_override[static_cast<size_t>(option_id::count_)];

}  // namespace

const option_desc& describe(option_id id) noexcept { return k_table[static_cast<size_t>(id)]; }

std::string option_text(option_id id) {
  {
    std::lock_guard<std::mutex> lock(g_override_mutex);
    if (const auto& o = g_override[static_cast<size_t>(id)]) return *o;
  }
  if (const char* env = std::getenv(describe(id).env_name); env != nullptr && *env != '\0') return env;
  return describe(id).default_text;
}

bool option_is_default(option_id id) {
  {
    std::lock_guard<std::mutex> lock(g_override_mutex);
    if (g_override[static_cast<size_t>(id)]) return false;
  }
  const char* env = std::getenv(describe(id).env_name);
  return env == nullptr || *env == '\0';
}

void option_set(option_id id, const char* value) {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  auto& slot = g_override[static_cast<size_t>(id)];
  if (value == nullptr) {
    slot.reset();
  } else {
    slot = value;
  }
}

int parse_size(const char* text, uint64_t* out, const char* what, uint64_t percent_base) noexcept {
  const char* accepted = percent_base != 0 ? "bytes with an optional K/M/G/T suffix (\"32MiB\", \"1.5G\") or a percentage (\"50%\")"
                                           : "bytes with an optional K/M/G/T suffix (\"32MiB\", \"1.5G\")";
  if (text == nullptr || *text == '\0') return fail(err_invalid_argument, "%s: empty value; expected %s", what, accepted);
  errno = 0;
  char* end = nullptr;
  const double number = std::strtod(text, &end);
  if (end == text || errno == ERANGE || !(number >= 0) || std::isinf(number)) {
    return fail(err_invalid_argument, "%s: \"%s\" is not a size; expected %s", what, text, accepted);
  }
  while (*end == ' ') ++end;
  double scale = 1;
  bool percent = false;
  switch (*end) {
    case 'k': case 'K': scale = 1024.0; ++end; break;
    case 'm': case 'M': scale = 1024.0 * 1024; ++end; break;
    case 'g': case 'G': scale = 1024.0 * 1024 * 1024; ++end; break;
    case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024; ++end; break;
    case '%': percent = true; ++end; break;
    default: break;
  }
  if (!percent && scale != 1 && (*end == 'i' || *end == 'I')) ++end;
  if (!percent && (*end == 'b' || *end == 'B')) ++end;
  if (*end != '\0') return fail(err_invalid_argument, "%s: \"%s\" has trailing characters; expected %s", what, text, accepted);
  if (percent && percent_base == 0) {
    return fail(err_invalid_argument, "%s: \"%s\": a percentage is not accepted here; expected %s", what, text, accepted);
  }
  const double bytes = percent ? number / 100.0 * static_cast<double>(percent_base) : number * scale;
  if (bytes >= 18446744073709551615.0) return fail(err_invalid_argument, "%s: \"%s\" is too large", what, text);
  if (!percent && scale == 1 && bytes != std::floor(bytes)) {
    return fail(err_invalid_argument, "%s: \"%s\" is a fraction of a byte", what, text);
  }
  *out = static_cast<uint64_t>(bytes);
  return ok;
}

int option_size(option_id id, uint64_t* out, uint64_t percent_base) {
  const std::string text = option_text(id);
  return parse_size(text.c_str(), out, describe(id).env_name, percent_base);
}

int option_uint(option_id id, uint64_t* out, uint64_t min_value, uint64_t max_value) {
  const std::string text = option_text(id);
  const char* name = describe(id).env_name;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || text[0] == '-' || v < min_value || v > max_value) {
    return fail(err_invalid_argument, "%s: \"%s\" is not a whole number in [%llu, %llu]", name, text.c_str(),
                static_cast<unsigned long long>(min_value), static_cast<unsigned long long>(max_value));
  }
  *out = v;
  return ok;
}

uint64_t physical_ram() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace vramswap
