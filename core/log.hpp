// Logging to stderr, one line per message (one write(2), so lines of several processes never
// interleave), prefixed with the wall-clock time (UTC, microseconds), the pid and the device:
//
//   2026-05-01T12:34:56.123456Z vramswap[4242] dev 0 info: <message>
//
// "dev -" when the line belongs to no device. The level comes from VRAMSWAP_LOG
// (error | warn | info | debug), read once; a disabled level costs one comparison, and
// nothing on a hot path logs below debug. Unset, it is warn: a program that uses the library
// hears only what needs its attention. vramswapd, whose log is a file of its own, makes its
// default info (log_set_default_level).
#pragma once

#include <cstdarg>

namespace vramswap::detail {

enum class log_level { error = 0, warn = 1, info = 2, debug = 3 };

bool log_enabled(log_level level) noexcept;
// The level when VRAMSWAP_LOG is unset (warn unless this is called; vramswapd: info). Call it
// before the first log line: a level already read is read again.
void log_set_default_level(log_level level) noexcept;
// The device this thread's lines are about (-1: none). The first call in a process also
// sets the default for threads that never call it (a server, a one-device session).
void log_set_device(int device) noexcept;
void log(log_level level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
void vlog(log_level level, const char* fmt, va_list ap) noexcept;

// While a thread holds a mutex other processes wait on (the lock segment's internal mutex),
// a line to a stderr nobody drains (a pipe a parent does not read, a stalled log driver)
// would block it there, and everyone with it. Between log_defer_begin() and the matching
// log_defer_end() this thread's lines are kept (up to 4 KiB, then counted) and written at
// the end. Calls nest.
void log_defer_begin() noexcept;
void log_defer_end() noexcept;

}  // namespace vramswap::detail
