// What the front ends (cpp_api, python, preload) need of the layers besides the sessions:
// errors and the log for their own messages, a way to interrupt a wait, the preload shim's
// hooks (launch bracketing, launch observation, the driver's declared ABI) and the tests'
// hooks. Each is the layer's own function behind the runtime's face (runtime.hpp), so that
// the front ends hold none of the layers' code or state: one copy, in libvramswap.so.
#include <cstdarg>
#include <exception>
#include <string_view>
#include <vector>

#include "core/cuda/declared_abi.hpp"
#include "core/launch_gate.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/device_lock.hpp"
#include "lock/wait_bounds.hpp"
#include "runtime/runtime.hpp"
#include "runtime/stream_allocator.hpp"
#include "runtime/use_tracker.hpp"

namespace vramswap::detail::rt {

static_assert(VRAMSWAP_OK == ok && VRAMSWAP_ERR_INVALID_ARGUMENT == err_invalid_argument &&
                  VRAMSWAP_ERR_OUT_OF_MEMORY == err_out_of_memory && VRAMSWAP_ERR_CUDA == err_cuda &&
                  VRAMSWAP_ERR_UNAVAILABLE == err_unavailable && VRAMSWAP_ERR_NOT_MAPPED == err_not_mapped &&
                  VRAMSWAP_ERR_ALREADY_MAPPED == err_already_mapped && VRAMSWAP_ERR_SYSTEM == err_system &&
                  VRAMSWAP_ERR_OWNER_DIED == err_owner_died && VRAMSWAP_ERR_VERSION_MISMATCH == err_version_mismatch &&
                  VRAMSWAP_ERR_TIMEOUT == err_timeout && VRAMSWAP_ERR_NOT_OWNER == err_not_owner &&
                  VRAMSWAP_ERR_BUSY == err_busy && VRAMSWAP_ERR_IO == err_io && VRAMSWAP_ERR_NO_SPACE == err_no_space &&
                  VRAMSWAP_ERR_INTERRUPTED == err_interrupted && VRAMSWAP_ERR_INTERNAL == err_internal,
              "vramswap.h's status codes are core/status.hpp's");
static_assert(static_cast<int>(log_severity::error) == static_cast<int>(detail::log_level::error) &&
                  static_cast<int>(log_severity::warn) == static_cast<int>(detail::log_level::warn) &&
                  static_cast<int>(log_severity::info) == static_cast<int>(detail::log_level::info) &&
                  static_cast<int>(log_severity::debug) == static_cast<int>(detail::log_level::debug),
              "the face's log levels are core/log.hpp's");
static_assert(k_per_thread_stream == stream_allocator::k_per_thread_stream);

const char* last_error() noexcept { return detail::last_error(); }
const char* status_name(int code) noexcept { return detail::status_name(code); }

int fail_with(int code, const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  const int rc = vfail(code, fmt, ap);
  va_end(ap);
  return rc;
}

void log_line(log_severity level, const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  vlog(static_cast<detail::log_level>(level), fmt, ap);
  va_end(ap);
}

// The lock layer keeps the installed check per thread (lock/wait_bounds.cpp); the face's
// object saves and restores it the way scoped_wait_interrupt does.
namespace {
wait_check as_face(const wait_interrupt& w) { return {w.should_stop, w.context, w.should_stop_without_blocking}; }
wait_interrupt as_layer(const wait_check& c) { return {c.should_stop, c.context, c.should_stop_without_blocking}; }
}  // namespace

scoped_wait_check::scoped_wait_check(const wait_check& check) noexcept : previous_(as_face(install_wait_interrupt(as_layer(check)))) {}
scoped_wait_check::~scoped_wait_check() { install_wait_interrupt(as_layer(previous_)); }

launch_pass::launch_pass() noexcept { launch_gate::enter(); }
launch_pass::~launch_pass() { launch_gate::leave(); }
void set_launches_bracketed() noexcept { launch_gate::set_installed(); }

bool sample_this_launch() noexcept { return use_tracking::sample_this_launch(); }
void record_launch_argument_bytes(const void* bytes, size_t size) noexcept { use_tracking::record_argument_bytes(bytes, size); }
void note_launch_observed() noexcept { use_tracking::note_observed(); }
void note_launch_unreadable() noexcept { use_tracking::note_unreadable(); }

int driver_abi_version(const char* name, int wanted) noexcept {
  return name == nullptr ? wanted : cuda::declared_abi_version(std::string_view(name), wanted);
}

bool crash_backtrace_wanted() noexcept { return preload_backtrace_at_load(); }

void reread_options_for_testing() noexcept {
  try {
    options_reread_for_testing();
  } catch (const std::exception& e) {
    detail::log(detail::log_level::error, "reread_options_for_testing: %s", e.what());
  }
}

int lock_queue(const char* key, std::vector<queue_entry>* out) noexcept {
  if (key == nullptr || out == nullptr) return detail::fail(err_invalid_argument, "lock_queue: key or out is NULL");
  try {
    device_lock lock;
    VS_TRY(device_lock::open(key, &lock));
    std::vector<lock_queue_entry> queue;
    VS_TRY(lock.snapshot(&queue));
    out->clear();
    for (const lock_queue_entry& e : queue) out->push_back({e.pid, e.holding});
    return ok;
  } catch (const std::exception&) {
    return detail::fail(err_out_of_memory, "lock_queue(%s): out of host memory", key);
  }
}

}  // namespace vramswap::detail::rt
