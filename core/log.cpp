#include "core/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/options.hpp"

namespace vramswap::detail {
namespace {

thread_local int t_device = -1;
std::atomic<int> g_device{-1};

// "2026-05-01T12:34:56.123456Z vramswap[pid] dev N " (or "dev -") into line; returns its length.
int prefix(char* line, size_t size) noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  ::gmtime_r(&ts.tv_sec, &utc);
  char when[40];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
  const int device = t_device >= 0 ? t_device : g_device.load(std::memory_order_relaxed);
  char dev[16] = "-";
  if (device >= 0) std::snprintf(dev, sizeof dev, "%d", device);
  return std::snprintf(line, size, "%s.%06ldZ vramswap[%d] dev %s ", when, ts.tv_nsec / 1000, static_cast<int>(getpid()), dev);
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

std::atomic<int> g_default_level{static_cast<int>(log_level::warn)};

// VRAMSWAP_LOG's level, or the process's default when it is unset; *bad_text is set to the
// value when it is none of the levels (the default is used then).
log_level read_level(std::string* bad_text) noexcept {
  const auto fallback = static_cast<log_level>(g_default_level.load(std::memory_order_relaxed));
  try {
    if (option_is_default(option_id::log_level)) return fallback;
    const std::string text = option_text(option_id::log_level);
    if (text == "error") return log_level::error;
    if (text == "warn") return log_level::warn;
    if (text == "info") return log_level::info;
    if (text == "debug") return log_level::debug;
    *bad_text = text;
  } catch (...) {
  }
  return fallback;
}

// Read once, on the first log call. Not a function-local static: reading VRAMSWAP_LOG may be
// the process's first use of an option, which logs the options in force, which asks for the
// level again; that inner call reads it too (the environment is read by then) instead of
// re-entering a static's initialisation, and only the call that settles the level warns.
std::atomic<int> g_level{-1};

log_level current_level() noexcept {
  int level = g_level.load(std::memory_order_acquire);
  if (level >= 0) return static_cast<log_level>(level);
  std::string bad_text;
  const int read = static_cast<int>(read_level(&bad_text));
  if (!g_level.compare_exchange_strong(level, read, std::memory_order_acq_rel)) return static_cast<log_level>(level);
  if (!bad_text.empty()) {
    char line[160];
    prefix(line, sizeof line);
    std::fprintf(stderr, "%swarn: VRAMSWAP_LOG=\"%s\" is not one of error|warn|info|debug; using %s\n", line, bad_text.c_str(),
                 level_name(static_cast<log_level>(read)));
  }
  return static_cast<log_level>(read);
}


}  // namespace

void log_set_default_level(log_level level) noexcept {
  g_default_level.store(static_cast<int>(level), std::memory_order_relaxed);
  g_level.store(-1, std::memory_order_release);
}

void log_set_device(int device) noexcept {
  t_device = device;
  int none = -1;
  g_device.compare_exchange_strong(none, device, std::memory_order_relaxed);
}

bool log_enabled(log_level level) noexcept { return level <= current_level(); }

namespace {
// Trivially destructible: a thread's lines may be deferred while its thread_local objects
// are being destroyed.
thread_local int t_defer_depth = 0;
thread_local char t_deferred[4096];
thread_local size_t t_deferred_len = 0;
thread_local unsigned t_deferred_dropped = 0;

void write_line(const char* line, size_t len) {
  if (t_defer_depth > 0) {
    if (len <= sizeof t_deferred - t_deferred_len) {
      std::memcpy(t_deferred + t_deferred_len, line, len);
      t_deferred_len += len;
    } else {
      ++t_deferred_dropped;
    }
    return;
  }
  // One write(2) per line so that lines from several processes do not interleave.
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line, len);
}
}  // namespace

void log_defer_begin() noexcept { ++t_defer_depth; }

void log_defer_end() noexcept {
  if (t_defer_depth == 0 || --t_defer_depth > 0) return;
  if (t_deferred_len > 0) {
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, t_deferred, t_deferred_len);
    t_deferred_len = 0;
  }
  if (t_deferred_dropped > 0) {
    char line[160];
    int n = prefix(line, sizeof line);
    n += std::snprintf(line + n, sizeof line - static_cast<size_t>(n), "warn: %u more log line(s) of a critical section dropped\n",
                       t_deferred_dropped);
    t_deferred_dropped = 0;
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line, static_cast<size_t>(n));
  }
}

void vlog(log_level level, const char* fmt, va_list ap) noexcept {
  if (!log_enabled(level)) return;
  char line[1200];
  int n = prefix(line, sizeof line);
  n += std::snprintf(line + n, sizeof line - static_cast<size_t>(n), "%s: ", level_name(level));
  std::vsnprintf(line + n, sizeof line - static_cast<size_t>(n) - 1, fmt, ap);
  const size_t len = std::strlen(line);
  line[len] = '\n';
  write_line(line, len + 1);
}

void log(log_level level, const char* fmt, ...) noexcept {
  if (!log_enabled(level)) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(level, fmt, ap);
  va_end(ap);
}

}  // namespace vramswap::detail
