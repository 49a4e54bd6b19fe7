// The public C++ API (vramswap/vramswap.hpp) over the runtime: gpu_lock and memory.
#include <unistd.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/runtime.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

namespace vramswap {
// The public types are defined here over the runtime's face and its status codes.
namespace rt = detail::rt;
using rt::last_error;
constexpr int ok = VRAMSWAP_OK;
constexpr int err_invalid_argument = VRAMSWAP_ERR_INVALID_ARGUMENT;
constexpr int err_timeout = VRAMSWAP_ERR_TIMEOUT;
constexpr int err_busy = VRAMSWAP_ERR_BUSY;
constexpr int err_not_owner = VRAMSWAP_ERR_NOT_OWNER;
constexpr int err_unavailable = VRAMSWAP_ERR_UNAVAILABLE;

// The public stats structs and the runtime's list of their fields (VRAMSWAP_PROCESS_STATS,
// runtime/runtime.hpp), tied together: the C struct leads with its `size`, the C++ one does
// not; every field in the list's order, of its type, and nothing else.
namespace process_stats_layout {
struct c_layout {
  uint64_t size;
#define VRAMSWAP_FIELD(name, type) type name;
  VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
};
struct cpp_layout {
#define VRAMSWAP_FIELD(name, type) type name;
  VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
};
static_assert(std::is_standard_layout_v<vramswap_stats_t> && std::is_standard_layout_v<vramswap::stats>);
static_assert(offsetof(vramswap_stats_t, size) == 0 && std::is_same_v<decltype(vramswap_stats_t::size), uint64_t>);
#define VRAMSWAP_FIELD(name, type)                                                                                     \
  static_assert(std::is_same_v<decltype(vramswap_stats_t::name), type> &&                                            \
                    offsetof(vramswap_stats_t, name) == offsetof(c_layout, name),                                      \
                "vramswap_stats_t::" #name " differs from VRAMSWAP_PROCESS_STATS (type or place)");                    \
  static_assert(std::is_same_v<decltype(vramswap::stats::name), type> &&                                             \
                    offsetof(vramswap::stats, name) == offsetof(cpp_layout, name),                                     \
                "vramswap::stats::" #name " differs from VRAMSWAP_PROCESS_STATS (type or place)");
VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
static_assert(sizeof(vramswap_stats_t) == sizeof(c_layout), "vramswap_stats_t has a field that VRAMSWAP_PROCESS_STATS does not list");
static_assert(sizeof(vramswap::stats) == sizeof(cpp_layout), "vramswap::stats has a field that VRAMSWAP_PROCESS_STATS does not list");
}  // namespace process_stats_layout

namespace {
[[noreturn]] void throw_last(int code) { throw_error(code, last_error()); }
}  // namespace

// --- gpu_lock ------------------------------------------------------------------------------

gpu_lock::gpu_lock(int device, priority p) : device_(device), priority_(p) { acquire(-1); }

gpu_lock::gpu_lock(int device, std::chrono::nanoseconds timeout_, priority p) : device_(device), priority_(p) {
  const int64_t ns = timeout_.count() > 0 ? timeout_.count() : 0;
  if (!acquire(ns)) {
    const std::string why = last_error();
    throw timeout(err_timeout, "gpu_lock(device " + std::to_string(device) + "): not acquired within " +
                                   std::to_string(ns / 1000000.0) + " ms: " + why);
  }
}

gpu_lock::gpu_lock(int device, std::try_to_lock_t, priority p) : device_(device), priority_(p) { acquire(0); }

gpu_lock::gpu_lock(int device, std::defer_lock_t, priority p) noexcept : device_(device), priority_(p) {}

namespace {
// The bit mask of a gang's devices; throws invalid_argument for what cannot be one.
uint16_t gang_mask(const std::vector<int>& devices, int* lowest) {
  if (devices.empty()) throw invalid_argument(err_invalid_argument, "gpu_lock({}): no devices; list at least one");
  uint32_t mask = 0;
  for (int d : devices) {
    if (d < 0 || d > 15) {
      throw invalid_argument(err_invalid_argument, "gpu_lock(devices): device " + std::to_string(d) +
                                                       " is not one of 0 to 15, which a gang guard can hold");
    }
    if ((mask & (1u << d)) != 0) {
      throw invalid_argument(err_invalid_argument, "gpu_lock(devices): device " + std::to_string(d) + " is listed twice");
    }
    mask |= 1u << d;
  }
  *lowest = __builtin_ctz(mask);
  return (mask & (mask - 1)) == 0 ? 0 : static_cast<uint16_t>(mask);  // one device: a plain lock
}

std::vector<int> gang_devices(uint16_t mask) {
  std::vector<int> out;
  for (int d = 0; d < 16; ++d) {
    if ((mask & (1u << d)) != 0) out.push_back(d);
  }
  return out;
}

std::string gang_text(uint16_t mask, int device) {
  if (mask == 0) return "device " + std::to_string(device);
  std::string s = "devices ";
  for (int d : gang_devices(mask)) s += (s.size() > 8 ? "," : "") + std::to_string(d);
  return s;
}
}  // namespace

gpu_lock::gpu_lock(const std::vector<int>& devices, priority p) : priority_(p) {
  gang_ = gang_mask(devices, &device_);
  acquire(-1);
}

gpu_lock::gpu_lock(const std::vector<int>& devices, std::chrono::nanoseconds timeout_, priority p) : priority_(p) {
  gang_ = gang_mask(devices, &device_);
  const int64_t ns = timeout_.count() > 0 ? timeout_.count() : 0;
  if (!acquire(ns)) {
    const std::string why = last_error();
    throw timeout(err_timeout, "gpu_lock(" + gang_text(gang_, device_) + "): not acquired within " +
                                   std::to_string(ns / 1000000.0) + " ms: " + why);
  }
}

gpu_lock::gpu_lock(const std::vector<int>& devices, std::try_to_lock_t, priority p) : priority_(p) {
  gang_ = gang_mask(devices, &device_);
  acquire(0);
}

gpu_lock::gpu_lock(const std::vector<int>& devices, std::defer_lock_t, priority p) : priority_(p) {
  gang_ = gang_mask(devices, &device_);
}

std::vector<int> gpu_lock::devices() const { return gang_ == 0 ? std::vector<int>{device_} : gang_devices(gang_); }

gpu_lock::~gpu_lock() {
  if (!owned_) return;
  if (owner_pid_ != ::getpid()) {
    rt::log_line(rt::log_severity::warn, "~gpu_lock(%s): destroyed in a forked child; the lock is the parent's, nothing released",
        gang_text(gang_, device_).c_str());
    return;
  }
  const int rc = unlock_all();
  if (rc != ok) rt::log_line(rt::log_severity::error, "~gpu_lock(%s): %s", gang_text(gang_, device_).c_str(), last_error());
}

gpu_lock::gpu_lock(gpu_lock&& other) noexcept
    : device_(other.device_),
      priority_(other.priority_),
      owned_(std::exchange(other.owned_, false)),
      previous_holder_died_(other.previous_holder_died_),
      gang_(other.gang_),
      owner_pid_(other.owner_pid_) {}

gpu_lock& gpu_lock::operator=(gpu_lock&& other) noexcept {
  if (this != &other) {
    gpu_lock old(std::move(*this));  // releases what *this owned
    device_ = other.device_;
    priority_ = other.priority_;
    owned_ = std::exchange(other.owned_, false);
    previous_holder_died_ = other.previous_holder_died_;
    gang_ = other.gang_;
    owner_pid_ = other.owner_pid_;
  }
  return *this;
}

bool gpu_lock::acquire(int64_t timeout_ns) {
  if (owned_) {
    throw invalid_argument(err_invalid_argument, "gpu_lock::lock(" + gang_text(gang_, device_) +
                                                     "): this guard already owns the lock (to re-enter, use a second guard)");
  }
  bool died = false;
  int rc = ok;
  if (gang_ == 0) {
    rc = rt::lock(device_, static_cast<uint32_t>(priority_), timeout_ns, &died);
  } else {
    const std::vector<int> devs = gang_devices(gang_);
    rc = rt::lock_gang(devs.data(), devs.size(), static_cast<uint32_t>(priority_), timeout_ns, &died);
  }
  if (rc == ok) {
    owned_ = true;
    owner_pid_ = ::getpid();
    previous_holder_died_ = died;
    return true;
  }
  if (timeout_ns >= 0 && (rc == err_busy || rc == err_timeout)) return false;
  throw_last(rc);
}

void gpu_lock::lock() { acquire(-1); }
bool gpu_lock::try_lock() { return acquire(0); }
bool gpu_lock::try_lock_for(std::chrono::nanoseconds t) { return acquire(t.count() > 0 ? t.count() : 0); }

void gpu_lock::unlock() {
  if (!owned_) {
    throw error(err_not_owner, "gpu_lock::unlock(" + gang_text(gang_, device_) + "): this guard does not own the lock");
  }
  const int rc = unlock_all();
  if (rc == ok) {
    owned_ = false;
    return;
  }
  // Nothing changed when the caller was the wrong thread or process; otherwise the lock was
  // handed on despite the error (the device could not be synchronized).
  if (rc != err_not_owner && rc != err_unavailable) owned_ = false;
  throw_last(rc);
}

bool gpu_lock::release() noexcept { return std::exchange(owned_, false); }

int gpu_lock::unlock_all() noexcept {
  if (gang_ == 0) return rt::unlock(device_);
  int devs[16];
  size_t n = 0;
  for (int d = 0; d < 16; ++d) {
    if ((gang_ & (1u << d)) != 0) devs[n++] = d;
  }
  return rt::unlock_gang(devs, n);
}

// --- memory --------------------------------------------------------------------------------

void* malloc(size_t size, int device) {
  uintptr_t p = 0;
  if (const int rc = rt::malloc(device, size, &p); rc != ok) throw_last(rc);
  return reinterpret_cast<void*>(p);
}

void free(void* ptr, int device) {
  if (const int rc = rt::free(device, reinterpret_cast<uintptr_t>(ptr)); rc != ok) throw_last(rc);
}

void* malloc(size_t size, int device, const std::string& tag) {
  uintptr_t p = 0;
  if (const int rc = rt::malloc_tagged(device, size, tag.c_str(), &p); rc != ok) throw_last(rc);
  return reinterpret_cast<void*>(p);
}

void set_thread_tag(const std::string& tag) {
  if (const int rc = rt::set_thread_tag(tag.c_str()); rc != ok) throw_last(rc);
}

std::string thread_tag() { return rt::thread_tag(); }

void sleep(const std::vector<tag_sleep>& tags, int device) {
  std::vector<const char*> names;
  std::vector<uint8_t> modes;
  for (const tag_sleep& t : tags) {
    if (t.mode != sleep_mode::offload && t.mode != sleep_mode::discard) {
      throw invalid_argument(VRAMSWAP_ERR_INVALID_ARGUMENT, "sleep: tag '" + t.tag + "': mode " + std::to_string(static_cast<int>(t.mode)) +
                                                                " is neither offload nor discard");
    }
    names.push_back(t.tag.c_str());
    modes.push_back(static_cast<uint8_t>(t.mode));
  }
  if (const int rc = rt::sleep(device, names.data(), modes.data(), names.size()); rc != ok) throw_last(rc);
}

void wake(const std::vector<std::string>& tags, int device) {
  std::vector<const char*> names;
  for (const std::string& t : tags) names.push_back(t.c_str());
  if (const int rc = rt::wake(device, names.data(), names.size()); rc != ok) throw_last(rc);
}

void keep_resident(int device) {
  if (const int rc = rt::keep_resident(device); rc != ok) throw_last(rc);
}

std::vector<tag_info> tags(int device) {
  size_t count = 0;
  std::vector<vramswap_tag_info_t> raw;
  do {  // tags made between the two calls: ask again with room for them
    raw.resize(count);
    if (const int rc = rt::tags(device, raw.data(), raw.size(), &count); rc != ok) throw_last(rc);
  } while (count > raw.size());
  std::vector<tag_info> out;
  for (size_t i = 0; i < count; ++i) {
    tag_info t;
    t.name = raw[i].name;
    t.allocated_bytes = raw[i].allocated_bytes;
    t.allocations = raw[i].allocations;
    t.reserved_bytes = raw[i].reserved_bytes;
    t.asleep = raw[i].asleep != 0;
    t.mode = static_cast<sleep_mode>(raw[i].sleep_mode);
    out.push_back(std::move(t));
  }
  return out;
}

void* malloc_async(size_t size, void* stream, int device) {
  uintptr_t p = 0;
  if (const int rc = rt::malloc_async(device, size, reinterpret_cast<uintptr_t>(stream), &p); rc != ok) throw_last(rc);
  return reinterpret_cast<void*>(p);
}

void free_async(void* ptr, void* stream, int device) {
  if (const int rc = rt::free_async(device, reinterpret_cast<uintptr_t>(ptr), reinterpret_cast<uintptr_t>(stream)); rc != ok) {
    throw_last(rc);
  }
}

bool release_requested(int device) noexcept { return rt::release_requested(device); }

void join_gang(const std::string& job, int rank, int world_size, int device) {
  if (const int rc = rt::join_gang(job.c_str(), rank, world_size, device); rc != ok) throw_last(rc);
}

void leave_gang(int device) {
  if (const int rc = rt::join_gang(nullptr, 0, 0, device); rc != ok) throw_last(rc);
}

void release_cached(int device) {
  if (const int rc = rt::release_cached(device); rc != ok) throw_last(rc);
}

void advise(void* ptr, size_t size, advice a, int device) {
  if (const int rc = rt::advise(device, reinterpret_cast<uintptr_t>(ptr), size, static_cast<uint8_t>(a)); rc != ok) throw_last(rc);
}

stats get_stats(int device) {
  vramswap_stats_t s;
  if (const int rc = rt::stats(device, &s); rc != ok) throw_last(rc);
  stats r;
#define VRAMSWAP_FIELD(name, type) r.name = s.name;
  VRAMSWAP_PROCESS_STATS(VRAMSWAP_FIELD)
#undef VRAMSWAP_FIELD
  return r;
}

}  // namespace vramswap
