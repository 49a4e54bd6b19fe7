// The C API (vramswap/vramswap.h): the runtime's codes and messages, unchanged.
#include "vramswap/vramswap.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <vector>

#include "runtime/runtime.hpp"

using namespace vramswap::detail;
using rt::fail_with;

static_assert(offsetof(vramswap_stats_t, size) == 0 && offsetof(vramswap_stats_t, allocated_bytes) == 8);

extern "C" {

int vramswap_lock(int device, int priority, int64_t timeout_ns) {
  if (priority < 0) return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_lock(device %d): priority %d is negative", device, priority);
  return rt::lock(device, static_cast<uint32_t>(priority), timeout_ns, nullptr);
}

int vramswap_lock_interruptible(int device, int priority, int64_t timeout_ns) {
  if (priority < 0) {
    return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_lock_interruptible(device %d): priority %d is negative", device, priority);
  }
  const rt::scoped_wait_check on_signal({[](void*, bool signal_ran) noexcept { return signal_ran; }, nullptr});
  return rt::lock(device, static_cast<uint32_t>(priority), timeout_ns, nullptr);
}

int vramswap_unlock(int device) { return rt::unlock(device); }

int vramswap_lock_devices(const int* devices, size_t count, int priority, int64_t timeout_ns) {
  if (priority < 0) return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_lock_devices: priority %d is negative", priority);
  return rt::lock_gang(devices, count, static_cast<uint32_t>(priority), timeout_ns, nullptr);
}

int vramswap_unlock_devices(const int* devices, size_t count) { return rt::unlock_gang(devices, count); }

int vramswap_join_gang(const char* job, int rank, int world_size, int device) {
  return rt::join_gang(job, rank, world_size, device);
}

int vramswap_malloc(void** out, size_t size, int device) {
  if (out == nullptr) return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_malloc(device %d): out is NULL", device);
  uintptr_t p = 0;
  if (const int rc = rt::malloc(device, size, &p); rc != VRAMSWAP_OK) return rc;
  *out = reinterpret_cast<void*>(p);
  return VRAMSWAP_OK;
}

int vramswap_free(void* ptr, int device) { return rt::free(device, reinterpret_cast<uintptr_t>(ptr)); }

int vramswap_malloc_tagged(void** out, size_t size, int device, const char* tag) {
  if (out == nullptr) return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_malloc_tagged(device %d): out is NULL", device);
  uintptr_t p = 0;
  if (const int rc = rt::malloc_tagged(device, size, tag, &p); rc != VRAMSWAP_OK) return rc;
  *out = reinterpret_cast<void*>(p);
  return VRAMSWAP_OK;
}

int vramswap_sleep(int device, const char* const* tags, const int* modes, size_t count) {
  if (count > 0 && modes == nullptr) return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_sleep(device %d): modes is NULL", device);
  std::vector<uint8_t> m;
  try {
    m.resize(count);
  } catch (const std::bad_alloc&) {
    return fail_with(VRAMSWAP_ERR_OUT_OF_MEMORY, "vramswap_sleep(device %d): out of host memory; nothing was put to sleep", device);
  }
  for (size_t i = 0; i < count; ++i) {
    if (modes[i] != VRAMSWAP_SLEEP_OFFLOAD && modes[i] != VRAMSWAP_SLEEP_DISCARD) {
      return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_sleep(device %d): mode %d (of tag %zu) is neither VRAMSWAP_SLEEP_OFFLOAD "
                       "nor VRAMSWAP_SLEEP_DISCARD", device, modes[i], i);
    }
    m[i] = static_cast<uint8_t>(modes[i]);
  }
  return rt::sleep(device, tags, m.data(), count);
}

int vramswap_set_thread_tag(const char* tag) { return rt::set_thread_tag(tag); }

const char* vramswap_thread_tag(void) { return rt::thread_tag(); }

int vramswap_wake(int device, const char* const* tags, size_t count) { return rt::wake(device, tags, count); }

int vramswap_keep_resident(int device) { return rt::keep_resident(device); }

int vramswap_tags(int device, vramswap_tag_info_t* out, size_t capacity, size_t* count) { return rt::tags(device, out, capacity, count); }

int vramswap_malloc_async(void** out, size_t size, int device, void* stream) {
  if (out == nullptr) return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_malloc_async(device %d): out is NULL", device);
  uintptr_t p = 0;
  if (const int rc = rt::malloc_async(device, size, reinterpret_cast<uintptr_t>(stream), &p); rc != VRAMSWAP_OK) return rc;
  *out = reinterpret_cast<void*>(p);
  return VRAMSWAP_OK;
}

int vramswap_free_async(void* ptr, int device, void* stream) {
  return rt::free_async(device, reinterpret_cast<uintptr_t>(ptr), reinterpret_cast<uintptr_t>(stream));
}

int vramswap_release_cached(int device) { return rt::release_cached(device); }

int vramswap_release_requested(int device) { return rt::release_requested(device) ? 1 : 0; }

int vramswap_advise(void* ptr, size_t size, int advice, int device) {
  if (advice < 0 || advice > VRAMSWAP_ADVICE_READ_MOSTLY) {
    return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_advise(device %d): advice %d is not a VRAMSWAP_ADVICE_* value", device, advice);
  }
  return rt::advise(device, reinterpret_cast<uintptr_t>(ptr), size, static_cast<uint8_t>(advice));
}

int vramswap_stats(int device, vramswap_stats_t* out) {
  constexpr uint64_t k_min = offsetof(vramswap_stats_t, allocated_bytes) + sizeof(uint64_t);
  if (out == nullptr || out->size < k_min) {
    return fail_with(VRAMSWAP_ERR_INVALID_ARGUMENT, "vramswap_stats(device %d): out is NULL or out->size (%llu) < %llu; set out->size = "
                "sizeof(vramswap_stats_t) first", device, out == nullptr ? 0ull : static_cast<unsigned long long>(out->size),
                static_cast<unsigned long long>(k_min));
  }
  vramswap_stats_t full;
  if (const int rc = rt::stats(device, &full); rc != VRAMSWAP_OK) return rc;
  const uint64_t n = std::min<uint64_t>(out->size, sizeof full) & ~uint64_t{7};  // whole fields
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(uint64_t), reinterpret_cast<const char*>(&full) + sizeof(uint64_t),
              n - sizeof(uint64_t));
  out->size = n;
  return VRAMSWAP_OK;
}

const char* vramswap_last_error(void) { return rt::last_error(); }

const char* vramswap_status_name(int code) { return rt::status_name(code); }

}  // extern "C"
