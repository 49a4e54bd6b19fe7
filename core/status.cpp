#include "core/status.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace vramswap::detail {
namespace {
// One buffer per thread: a failure on one thread never overwrites another's detail.
thread_local std::string t_detail;
}  // namespace

const char* status_name(int code) noexcept {
  switch (code) {
    case ok: return "ok";
    case err_invalid_argument: return "invalid_argument";
    case err_out_of_memory: return "out_of_memory";
    case err_cuda: return "cuda_error";
    case err_unavailable: return "unavailable";
    case err_not_mapped: return "not_mapped";
    case err_already_mapped: return "already_mapped";
    case err_system: return "system_error";
    case err_owner_died: return "owner_died";
    case err_version_mismatch: return "version_mismatch";
    case err_timeout: return "timeout";
    case err_not_owner: return "not_owner";
    case err_busy: return "busy";
    case err_io: return "io_error";
    case err_no_space: return "no_space";
    case err_interrupted: return "interrupted";
    case err_internal: return "internal_error";
    default: return "unknown";
  }
}

const char* last_error() noexcept { return t_detail.c_str(); }

int vfail(int code, const char* fmt, va_list ap) noexcept {
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  try {
    t_detail.assign(buf);
  } catch (...) {  // out of memory while reporting: keep the code, lose the text
  }
  return code;
}

int fail(int code, const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  vfail(code, fmt, ap);
  va_end(ap);
  return code;
}

int fail_errno(int errnum, const char* fmt, ...) noexcept {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return fail(err_system, "%s: %s (errno %d)", buf, std::strerror(errnum), errnum);
}

int add_context(int code, const char* fmt, ...) noexcept {
  // Success leaves the detail alone: it belongs to the last failure, and a hot path that
  // wraps every call (the stream allocator's) would otherwise grow it without bound.
  if (code == ok) return ok;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  try {
    t_detail.insert(0, buf);
  } catch (...) {
  }
  return code;
}

void clear_error() noexcept { t_detail.clear(); }

}  // namespace vramswap::detail
