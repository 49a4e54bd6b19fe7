// The driver's virtual memory API, virtualized (preload/shim.hpp): a program's cuMemCreate
// allocations become vramswap pages in its arena, at the addresses it maps them at.
//
// What the program sees is the driver's model; what is behind it is vramswap's:
//   cuMemAddressReserve  addresses reserved in this process's arena (runtime: reserve_addresses),
//                        with nothing behind them. They are the program's for its life: the
//                        pager never moves them, whatever happens to the memory.
//   cuMemCreate          a handle the shim makes (no memory yet): device, size, properties.
//   cuMemMap             the handle's memory, placed at that address (runtime: map_at): pages
//                        backed from the pool now, swapped out and back as any vramswap memory.
//   cuMemSetAccess       the pager maps its frames read-write: granting read or read-write to
//                        the mapping's own device is what the memory already has.
//   cuMemUnmap/Release   the driver's rule, that an allocation lives until it is both
//                        released and unmapped: the memory goes back to the pool then.
// A handle unmapped while still referenced (not yet released, or retained) keeps its bytes,
// where they were mapped: mapping it again there finds them. Mapping it at another address,
// mapping it twice, mapping a part of it, mapping another handle over it, sharing it with
// another process (export), and mapping memory of another process (import) into vramswap's
// addresses are refused with CUDA_ERROR_NOT_SUPPORTED and a log line that says why.
//
// Handles and addresses the shim did not make (host memory, whose cuMemCreate goes to the
// driver, and everything from before the shim) go to the real functions.
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "runtime/runtime.hpp"
#include "shim.hpp"

namespace vramswap::detail::preload {
namespace {

// Handles the shim makes: a recognisable pattern ("vS" in the top bytes), then a counter.
constexpr CUmemGenericAllocationHandle k_handle_tag = 0x7653'0000'0000'0000ull;

struct allocation {        // one cuMemCreate
  int device = 0;
  size_t size = 0;
  CUmemAllocationProp prop{};
  int references = 1;      // the create, plus retains, less releases
  CUdeviceptr placed = 0;  // where its memory is (0: none yet)
  bool mapped = false;     // mapped there now (else kept for a next map at `placed`)
};

struct reservation {
  int device = 0;
  size_t size = 0;
};

std::mutex g_mutex;
std::unordered_map<CUmemGenericAllocationHandle, allocation> g_handles;
std::map<CUdeviceptr, reservation> g_reservations;              // start -> reservation
std::map<CUdeviceptr, CUmemGenericAllocationHandle> g_placed;    // memory's start -> its handle
uint64_t g_next_handle = 1;

allocation* ours(CUmemGenericAllocationHandle h) {
  auto it = g_handles.find(h);
  return it == g_handles.end() ? nullptr : &it->second;
}

// The shim's reservation holding [ptr, ptr + size), or end().
std::map<CUdeviceptr, reservation>::iterator reservation_holding(CUdeviceptr ptr, size_t size) {
  auto it = g_reservations.upper_bound(ptr);
  if (it == g_reservations.begin()) return g_reservations.end();
  --it;
  const bool inside = ptr - it->first < it->second.size && size <= it->second.size - (ptr - it->first);
  return inside ? it : g_reservations.end();
}

// The memory placed at an address holding `ptr`, or end().
std::map<CUdeviceptr, CUmemGenericAllocationHandle>::iterator placed_holding(CUdeviceptr ptr) {
  auto it = g_placed.upper_bound(ptr);
  if (it == g_placed.begin()) return g_placed.end();
  --it;
  return ptr - it->first < g_handles.at(it->second).size ? it : g_placed.end();
}

// Walking from `ptr` over mappings side by side: where the walk ended. At or past
// ptr + size when [ptr, ptr + size) is covered by whole mappings (past it when the last one
// runs on); else the first address in it where nothing is mapped.
CUdeviceptr mapped_run_end(CUdeviceptr ptr, size_t size) {
  CUdeviceptr at = ptr;
  while (at < ptr + size) {
    auto p = g_placed.find(at);
    if (p == g_placed.end() || !g_handles.at(p->second).mapped) return at;
    at += g_handles.at(p->second).size;
  }
  return at;
}

CUresult refuse(CUresult code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
CUresult refuse(CUresult code, const char* fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  rt::log_line(rt::log_severity::warn, "preload: %s", text);
  return code;
}

// The driver's granularity for device memory of `device` (what sizes and addresses must be
// multiples of); 0 if the driver does not say.
size_t granularity(int device) {
  static auto get = driver<CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags)>(
      "cuMemGetAllocationGranularity");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t g = 0;
  if (get == nullptr || get(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) return 0;
  return g;
}

// The memory of `a` goes back to vramswap (it is released and not mapped).
void give_back(CUmemGenericAllocationHandle h, allocation& a) {
  if (a.placed != 0) {
    if (const int rc = rt::free(a.device, a.placed); rc != VRAMSWAP_OK) {
      rt::log_line(rt::log_severity::warn, "preload: cuMemRelease: giving back the memory at 0x%llx: %s",
                   static_cast<unsigned long long>(a.placed), rt::last_error());
    }
    g_placed.erase(a.placed);
  }
  g_handles.erase(h);
}

}  // namespace

CUresult vmm_address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr /*addr: a hint*/, unsigned long long flags) {
  if (ptr == nullptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (current_device(&device) != CUDA_SUCCESS) device = 0;  // addresses are the process's, not a context's
  const size_t g = granularity(device);
  if (g != 0 && (size % g != 0 || alignment % g != 0)) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p = 0;
  if (const int rc = rt::reserve_addresses(device, size, alignment, &p); rc != VRAMSWAP_OK) return as_cuda(rc, "cuMemAddressReserve");
  std::lock_guard<std::mutex> guard(g_mutex);
  g_reservations.emplace(p, reservation{device, size});
  *ptr = p;
  return CUDA_SUCCESS;
}

CUresult vmm_address_free(CUdeviceptr ptr, size_t size) {
  std::unique_lock<std::mutex> guard(g_mutex);
  auto it = g_reservations.find(ptr);
  if (it == g_reservations.end()) {
    guard.unlock();
    static auto real = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
    return real != nullptr ? real(ptr, size) : CUDA_ERROR_INVALID_VALUE;
  }
  if (size != it->second.size) return CUDA_ERROR_INVALID_VALUE;  // the driver's rule: the whole reservation
  // Memory kept at these addresses for handles unmapped but still referenced goes too: the
  // addresses it would be mapped at again are gone.
  for (auto p = g_placed.lower_bound(ptr); p != g_placed.end() && p->first < ptr + size;) {
    allocation& a = g_handles.at(p->second);
    if (a.mapped) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(0x%llx, %zu): memory is still mapped at 0x%llx; unmap it first",
                                static_cast<unsigned long long>(ptr), size, static_cast<unsigned long long>(p->first));
    ++p;
  }
  for (auto p = g_placed.lower_bound(ptr); p != g_placed.end() && p->first < ptr + size;) {
    const CUmemGenericAllocationHandle h = p->second;
    allocation& a = g_handles.at(h);
    ++p;
    if (const int rc = rt::free(a.device, a.placed); rc != VRAMSWAP_OK) return as_cuda(rc, "cuMemAddressFree");
    g_placed.erase(a.placed);
    a.placed = 0;  // the handle lives on, empty: mapped again, it gets new memory
  }
  if (const int rc = rt::free_addresses(it->second.device, ptr); rc != VRAMSWAP_OK) return as_cuda(rc, "cuMemAddressFree");
  g_reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult vmm_create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop, unsigned long long flags) {
  if (handle == nullptr || prop == nullptr || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    // Host memory (HOST, HOST_NUMA) is not the device's: the driver's. Any other kind of
    // device memory is not virtualized: said, and counted outside the pool.
    static auto real = driver<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)>(
        "cuMemCreate");
    if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult r = real(handle, size, prop, flags);
    if (r == CUDA_SUCCESS && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
      note_bypass("cuMemCreate (an allocation type other than pinned)", prop->location.id, size, 0);
    }
    return r;
  }
  int count = 0;
  if (device_count(&count) != CUDA_SUCCESS || prop->location.id < 0 || prop->location.id >= count) return CUDA_ERROR_INVALID_DEVICE;
  const int device = prop->location.id;
  const size_t g = granularity(device);
  if (g != 0 && size % g != 0) return CUDA_ERROR_INVALID_VALUE;
  allocation a;
  a.device = device;
  a.size = size;
  a.prop = *prop;
  // What the pool's frames are: not compressible (the driver's own answer where compression
  // is not available; a program is expected to check it with GetAllocationPropertiesFromHandle).
  a.prop.allocFlags.compressionType = 0;
  std::lock_guard<std::mutex> guard(g_mutex);
  const CUmemGenericAllocationHandle h = k_handle_tag | g_next_handle++;
  g_handles.emplace(h, a);
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult vmm_release(CUmemGenericAllocationHandle handle) {
  std::unique_lock<std::mutex> guard(g_mutex);
  allocation* a = ours(handle);
  if (a == nullptr) {
    guard.unlock();
    static auto real = driver<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
    return real != nullptr ? real(handle) : CUDA_ERROR_INVALID_VALUE;
  }
  if (--a->references == 0 && !a->mapped) give_back(handle, *a);
  return CUDA_SUCCESS;
}

CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::unique_lock<std::mutex> guard(g_mutex);
  allocation* a = ours(handle);
  const auto res = reservation_holding(ptr, size);
  if (a == nullptr) {
    if (res != g_reservations.end()) {
      return refuse(CUDA_ERROR_NOT_SUPPORTED,
                    "cuMemMap(0x%llx, %zu): the allocation is not vramswap's (memory of another process, imported, or made before the "
                    "shim), and these addresses are: vramswap cannot place memory it does not manage in its arena",
                    static_cast<unsigned long long>(ptr), size);
    }
    guard.unlock();
    static auto real = driver<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>("cuMemMap");
    return real != nullptr ? real(ptr, size, offset, handle, flags) : CUDA_ERROR_INVALID_VALUE;
  }
  if (res == g_reservations.end()) {
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap(0x%llx, %zu): not inside addresses reserved with cuMemAddressReserve under the shim",
                  static_cast<unsigned long long>(ptr), size);
  }
  if (offset != 0 || size != a->size) {
    return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemMap(0x%llx, %zu, offset %zu): maps part of an allocation of %zu bytes; vramswap maps whole "
                  "allocations only", static_cast<unsigned long long>(ptr), size, offset, a->size);
  }
  if (a->mapped) {
    return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemMap(0x%llx): the allocation is mapped at 0x%llx already; vramswap maps an allocation "
                  "at one address only", static_cast<unsigned long long>(ptr), static_cast<unsigned long long>(a->placed));
  }
  if (a->placed != 0 && a->placed != ptr) {
    return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemMap(0x%llx): the allocation's bytes are at 0x%llx, where it was mapped before; vramswap "
                  "maps it again there only", static_cast<unsigned long long>(ptr), static_cast<unsigned long long>(a->placed));
  }
  if (a->device != res->second.device) {
    return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemMap(0x%llx): memory of device %d into addresses of device %d's arena; vramswap maps "
                  "a device's memory into its own arena only", static_cast<unsigned long long>(ptr), a->device, res->second.device);
  }
  if (a->placed == 0) {
    const auto kept = placed_holding(ptr + size - 1);
    if (kept != g_placed.end() && kept->first + g_handles.at(kept->second).size > ptr) {
      return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemMap(0x%llx, %zu): an allocation unmapped but not released keeps its bytes at 0x%llx; "
                    "release it (cuMemRelease) before mapping other memory there", static_cast<unsigned long long>(ptr), size,
                    static_cast<unsigned long long>(kept->first));
    }
    const int device = a->device;
    guard.unlock();  // taking the device's turn may wait for other processes
    if (const CUresult r = ensure_turn(device); r != CUDA_SUCCESS) return r;
    guard.lock();
    a = ours(handle);
    if (a == nullptr || a->placed != 0 || a->mapped) return CUDA_ERROR_INVALID_VALUE;  // released or mapped meanwhile
    if (const int rc = rt::map_at(device, ptr, size); rc != VRAMSWAP_OK) return as_cuda(rc, "cuMemMap");
    a->placed = ptr;
    g_placed.emplace(ptr, handle);
  }
  a->mapped = true;
  return CUDA_SUCCESS;
}

CUresult vmm_unmap(CUdeviceptr ptr, size_t size) {
  std::unique_lock<std::mutex> guard(g_mutex);
  if (reservation_holding(ptr, size) == g_reservations.end()) {
    guard.unlock();
    static auto real = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
    return real != nullptr ? real(ptr, size) : CUDA_ERROR_INVALID_VALUE;
  }
  // [ptr, ptr + size) must be a run of whole mappings (checked before anything changes).
  const CUdeviceptr end = mapped_run_end(ptr, size);
  if (end < ptr + size) {
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap(0x%llx, %zu): nothing is mapped at 0x%llx (a range of whole mappings is unmapped)",
                  static_cast<unsigned long long>(ptr), size, static_cast<unsigned long long>(end));
  }
  if (end > ptr + size) return CUDA_ERROR_INVALID_VALUE;
  // A kernel may still use the memory: the pool gets it only after the device's work.
  static auto ctx_sync = driver<CUresult (*)()>("cuCtxSynchronize");
  if (ctx_sync != nullptr) ctx_sync();
  for (CUdeviceptr at = ptr; at < ptr + size;) {
    const CUmemGenericAllocationHandle h = g_placed.at(at);
    allocation& a = g_handles.at(h);
    at += a.size;
    a.mapped = false;
    if (a.references == 0) give_back(h, a);
  }
  return CUDA_SUCCESS;
}

CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  std::unique_lock<std::mutex> guard(g_mutex);
  const auto res = reservation_holding(ptr, size);
  if (res == g_reservations.end()) {
    guard.unlock();
    static auto real = driver<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>("cuMemSetAccess");
    return real != nullptr ? real(ptr, size, desc, count) : CUDA_ERROR_INVALID_VALUE;
  }
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (const CUdeviceptr end = mapped_run_end(ptr, size); end < ptr + size) {
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess(0x%llx, %zu): nothing is mapped at 0x%llx",
                  static_cast<unsigned long long>(ptr), size, static_cast<unsigned long long>(end));
  }
  for (size_t i = 0; i < count; ++i) {
    const CUmemAccessDesc& d = desc[i];
    if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE || d.location.id != res->second.device) {
      return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemSetAccess(0x%llx, %zu): access for %s %d; vramswap's memory is accessible to its own "
                    "device (%d) only", static_cast<unsigned long long>(ptr), size,
                    d.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? "device" : "location type", d.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? d.location.id : static_cast<int>(d.location.type),
                    res->second.device);
    }
    if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemSetAccess(0x%llx, %zu): flags %d; vramswap's memory stays readable and writable while "
                    "mapped (no access cannot be set)", static_cast<unsigned long long>(ptr), size, static_cast<int>(d.flags));
    }
  }
  return CUDA_SUCCESS;  // the pager granted read-write when it mapped the frames
}

CUresult vmm_get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  std::unique_lock<std::mutex> guard(g_mutex);
  const auto res = reservation_holding(ptr, 1);
  if (res == g_reservations.end()) {
    guard.unlock();
    static auto real = driver<CUresult (*)(unsigned long long*, const CUmemLocation*, CUdeviceptr)>("cuMemGetAccess");
    return real != nullptr ? real(flags, location, ptr) : CUDA_ERROR_INVALID_VALUE;
  }
  if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto p = placed_holding(ptr);
  const bool mapped = p != g_placed.end() && g_handles.at(p->second).mapped;
  const bool own = location->type == CU_MEM_LOCATION_TYPE_DEVICE && location->id == res->second.device;
  *flags = mapped && own ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

CUresult vmm_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr) {
  const auto ptr = reinterpret_cast<CUdeviceptr>(addr);
  std::unique_lock<std::mutex> guard(g_mutex);
  if (reservation_holding(ptr, 1) == g_reservations.end()) {
    guard.unlock();
    static auto real = driver<CUresult (*)(CUmemGenericAllocationHandle*, void*)>("cuMemRetainAllocationHandle");
    return real != nullptr ? real(handle, addr) : CUDA_ERROR_INVALID_VALUE;
  }
  const auto p = placed_holding(ptr);
  if (handle == nullptr || p == g_placed.end() || !g_handles.at(p->second).mapped) return CUDA_ERROR_INVALID_VALUE;
  ++g_handles.at(p->second).references;
  *handle = p->second;
  return CUDA_SUCCESS;
}

CUresult vmm_get_allocation_properties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  std::unique_lock<std::mutex> guard(g_mutex);
  const allocation* a = ours(handle);
  if (a == nullptr) {
    guard.unlock();
    static auto real = driver<CUresult (*)(CUmemAllocationProp*, CUmemGenericAllocationHandle)>("cuMemGetAllocationPropertiesFromHandle");
    return real != nullptr ? real(prop, handle) : CUDA_ERROR_INVALID_VALUE;
  }
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *prop = a->prop;
  return CUDA_SUCCESS;
}

CUresult vmm_export(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type, unsigned long long flags) {
  {
    std::lock_guard<std::mutex> guard(g_mutex);
    if (ours(handle) != nullptr) {
      return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemExportToShareableHandle: vramswap's memory cannot be shared with another process (its "
                    "pages move between frames and host memory); the program's IPC of this allocation fails");
    }
  }
  static auto real = driver<CUresult (*)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)>(
      "cuMemExportToShareableHandle");
  return real != nullptr ? real(shareable, handle, type, flags) : CUDA_ERROR_INVALID_VALUE;
}

CUresult vmm_map_array_async(CUarrayMapInfo* info, unsigned int count, CUstream stream) {
  {
    std::lock_guard<std::mutex> guard(g_mutex);
    for (unsigned int i = 0; info != nullptr && i < count; ++i) {
      if (info[i].memHandleType == CU_MEM_HANDLE_TYPE_GENERIC && ours(info[i].memHandle.memHandle) != nullptr) {
        return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuMemMapArrayAsync: vramswap's memory cannot back a sparse CUDA array");
      }
    }
  }
  static auto real = driver<CUresult (*)(CUarrayMapInfo*, unsigned int, CUstream)>("cuMemMapArrayAsync");
  return real != nullptr ? real(info, count, stream) : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace vramswap::detail::preload
