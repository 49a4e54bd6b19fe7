// The cuda backend: vramswap's backend interface on the CUDA driver's virtual memory
// management (VMM) API.
//
// Why dlopen + cuGetProcAddress. libvramswap must load, and its host backend work, on
// machines with no NVIDIA driver (CI, laptops), so it never links libcuda: cuda_driver.cpp
// dlopens libcuda.so.1 on first use and fetches each function through cuGetProcAddress at
// the ABI version of the cuda.h we were compiled against. Asking by version (rather than
// dlsym of a symbol name) is NVIDIA's supported way to get exactly the ABI our header
// declares, however the driver's exported names evolve. Only cuda.h is needed at build
// time; a build without it gets cuda_unavailable.cpp, which says so.
//
// Context policy. The VMM API is process-wide (addresses, allocation handles), but streams,
// events, pinned host memory and synchronization live in a context. We use each device's
// primary context: the one the CUDA runtime (and so PyTorch, cuBLAS, ...) uses, so our
// streams and events interoperate with the application's work and we create no extra
// context (each costs hundreds of MiB of device memory). It is retained lazily, on the
// first call that touches the device, and released by the destructor. Every call that
// touches a device makes that device's primary context current on the calling thread
// (cuCtxSetCurrent) and, on return, puts back whatever the thread had current before:
// the backend never changes the application's current device behind its back. When the
// thread already has that context current (the application's own threads, usually) no
// switch happens at all. Pinned host memory is not tied to a device; it is allocated and
// registered PORTABLE from device 0's primary context.
//
// Why POSIX file-descriptor handles. Frames pass between processes (the pool server hands
// every client the whole pool), and CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR makes a frame
// an ordinary fd: sent with SCM_RIGHTS over a Unix socket, checked with SO_PEERCRED, closed
// like any other fd, and released by the kernel when a process dies. The host backend's
// memfd frames travel the same way, so the pool and lock code is identical on both. (The
// alternative, CU_MEM_HANDLE_TYPE_FABRIC, needs IMEX channels; cudaIpc handles cannot
// share VMM allocations.) Exported fds are made close-on-exec, like the host backend's
// memfds, so that ~4,500 frame fds never leak into a child process by accident.
//
// What each do_*() maps to (arguments are validated by the base class before we get them;
// every CUresult is checked and a failure names the call, its arguments and the CUDA error):
//   device_count      cuDeviceGetCount, once, in make_cuda_backend
//   device_info       cuDeviceGetName, cuDeviceGetUuid_v2 (formatted "GPU-xxxxxxxx-..." like
//                     nvidia-smi), cuDeviceTotalMem_v2, cuMemGetInfo_v2 (free, in the device's
//                     context), cuMemGetAllocationGranularity(MINIMUM) for the frames' properties
//   reserve/unreserve cuMemAddressReserve(&va, size, alignment, 0, 0) / cuMemAddressFree
//   create_frame      cuMemCreate {PINNED, DEVICE ordinal, POSIX fd handle type}
//   export_frame      cuMemExportToShareableHandle -> int fd (caller's), FD_CLOEXEC set
//   import_frame      cuMemImportFromShareableHandle((void*)(uintptr_t)fd); the fd stays the
//                     caller's (the driver does not close or keep it)
//   create_host_frame cuMemCreate {PINNED, HOST_NUMA node of the device (0 without NUMA), no
//                     handle type}, after checking HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
//   release_frame     cuMemRelease (the memory goes when no process maps or holds it)
//   map / unmap       cuMemMap(va, size, offset, handle, 0) / cuMemUnmap, one call per
//                     mapping: the driver cannot unmap part of a mapping, and documents only
//                     whole mappings, so the base hands a run of several over one by one
//   set_access        cuMemSetAccess {DEVICE ordinal, PROT_READ | PROT_READWRITE}
//   host_alloc/free   cuMemHostAlloc(PORTABLE) / cuMemFreeHost
//   host_(un)register cuMemHostRegister_v2(PORTABLE) / cuMemHostUnregister
//   stream_*          cuStreamCreate(NON_BLOCKING), cuStreamSynchronize, destroy =
//                     synchronize + cuStreamDestroy_v2
//   copy_d2h/h2d      cuMemcpyDtoHAsync_v2 / cuMemcpyHtoDAsync_v2 on the stream
//   copy_d2d          cuMemcpyDtoDAsync_v2 on the stream
//   memset_d8         cuMemsetD8Async on the stream
//   event_*           cuEventCreate(DISABLE_TIMING), cuEventRecord, cuEventSynchronize,
//                     cuEventQuery (CUDA_ERROR_NOT_READY is "not complete", not an error),
//                     cuEventDestroy_v2, cuStreamWaitEvent
//   device_synchronize cuCtxSynchronize in the device's primary context
//   app_stream_capturing cuStreamIsCapturing on the application's stream
//                     (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the legacy stream during a global
//                     capture elsewhere, counts as capturing)
// Handles: frame, stream and event ids index tables of CUmemGenericAllocationHandle /
// CUstream / CUevent (ids from per-kind counters starting at 1, guarded by a mutex that is
// never held across a blocking driver call). Nothing else is kept here: which reservations,
// mappings and pinned ranges exist is the base class's books, the one record for both
// backends.
//
// Teardown: the destructor frees whatever the caller left (events, streams after a
// synchronize, mappings, reservations, frames, pinned memory; the middle three as the
// base's books list them), then releases the primary contexts it retained. It never throws; at process exit the driver may already be shut
// down, and CUDA_ERROR_DEINITIALIZED is then expected and ignored; anything else is logged.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/backend_impls.hpp"
#include "core/cuda/cuda_driver.hpp"
#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"

namespace vramswap::detail {
namespace {

using cuda::check;

unsigned long long hex(device_ptr p) { return static_cast<unsigned long long>(p); }

// The allocation properties of every frame, and of the granularity query.
CUmemAllocationProp frame_properties(CUdevice dev) {
  CUmemAllocationProp prop{};  // win32HandleMetaData and allocFlags must be zero
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;  // a device ordinal
  return prop;
}

// Best-effort teardown: log failures other than a driver already shut down; never throw.
void quietly(CUresult r, const char* what) noexcept {
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED) return;
  log(log_level::warn, "cuda: teardown: %s failed: %s (%s)", what, cuda::error_name(r), cuda::error_string(r));
}

// The destructor's tally: after a device fault (a kernel's illegal address, say) the context
// is unusable and every object left in it fails to be destroyed, thousands of them for a
// large pool; one line with the count and the first error says all that a line each would.
class teardown_tally {
 public:
  void note(CUresult r, const char* what) noexcept {
    ++attempted_;
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED) return;
    if (failed_++ == 0) {
      first_ = r;
      first_what_ = what;
    }
  }
  ~teardown_tally() {
    if (failed_ == 0) return;
    log(log_level::warn,
        "cuda: teardown: %zu of %zu driver objects (events, streams, mappings, reservations, frames, pinned memory) could not be "
        "destroyed; the first, %s, failed with %s (%s). After a device fault the context is unusable and the driver frees them "
        "when the process exits; an earlier error names the fault",
        failed_, attempted_, first_what_, cuda::error_name(first_), cuda::error_string(first_));
  }

 private:
  size_t attempted_ = 0, failed_ = 0;
  CUresult first_ = CUDA_SUCCESS;
  const char* first_what_ = "";
};

// Makes one device's primary context current on the calling thread for its lifetime, then
// puts back what the thread had current before (nothing is switched if it already was).
class context_scope {
 public:
  explicit context_scope(const cuda::driver& d) noexcept : d_(d) {}
  ~context_scope() {
    if (switched_) quietly(d_.cuCtxSetCurrent(previous_), "cuCtxSetCurrent(restoring the caller's context)");
  }
  context_scope(const context_scope&) = delete;
  context_scope& operator=(const context_scope&) = delete;

  int enter(CUcontext ctx, int device) noexcept {
    CUcontext current = nullptr;
    VS_TRY(check(d_.cuCtxGetCurrent(&current), "cuCtxGetCurrent()"));
    if (current == ctx) return 0;
    VS_TRY(check(d_.cuCtxSetCurrent(ctx), "cuCtxSetCurrent(primary context of device %d)", device));
    previous_ = current;
    switched_ = true;
    return 0;
  }

 private:
  const cuda::driver& d_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// For the length of a call, this thread may make "potentially unsafe" driver calls while
// another thread captures a CUDA graph. A capture in the default (global) mode forbids them
// on every thread and is invalidated by one (cuMemHostRegister, cuMemCreate, cuMemMap...);
// vramswap's own threads (pinning ahead, evictions, the oversubscribed job's migrations)
// make them at any time, never on the captured streams. PyTorch's allocator does the same
// around its cudaMalloc.
class relaxed_capture {
 public:
  explicit relaxed_capture(const cuda::driver& d) noexcept : d_(d) {
    mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
    exchanged_ = d_.cuThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
  }
  ~relaxed_capture() {
    if (exchanged_) quietly(d_.cuThreadExchangeStreamCaptureMode(&mode_), "cuThreadExchangeStreamCaptureMode(restoring)");
  }
  relaxed_capture(const relaxed_capture&) = delete;
  relaxed_capture& operator=(const relaxed_capture&) = delete;

 private:
  const cuda::driver& d_;
  CUstreamCaptureMode mode_;
  bool exchanged_ = false;
};

class cuda_backend final : public backend {
 public:
  cuda_backend(const cuda::driver& d, std::vector<CUdevice> devices)
      : backend(backend_kind::cuda), d_(d), devices_(std::move(devices)), contexts_(devices_.size(), nullptr) {}
  ~cuda_backend() override;

 private:
  struct frame_entry {
    CUmemGenericAllocationHandle handle;
    int device;
  };
  struct stream_entry {
    CUstream stream;
    int device;
  };
  struct event_entry {
    CUevent event;
    int device;
  };

  // Retain `device`'s primary context (first time only) and make it current in `scope`.
  int use_device(int device, context_scope* scope);
  int find_frame(const char* fn, frame_id frame, frame_entry* out);
  int find_stream(const char* fn, stream_id stream, stream_entry* out);
  int find_event(const char* fn, event_id event, event_entry* out);

  int do_device_count(int* count) override;
  int do_device_info(int device, device_info* out) override;
  int do_reserve(int device, size_t size, size_t alignment, device_ptr* out) override;
  int do_unreserve(int device, device_ptr va, size_t size) override;
  int do_create_frame(int device, size_t size, frame_id* out) override;
  int do_create_host_frame(int device, size_t size, frame_id* out) override;
  // Give a new CUDA allocation its frame id; released again if it cannot be recorded.
  int record_frame(const char* fn, CUmemGenericAllocationHandle handle, int device, frame_id* out);
  int do_export_frame(frame_id frame, int* fd_out) override;
  int do_import_frame(int device, int fd, size_t size, frame_id* out) override;
  int do_release_frame(frame_id frame) override;
  int do_map(int device, device_ptr va, size_t size, frame_id frame, size_t offset) override;
  int do_unmap(int device, device_ptr va, size_t size) override;
  int do_set_access(int device, device_ptr va, size_t size, access_flags flags) override;
  int do_host_alloc(size_t size, void** out) override;
  int do_host_free(void* ptr, size_t size) override;
  int do_host_register(void* ptr, size_t size) override;
  int do_host_unregister(void* ptr, size_t size) override;
  int do_stream_create(int device, stream_id* out) override;
  int do_stream_destroy(stream_id stream) override;
  int do_stream_synchronize(stream_id stream) override;
  int do_copy_d2h(int device, void* dst, device_ptr src, size_t size, stream_id stream) override;
  int do_copy_d2d(int device, device_ptr dst, device_ptr src, size_t size, stream_id stream) override;
  int do_copy_h2d(int device, device_ptr dst, const void* src, size_t size, stream_id stream) override;
  int do_memset_d8(int device, device_ptr dst, uint8_t value, size_t size, stream_id stream) override;
  int do_event_create(int device, event_id* out) override;
  int do_event_destroy(event_id event) override;
  int do_event_record(event_id event, stream_id stream) override;
  int do_event_synchronize(event_id event) override;
  int do_event_query(event_id event, bool* complete) override;
  int do_stream_wait_event(stream_id stream, event_id event) override;
  int do_device_synchronize(int device) override;
  int do_app_stream_capturing(int device, uintptr_t app_stream, bool* capturing) override;

  const cuda::driver& d_;
  const std::vector<CUdevice> devices_;  // by ordinal, from cuDeviceGet

  std::mutex context_mutex_;         // guards contexts_ (held while retaining one)
  std::vector<CUcontext> contexts_;  // retained primary contexts; null until first use

  // The CUDA objects behind the ids handed to the base. What exists, where, and how it is
  // mapped is in the base's books alone: reservations, mappings and pinned memory have no
  // CUDA handle, so they have no table here (the destructor reads them from the base).
  std::mutex table_mutex_;  // guards everything below; never held across a blocking call
  frame_id next_frame_ = 1;
  stream_id next_stream_ = 1;
  event_id next_event_ = 1;
  std::unordered_map<frame_id, frame_entry> frame_table_;
  std::unordered_map<stream_id, stream_entry> stream_table_;
  std::unordered_map<event_id, event_entry> event_table_;
};

// --- helpers ------------------------------------------------------------------------------

int cuda_backend::use_device(int device, context_scope* scope) {
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(context_mutex_);
    ctx = contexts_[static_cast<size_t>(device)];
    if (ctx == nullptr) {
      VS_TRY(check(d_.cuDevicePrimaryCtxRetain(&ctx, devices_[static_cast<size_t>(device)]),
                   "cuDevicePrimaryCtxRetain(device %d)", device));
      contexts_[static_cast<size_t>(device)] = ctx;
    }
  }
  return scope->enter(ctx, device);
}

int cuda_backend::find_frame(const char* fn, frame_id frame, frame_entry* out) {
  std::lock_guard<std::mutex> lock(table_mutex_);
  const auto it = frame_table_.find(frame);
  if (it == frame_table_.end()) return fail(err_internal, "%s: frame %" PRIu64 " has no CUDA handle", fn, frame);
  *out = it->second;
  return 0;
}

int cuda_backend::find_stream(const char* fn, stream_id stream, stream_entry* out) {
  std::lock_guard<std::mutex> lock(table_mutex_);
  const auto it = stream_table_.find(stream);
  if (it == stream_table_.end()) return fail(err_internal, "%s: stream %" PRIu64 " has no CUstream", fn, stream);
  *out = it->second;
  return 0;
}

int cuda_backend::find_event(const char* fn, event_id event, event_entry* out) {
  std::lock_guard<std::mutex> lock(table_mutex_);
  const auto it = event_table_.find(event);
  if (it == event_table_.end()) return fail(err_internal, "%s: event %" PRIu64 " has no CUevent", fn, event);
  *out = it->second;
  return 0;
}

// --- teardown -----------------------------------------------------------------------------

cuda_backend::~cuda_backend() {
  // Each object in its own device's context, in dependency order: work first (events,
  // streams), then address space (mappings before their reservations), then memory.
  // Failures are counted and logged once, at the end (teardown_tally).
  teardown_tally tally;
  for (const auto& [id, e] : event_table_) {
    context_scope scope(d_);
    if (use_device(e.device, &scope) != 0) continue;
    tally.note(d_.cuEventDestroy(e.event), "cuEventDestroy");
  }
  for (const auto& [id, s] : stream_table_) {
    context_scope scope(d_);
    if (use_device(s.device, &scope) != 0) continue;
    tally.note(d_.cuStreamSynchronize(s.stream), "cuStreamSynchronize");
    tally.note(d_.cuStreamDestroy(s.stream), "cuStreamDestroy");
  }
  visit_mappings([&](device_ptr va, size_t size, int device) {
    context_scope scope(d_);
    if (use_device(device, &scope) != 0) return;
    tally.note(d_.cuMemUnmap(va, size), "cuMemUnmap");
  });
  visit_reservations([&](device_ptr va, size_t size, int device) {
    context_scope scope(d_);
    if (use_device(device, &scope) != 0) return;
    tally.note(d_.cuMemAddressFree(va, size), "cuMemAddressFree");
  });
  for (const auto& [id, f] : frame_table_) {
    context_scope scope(d_);
    if (use_device(f.device, &scope) != 0) continue;
    tally.note(d_.cuMemRelease(f.handle), "cuMemRelease");
  }
  {
    // Device 0's context, entered only if there is pinned memory left to give back.
    context_scope scope(d_);
    bool entered = false, usable = false;
    visit_pinned([&](void* ptr, size_t, bool allocated) {
      if (!entered) {
        entered = true;
        usable = use_device(0, &scope) == 0;
      }
      if (!usable) return;
      if (allocated) {
        tally.note(d_.cuMemFreeHost(ptr), "cuMemFreeHost");
      } else {
        tally.note(d_.cuMemHostUnregister(ptr), "cuMemHostUnregister");
      }
    });
  }
  for (size_t i = 0; i < contexts_.size(); ++i) {
    if (contexts_[i] != nullptr) tally.note(d_.cuDevicePrimaryCtxRelease(devices_[i]), "cuDevicePrimaryCtxRelease");
  }
}

// --- devices ------------------------------------------------------------------------------

int cuda_backend::do_device_count(int* count) {
  *count = static_cast<int>(devices_.size());
  return 0;
}

int cuda_backend::do_device_info(int device, device_info* out) {
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  const CUdevice dev = devices_[static_cast<size_t>(device)];

  char name[256] = {};
  VS_TRY(check(d_.cuDeviceGetName(name, static_cast<int>(sizeof name) - 1, dev), "cuDeviceGetName(device %d)",
               device));
  CUuuid id{};
  VS_TRY(check(d_.cuDeviceGetUuid(&id, dev), "cuDeviceGetUuid_v2(device %d)", device));
  size_t total = 0;
  VS_TRY(check(d_.cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem_v2(device %d)", device));
  size_t free_bytes = 0;
  size_t ctx_total = 0;
  VS_TRY(check(d_.cuMemGetInfo(&free_bytes, &ctx_total), "cuMemGetInfo_v2() in device %d's context", device));
  const CUmemAllocationProp prop = frame_properties(dev);
  size_t granularity = 0;
  VS_TRY(check(d_.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               "cuMemGetAllocationGranularity(device %d, PINNED, POSIX fd, MINIMUM)", device));

  // nvidia-smi's form: GPU-8-4-4-4-12 lowercase hex digits.
  unsigned char b[16];
  for (int i = 0; i < 16; ++i) b[i] = static_cast<unsigned char>(id.bytes[i]);
  char uuid[64];
  std::snprintf(uuid, sizeof uuid,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
                b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  try {
    out->ordinal = device;
    out->name = name;
    out->uuid = uuid;
    out->total_bytes = total;
    out->free_bytes = free_bytes;
    out->granularity = granularity;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "device_info: out of host memory");
  }
  return 0;
}

// --- virtual address space ----------------------------------------------------------------

int cuda_backend::do_reserve(int device, size_t size, size_t alignment, device_ptr* out) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  CUdeviceptr va = 0;
  VS_TRY(check(d_.cuMemAddressReserve(&va, size, alignment, 0, 0),
               "cuMemAddressReserve(size=%zu, alignment=%zu, addr=0, flags=0) for device %d", size, alignment,
               device));
  *out = static_cast<device_ptr>(va);
  return 0;
}

int cuda_backend::do_unreserve(int device, device_ptr va, size_t size) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  VS_TRY(check(d_.cuMemAddressFree(va, size), "cuMemAddressFree(va=0x%llx, size=%zu) on device %d", hex(va), size,
               device));
  return 0;
}

// --- frames -------------------------------------------------------------------------------

int cuda_backend::do_create_frame(int device, size_t size, frame_id* out) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  const CUmemAllocationProp prop = frame_properties(devices_[static_cast<size_t>(device)]);
  CUmemGenericAllocationHandle handle = 0;
  VS_TRY(check(d_.cuMemCreate(&handle, size, &prop, 0),
               "cuMemCreate(size=%zu, PINNED on device %d, POSIX fd handle type)", size, device));
  return record_frame("create_frame", handle, device, out);
}

// Host memory on the NUMA node nearest the device (node 0 where the system has no NUMA, as
// cuMemCreate asks), not exportable. Mapped and made accessible to the device like any frame.
int cuda_backend::do_create_host_frame(int device, size_t size, frame_id* out) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  const CUdevice dev = devices_[static_cast<size_t>(device)];
  int supported = 0;
  VS_TRY(check(d_.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
               "cuDeviceGetAttribute(HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device %d)", device));
  if (supported == 0) {
    return fail(err_unavailable,
                "create_host_frame: device %d (or its driver) does not support host memory through the virtual memory API "
                "(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); it needs CUDA 12.2+ and a "
                "recent driver",
                device);
  }
  int numa = -1;
  VS_TRY(check(d_.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev),
               "cuDeviceGetAttribute(HOST_NUMA_ID, device %d)", device));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = numa < 0 ? 0 : numa;
  size_t gran = 0;
  VS_TRY(check(d_.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               "cuMemGetAllocationGranularity(HOST_NUMA node %d, MINIMUM)", prop.location.id));
  if (gran == 0 || size % gran != 0) {
    return fail(err_invalid_argument, "create_host_frame: size %zu is not a multiple of host NUMA node %d's granularity %zu", size,
                prop.location.id, gran);
  }
  CUmemGenericAllocationHandle handle = 0;
  VS_TRY(check(d_.cuMemCreate(&handle, size, &prop, 0), "cuMemCreate(size=%zu, PINNED in host NUMA node %d, for device %d)", size,
               prop.location.id, device));
  return record_frame("create_host_frame", handle, device, out);
}

int cuda_backend::record_frame(const char* fn, CUmemGenericAllocationHandle handle, int device, frame_id* out) {
  try {
    std::lock_guard<std::mutex> lock(table_mutex_);
    const frame_id id = next_frame_;
    frame_table_.emplace(id, frame_entry{handle, device});
    ++next_frame_;
    *out = id;
  } catch (const std::bad_alloc&) {
    quietly(d_.cuMemRelease(handle), "cuMemRelease (undoing a frame that could not be recorded)");
    return fail(err_out_of_memory, "%s: out of host memory recording the frame", fn);
  }
  return 0;
}

int cuda_backend::do_export_frame(frame_id frame, int* fd_out) {
  frame_entry f{};
  VS_TRY(find_frame("export_frame", frame, &f));
  context_scope scope(d_);
  VS_TRY(use_device(f.device, &scope));
  int fd = -1;  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: the handle is an int
  VS_TRY(check(d_.cuMemExportToShareableHandle(&fd, f.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               "cuMemExportToShareableHandle(frame %" PRIu64 " on device %d, POSIX fd)", frame, f.device));
  const int flags = fcntl(fd, F_GETFD);
  if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
    const int e = errno;
    close(fd);
    return fail_errno(e, "export_frame: fcntl(fd %d, FD_CLOEXEC) for frame %" PRIu64, fd, frame);
  }
  *fd_out = fd;
  return 0;
}

int cuda_backend::do_import_frame(int device, int fd, size_t size, frame_id* out) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  CUmemGenericAllocationHandle handle = 0;
  // For POSIX fds the "OS handle" is the descriptor's value cast to a pointer; the driver
  // neither closes it nor keeps it.
  VS_TRY(check(d_.cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               "cuMemImportFromShareableHandle(fd %d, POSIX fd) for device %d, size %zu", fd, device, size));
  // Say so if the memory is not on the device the caller named: mapped there it would
  // still work, over the peer link, at a fraction of the speed. Only a warning, because
  // the ordinal the driver reports for another process's allocation has not been verified
  // under differing CUDA_VISIBLE_DEVICES.
  CUmemAllocationProp prop{};
  if (const int rc = check(d_.cuMemGetAllocationPropertiesFromHandle(&prop, handle),
                           "cuMemGetAllocationPropertiesFromHandle(fd %d)", fd);
      rc != 0) {
    quietly(d_.cuMemRelease(handle), "cuMemRelease (undoing an import)");
    return rc;
  }
  if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id != devices_[static_cast<size_t>(device)]) {
    log(log_level::warn, "cuda: import_frame: fd %d holds memory of device %d, imported for device %d", fd,
        prop.location.id, device);
  }
  return record_frame("import_frame", handle, device, out);
}

int cuda_backend::do_release_frame(frame_id frame) {
  const relaxed_capture relaxed(d_);
  frame_entry f{};
  VS_TRY(find_frame("release_frame", frame, &f));
  context_scope scope(d_);
  VS_TRY(use_device(f.device, &scope));
  VS_TRY(check(d_.cuMemRelease(f.handle), "cuMemRelease(frame %" PRIu64 " on device %d)", frame, f.device));
  std::lock_guard<std::mutex> lock(table_mutex_);
  frame_table_.erase(frame);
  return 0;
}

// --- mappings -----------------------------------------------------------------------------

int cuda_backend::do_map(int device, device_ptr va, size_t size, frame_id frame, size_t offset) {
  const relaxed_capture relaxed(d_);
  frame_entry f{};
  VS_TRY(find_frame("map", frame, &f));
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  VS_TRY(check(d_.cuMemMap(va, size, offset, f.handle, 0),
               "cuMemMap(va=0x%llx, size=%zu, offset=%zu, frame %" PRIu64 ", flags=0) on device %d", hex(va), size,
               offset, frame, device));
  return 0;
}

int cuda_backend::do_unmap(int device, device_ptr va, size_t size) {
  const relaxed_capture relaxed(d_);
  // One whole mapping: the base takes a run of them one at a time.
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  return check(d_.cuMemUnmap(va, size), "cuMemUnmap(va=0x%llx, size=%zu) on device %d", hex(va), size, device);
}

int cuda_backend::do_set_access(int device, device_ptr va, size_t size, access_flags flags) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = devices_[static_cast<size_t>(device)];
  desc.flags = flags == access_flags::read ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  VS_TRY(check(d_.cuMemSetAccess(va, size, &desc, 1), "cuMemSetAccess(va=0x%llx, size=%zu, device %d, %s)", hex(va),
               size, device, flags == access_flags::read ? "PROT_READ" : "PROT_READWRITE"));
  return 0;
}

// --- pinned host memory (device 0's primary context; PORTABLE, so usable with every device)

int cuda_backend::do_host_alloc(size_t size, void** out) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(0, &scope));
  void* p = nullptr;
  VS_TRY(check(d_.cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc(size=%zu, PORTABLE)", size));
  *out = p;
  return 0;
}

int cuda_backend::do_host_free(void* ptr, size_t size) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(0, &scope));
  return check(d_.cuMemFreeHost(ptr), "cuMemFreeHost(%p) (%zu bytes)", ptr, size);
}

int cuda_backend::do_host_register(void* ptr, size_t size) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(0, &scope));
  VS_TRY(check(d_.cuMemHostRegister(ptr, size, CU_MEMHOSTREGISTER_PORTABLE),
               "cuMemHostRegister_v2(%p, size=%zu, PORTABLE)", ptr, size));
  return 0;
}

int cuda_backend::do_host_unregister(void* ptr, size_t size) {
  const relaxed_capture relaxed(d_);
  context_scope scope(d_);
  VS_TRY(use_device(0, &scope));
  return check(d_.cuMemHostUnregister(ptr), "cuMemHostUnregister(%p) (%zu bytes)", ptr, size);
}

// --- streams and copies -------------------------------------------------------------------

int cuda_backend::do_stream_create(int device, stream_id* out) {
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  CUstream s = nullptr;
  VS_TRY(check(d_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate(NON_BLOCKING) on device %d", device));
  try {
    std::lock_guard<std::mutex> lock(table_mutex_);
    const stream_id id = next_stream_;
    stream_table_.emplace(id, stream_entry{s, device});
    ++next_stream_;
    *out = id;
  } catch (const std::bad_alloc&) {
    quietly(d_.cuStreamDestroy(s), "cuStreamDestroy (undoing a stream)");
    return fail(err_out_of_memory, "stream_create: out of host memory recording the stream");
  }
  return 0;
}

int cuda_backend::do_stream_destroy(stream_id stream) {
  stream_entry s{};
  VS_TRY(find_stream("stream_destroy", stream, &s));
  context_scope scope(d_);
  VS_TRY(use_device(s.device, &scope));
  // Its work first, as the interface promises. A failed synchronize (an earlier copy
  // faulted) is reported, but the stream is destroyed all the same: there is nothing
  // left to wait for, and keeping it would only leak it.
  const int sync_rc = check(d_.cuStreamSynchronize(s.stream), "cuStreamSynchronize(stream %" PRIu64 ", device %d)",
                            stream, s.device);
  const CUresult destroyed = d_.cuStreamDestroy(s.stream);
  if (destroyed == CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(table_mutex_);
    stream_table_.erase(stream);
  }
  if (sync_rc != 0) return sync_rc;
  return check(destroyed, "cuStreamDestroy_v2(stream %" PRIu64 ", device %d)", stream, s.device);
}

int cuda_backend::do_stream_synchronize(stream_id stream) {
  stream_entry s{};
  VS_TRY(find_stream("stream_synchronize", stream, &s));
  context_scope scope(d_);
  VS_TRY(use_device(s.device, &scope));
  return check(d_.cuStreamSynchronize(s.stream), "cuStreamSynchronize(stream %" PRIu64 ", device %d)", stream,
               s.device);
}

int cuda_backend::do_copy_d2h(int device, void* dst, device_ptr src, size_t size, stream_id stream) {
  stream_entry s{};
  VS_TRY(find_stream("copy_d2h", stream, &s));
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  return check(d_.cuMemcpyDtoHAsync(dst, src, size, s.stream),
               "cuMemcpyDtoHAsync_v2(dst=%p, src=0x%llx, size=%zu, stream %" PRIu64 ") on device %d", dst, hex(src),
               size, stream, device);
}

int cuda_backend::do_copy_h2d(int device, device_ptr dst, const void* src, size_t size, stream_id stream) {
  stream_entry s{};
  VS_TRY(find_stream("copy_h2d", stream, &s));
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  return check(d_.cuMemcpyHtoDAsync(dst, src, size, s.stream),
               "cuMemcpyHtoDAsync_v2(dst=0x%llx, src=%p, size=%zu, stream %" PRIu64 ") on device %d", hex(dst), src,
               size, stream, device);
}

int cuda_backend::do_memset_d8(int device, device_ptr dst, uint8_t value, size_t size, stream_id stream) {
  stream_entry s{};
  VS_TRY(find_stream("memset_d8", stream, &s));
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  return check(d_.cuMemsetD8Async(dst, value, size, s.stream),
               "cuMemsetD8Async(dst=0x%llx, value=0x%02x, size=%zu, stream %" PRIu64 ") on device %d", hex(dst),
               static_cast<unsigned>(value), size, stream, device);
}

int cuda_backend::do_copy_d2d(int device, device_ptr dst, device_ptr src, size_t size, stream_id stream) {
  stream_entry s{};
  VS_TRY(find_stream("copy_d2d", stream, &s));
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  return check(d_.cuMemcpyDtoDAsync(dst, src, size, s.stream),
               "cuMemcpyDtoDAsync_v2(dst=0x%llx, src=0x%llx, size=%zu, stream %" PRIu64 ") on device %d", hex(dst), hex(src),
               size, stream, device);
}

// --- events -------------------------------------------------------------------------------

int cuda_backend::do_event_create(int device, event_id* out) {
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  CUevent e = nullptr;
  VS_TRY(check(d_.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate(DISABLE_TIMING) on device %d", device));
  try {
    std::lock_guard<std::mutex> lock(table_mutex_);
    const event_id id = next_event_;
    event_table_.emplace(id, event_entry{e, device});
    ++next_event_;
    *out = id;
  } catch (const std::bad_alloc&) {
    quietly(d_.cuEventDestroy(e), "cuEventDestroy (undoing an event)");
    return fail(err_out_of_memory, "event_create: out of host memory recording the event");
  }
  return 0;
}

int cuda_backend::do_event_destroy(event_id event) {
  event_entry e{};
  VS_TRY(find_event("event_destroy", event, &e));
  context_scope scope(d_);
  VS_TRY(use_device(e.device, &scope));
  VS_TRY(check(d_.cuEventDestroy(e.event), "cuEventDestroy_v2(event %" PRIu64 ", device %d)", event, e.device));
  std::lock_guard<std::mutex> lock(table_mutex_);
  event_table_.erase(event);
  return 0;
}

int cuda_backend::do_event_record(event_id event, stream_id stream) {
  event_entry e{};
  stream_entry s{};
  VS_TRY(find_event("event_record", event, &e));
  VS_TRY(find_stream("event_record", stream, &s));
  context_scope scope(d_);
  VS_TRY(use_device(s.device, &scope));
  return check(d_.cuEventRecord(e.event, s.stream),
               "cuEventRecord(event %" PRIu64 " of device %d, stream %" PRIu64 " of device %d)", event, e.device,
               stream, s.device);
}

int cuda_backend::do_event_synchronize(event_id event) {
  event_entry e{};
  VS_TRY(find_event("event_synchronize", event, &e));
  context_scope scope(d_);
  VS_TRY(use_device(e.device, &scope));
  return check(d_.cuEventSynchronize(e.event), "cuEventSynchronize(event %" PRIu64 ", device %d)", event, e.device);
}

int cuda_backend::do_event_query(event_id event, bool* complete) {
  event_entry e{};
  VS_TRY(find_event("event_query", event, &e));
  context_scope scope(d_);
  VS_TRY(use_device(e.device, &scope));
  const CUresult r = d_.cuEventQuery(e.event);
  if (r == CUDA_ERROR_NOT_READY) {
    *complete = false;
    return 0;
  }
  VS_TRY(check(r, "cuEventQuery(event %" PRIu64 ", device %d)", event, e.device));
  *complete = true;
  return 0;
}

int cuda_backend::do_stream_wait_event(stream_id stream, event_id event) {
  stream_entry s{};
  event_entry e{};
  VS_TRY(find_stream("stream_wait_event", stream, &s));
  VS_TRY(find_event("stream_wait_event", event, &e));
  context_scope scope(d_);
  VS_TRY(use_device(s.device, &scope));
  return check(d_.cuStreamWaitEvent(s.stream, e.event, CU_EVENT_WAIT_DEFAULT),
               "cuStreamWaitEvent(stream %" PRIu64 " of device %d, event %" PRIu64 " of device %d)", stream,
               s.device, event, e.device);
}

int cuda_backend::do_device_synchronize(int device) {
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  return check(d_.cuCtxSynchronize(), "cuCtxSynchronize() in device %d's primary context", device);
}

int cuda_backend::do_app_stream_capturing(int device, uintptr_t app_stream, bool* capturing) {
  context_scope scope(d_);
  VS_TRY(use_device(device, &scope));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = d_.cuStreamIsCapturing(reinterpret_cast<CUstream>(app_stream), &status);
  // Asking about the legacy default stream while another stream captures in global mode is
  // itself refused, with this error: a capture is underway.
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    *capturing = true;
    return ok;
  }
  VS_TRY(check(r, "cuStreamIsCapturing(stream 0x%" PRIxPTR ", device %d)", app_stream, device));
  *capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
  return ok;
}

}  // namespace

// --- construction -------------------------------------------------------------------------

int make_cuda_backend(std::unique_ptr<backend>* out) {
  out->reset();
  const cuda::driver* d = nullptr;
  VS_TRY(cuda::load_driver(&d));

  const std::optional<std::string> visible = process_foreign_environment().cuda_visible_devices;
  if (const CUresult r = d->cuInit(0); r != CUDA_SUCCESS) {
    return fail(err_unavailable, "cuInit(0) failed: %s (%s)%s%s", cuda::error_name(r), cuda::error_string(r),
                visible ? "; CUDA_VISIBLE_DEVICES=" : "", visible ? visible->c_str() : "");
  }
  int count = 0;
  if (const CUresult r = d->cuDeviceGetCount(&count); r != CUDA_SUCCESS) {
    return fail(err_unavailable, "cuDeviceGetCount() failed: %s (%s)", cuda::error_name(r), cuda::error_string(r));
  }
  if (count <= 0) {
    return fail(err_unavailable, "no CUDA device is visible: cuDeviceGetCount() = 0%s%s%s",
                visible ? " (CUDA_VISIBLE_DEVICES=" : "", visible ? visible->c_str() : "", visible ? ")" : "");
  }
  try {
    std::vector<CUdevice> devices(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      VS_TRY(check(d->cuDeviceGet(&devices[static_cast<size_t>(i)], i), "cuDeviceGet(ordinal %d)", i));
    }
    out->reset(new cuda_backend(*d, std::move(devices)));
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "make_cuda_backend: out of host memory");
  }
  log(log_level::debug, "cuda: backend ready: %d device(s), driver for CUDA %d.%d", count,
      d->driver_version / 1000, d->driver_version % 1000 / 10);
  return 0;
}

}  // namespace vramswap::detail
