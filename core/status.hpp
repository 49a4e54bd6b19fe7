// vramswap status codes: the first of the two error tiers.
//
// core/, swap/ and lock/ never throw. Every fallible function returns 0 on success or one
// of the negative codes below, and records a human-readable detail for the calling thread
// (what failed, on what, and what to do) that `last_error()` returns until the next
// failure on that thread. cpp_api/ turns the pair into typed exceptions; the C API hands
// both out unchanged.
//
// Codes live in a reserved range (-1000 .. -1099) so they never collide with -errno values
// that OS helpers pass through, the way LMDB keeps its MDB_* codes apart from errno.
#pragma once

#include <cstdarg>
#include <string>

namespace vramswap::detail {

enum status : int {
  ok = 0,
  err_invalid_argument = -1000,   // bad input from the caller; nothing was changed
  err_out_of_memory = -1001,      // device, pool or host memory exhausted
  err_cuda = -1002,               // the CUDA driver returned an error
  err_unavailable = -1003,        // backend or device not usable here (no driver, no GPU)
  err_not_mapped = -1004,         // address range not mapped / not reserved
  err_already_mapped = -1005,     // address range already mapped
  err_system = -1006,             // an OS call failed; the detail carries errno's text
  err_owner_died = -1007,         // a lock holder died; state was repaired
  err_version_mismatch = -1008,   // shared state written by an incompatible version
  err_timeout = -1009,            // a timed wait expired
  err_not_owner = -1010,          // operation requires holding something we do not hold
  err_busy = -1011,               // resource in use (e.g. a frame still mapped)
  err_io = -1012,                 // a swap-tier read or write failed; data stayed where it was
  err_no_space = -1013,           // a swap tier is full; data stayed where it was
  err_interrupted = -1014,        // an interruptible wait was interrupted (a signal); nothing is held
  err_internal = -1099,           // a broken invariant inside vramswap: a bug, please report
};

// Short, stable name of a code ("invalid_argument"); "unknown" for anything else.
const char* status_name(int code) noexcept;

// The detail recorded by the last failing call on this thread ("" if none).
const char* last_error() noexcept;

// Record `detail` (printf-style) for this thread and return `code`. Used as
// `return fail(err_invalid_argument, "map: size %zu is not a multiple of %zu", n, g);`
int fail(int code, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
int vfail(int code, const char* fmt, va_list ap) noexcept;

// Like fail(err_system, ...) with ": <strerror(errnum)>" appended.
int fail_errno(int errnum, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// Prefix the current thread's detail with more context ("pager: " + detail), keep `code`.
// When `code` is ok nothing is recorded: the detail stays that of the last failure.
int add_context(int code, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// Clear the current thread's detail (so a later last_error() does not show a stale one).
void clear_error() noexcept;

}  // namespace vramswap::detail

// Propagate a failing status unchanged: VS_TRY(backend.map(...));
#define VS_TRY(expr)                         \
  do {                                       \
    const int vs_try_rc_ = (expr);           \
    if (vs_try_rc_ != 0) return vs_try_rc_;  \
  } while (0)
