#include "core/status.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace vramswap::detail {
namespace {
// One buffer per thread: a failure on one thread never overwrites another's detail.
//
// Reached through a pointer that is trivially destructible: a thread's thread_local objects
// are destroyed before its atexit handlers and static destructors run (the main thread's at
// exit()), and those still report failures here (vramswap's own teardown at exit among
// them). A std::string thread_local would be written after its destruction then; the
// pointer is only nulled, and a failure after that gets a new buffer, left to the exit.
thread_local std::string* t_detail = nullptr;
struct detail_owner {
  ~detail_owner() {
    delete t_detail;
    t_detail = nullptr;
  }
};
thread_local detail_owner t_detail_owner;

std::string& detail() {
  if (t_detail == nullptr) {
    (void)&t_detail_owner;  // constructed with the first buffer of the thread, so that it frees it
    t_detail = new std::string;
  }
  return *t_detail;
}
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

const char* last_error() noexcept { return t_detail != nullptr ? t_detail->c_str() : ""; }

int vfail(int code, const char* fmt, va_list ap) noexcept {
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  try {
    detail().assign(buf);
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
    detail().insert(0, buf);
  } catch (...) {
  }
  return code;
}

void clear_error() noexcept {
  if (t_detail != nullptr) t_detail->clear();
}

}  // namespace vramswap::detail
