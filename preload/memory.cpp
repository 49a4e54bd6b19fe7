// The shim's allocation, free and memory-info functions (preload/shim.hpp).
//
// Which device: the calling thread's current context's (cuCtxGetDevice), as for the driver
// functions they replace; the runtime's entry points make the device's primary context
// current first (cudaSetDevice semantics).
//
// Without VRAMSWAP_OVERSUBSCRIBE=1 the process is an ordinary, normal-priority vramswap
// process that does not know about the lock: the first allocation takes the device lock, and
// the process keeps it until it exits (its memory is resident all along; other vramswap
// processes wait for it, and it takes back frames lent to oversubscribed jobs). With
// VRAMSWAP_OVERSUBSCRIBE=1 it never takes the lock (oversubscribed_session).
//
// Memory the process freed goes back to vramswap at once (cudaFree semantics: the device
// is synchronized first, as the real cudaFree does). A pointer vramswap did not hand out
// (memory from before the shim took over, or from another allocator) goes to the real
// function.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <mutex>
#include <vector>

#include "runtime/runtime.hpp"
#include "shim.hpp"

namespace vramswap::detail::preload {
namespace {

constexpr int ok = VRAMSWAP_OK;

}  // namespace

CUresult current_device(int* out) {
  // The one-argument ABI cuda.h declares, not CUDA 13's (core/cuda/declared_abi.hpp).
  static auto ctx_get_device = driver<CUresult (*)(CUdevice*)>("cuCtxGetDevice");
  if (ctx_get_device == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUdevice d = 0;
  const CUresult r = ctx_get_device(&d);
  if (r != CUDA_SUCCESS) return r;
  *out = static_cast<int>(d);
  return CUDA_SUCCESS;
}

CUresult device_count(int* out) {
  static auto get_count = driver<CUresult (*)(int*)>("cuDeviceGetCount");
  return get_count != nullptr ? get_count(out) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult as_cuda(int rc, const char* what) {
  rt::log_line(rt::log_severity::warn, "preload: %s: %s", what, rt::last_error());
  return rc == VRAMSWAP_ERR_OUT_OF_MEMORY ? CUDA_ERROR_OUT_OF_MEMORY
         : rc == VRAMSWAP_ERR_INVALID_ARGUMENT ? CUDA_ERROR_INVALID_VALUE
                                      : CUDA_ERROR_UNKNOWN;
}

namespace {
// At exit, one line on what vramswap did for this process (info level).
std::vector<int> g_devices_used;
void summary_at_exit() {
  for (int device : g_devices_used) {
    vramswap_stats_t s{};
    s.size = sizeof s;
    if (rt::stats(device, &s) != ok) continue;
    rt::log_line(rt::log_severity::info,
        "preload: device %d at exit: %.1f MiB allocated in %llu allocation(s); %.1f MiB in host frames; %llu page(s) moved to host "
        "frames for lock holders in %.3f s in all, %llu moved back; %llu launch(es) waited %.3f s in all for lock holders",
        device, s.allocated_bytes / 1048576.0, static_cast<unsigned long long>(s.allocations), s.host_frame_bytes / 1048576.0,
        static_cast<unsigned long long>(s.pages_demoted), s.reclaim_seconds, static_cast<unsigned long long>(s.pages_promoted),
        static_cast<unsigned long long>(s.yield_waits), s.yield_seconds);
  }
}

}  // namespace

// Normal priority: take the device's lock at the first allocation, keep it until exit.
CUresult ensure_turn(int device) {
  static std::mutex m;
  static std::vector<bool> locked;
  std::lock_guard<std::mutex> guard(m);
  if (static_cast<size_t>(device) < locked.size() && locked[device]) return CUDA_SUCCESS;
  bool over = false;
  if (const int rc = rt::oversubscribed(device, &over); rc != ok) return as_cuda(rc, "opening vramswap's session");
  if (!over) {
    rt::log_line(rt::log_severity::info, "preload: device %d: taking the device lock for the life of this process (normal priority)", device);
    if (const int rc = rt::lock(device, 1, -1, nullptr); rc != ok) return as_cuda(rc, "taking the device lock");
  }
  if (locked.size() <= static_cast<size_t>(device)) locked.resize(device + 1, false);
  locked[device] = true;
  // Registered after the runtime's own exit handler (opening the session registered it), so
  // it runs before the sessions close.
  if (g_devices_used.empty()) std::atexit(summary_at_exit);
  g_devices_used.push_back(device);
  return CUDA_SUCCESS;
}

CUresult mem_alloc(CUdeviceptr* dptr, size_t bytes) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (const CUresult r = current_device(&device); r != CUDA_SUCCESS) return r;
  if (const CUresult r = ensure_turn(device); r != CUDA_SUCCESS) return r;
  uintptr_t p = 0;
  if (const int rc = rt::malloc(device, bytes, &p); rc != ok) return as_cuda(rc, "cuMemAlloc");
  *dptr = static_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult mem_free(CUdeviceptr dptr) {
  if (dptr == 0) return CUDA_SUCCESS;
  int device = 0;
  if (current_device(&device) != CUDA_SUCCESS || !rt::owns(device, dptr)) {
    static auto real = driver<CUresult (*)(CUdeviceptr)>("cuMemFree");
    const CUresult r = real != nullptr ? real(dptr) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) note_bypass_freed(dptr);
    return r;
  }
  // cuMemFree waits for the device's work first; so must we: a kernel may still use it.
  static auto ctx_sync = driver<CUresult (*)()>("cuCtxSynchronize");  // the declared ABI, as above
  if (ctx_sync != nullptr) ctx_sync();
  if (const int rc = rt::free(device, dptr); rc != ok) return as_cuda(rc, "cuMemFree");
  return CUDA_SUCCESS;
}

CUresult mem_alloc_async(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (const CUresult r = current_device(&device); r != CUDA_SUCCESS) return r;
  if (const CUresult r = ensure_turn(device); r != CUDA_SUCCESS) return r;
  uintptr_t p = 0;
  if (const int rc = rt::malloc_async(device, bytes, reinterpret_cast<uintptr_t>(stream), &p); rc != ok) {
    return as_cuda(rc, "cuMemAllocAsync");
  }
  *dptr = static_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

namespace {
CUstream per_thread_if_default(CUstream stream) {
  return stream == nullptr ? reinterpret_cast<CUstream>(rt::k_per_thread_stream) : stream;
}
}  // namespace

CUresult mem_alloc_async_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  return mem_alloc_async(dptr, bytes, per_thread_if_default(stream));
}

CUresult mem_free_async_ptsz(CUdeviceptr dptr, CUstream stream) { return mem_free_async(dptr, per_thread_if_default(stream)); }

CUresult mem_free_async(CUdeviceptr dptr, CUstream stream) {
  if (dptr == 0) return CUDA_SUCCESS;
  int device = 0;
  if (current_device(&device) != CUDA_SUCCESS || !rt::owns(device, dptr)) {
    static auto real = driver<CUresult (*)(CUdeviceptr, CUstream)>("cuMemFreeAsync");
    const CUresult r = real != nullptr ? real(dptr, stream) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) note_bypass_freed(dptr);
    return r;
  }
  if (const int rc = rt::free_async(device, dptr, reinterpret_cast<uintptr_t>(stream)); rc != ok) {
    return as_cuda(rc, "cuMemFreeAsync");
  }
  return CUDA_SUCCESS;
}

CUresult mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (const CUresult r = current_device(&device); r != CUDA_SUCCESS) return r;
  uint64_t f = 0, t = 0;
  if (const int rc = rt::memory_info(device, &f, &t); rc != ok) return as_cuda(rc, "cuMemGetInfo");
  *free_bytes = f;
  *total_bytes = t;
  return CUDA_SUCCESS;
}

}  // namespace vramswap::detail::preload
