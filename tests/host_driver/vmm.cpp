// The host driver's virtual memory management API (see driver_state.hpp), in the memory
// model of vramswap's host backend (core/host/host_backend.cpp):
//
//   cuMemCreate                     a memfd of the size (a multiple of the 2 MiB granularity)
//   cuMemAddressReserve             mmap(PROT_NONE, MAP_NORESERVE), trimmed to the alignment
//   cuMemMap                        mmap(MAP_SHARED | MAP_FIXED) of the memfd, PROT_NONE
//   cuMemSetAccess                  mprotect(PROT_READ[|PROT_WRITE]), per granule
//   cuMemUnmap                      mmap(MAP_FIXED, PROT_NONE, anonymous): reserved again
//   cuMemExportToShareableHandle    a dup of the memfd (POSIX file descriptor handles only)
//   cuMemImportFromShareableHandle  a dup of the given descriptor
//
// A handle is counted: cuMemCreate, cuMemImportFromShareableHandle and each
// cuMemRetainAllocationHandle hold one reference, cuMemRelease drops one, and its memory
// goes when no reference and no mapping is left. Misuse fails as the real driver's does:
// unaligned or out-of-reservation ranges, overlapping maps, unmapping or setting access on
// a range that is not wholly mapped, exporting a handle made without an exportable type.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "driver_state.hpp"

namespace hostcuda {
namespace {

struct handle_record {
  int fd;
  size_t size;
  CUmemAllocationProp prop;
  unsigned refs;
  unsigned mappings;
  bool imported;  // its memory counts in the process that created it
};

struct mapping {
  size_t size;
  CUmemGenericAllocationHandle handle;
  std::vector<int> prot;  // per granule
};

struct vmm_state {
  std::map<CUmemGenericAllocationHandle, handle_record> handles;
  CUmemGenericAllocationHandle next_handle = 0x1000;
  std::map<uintptr_t, size_t> reservations;  // base -> size
  std::map<uintptr_t, mapping> mappings;     // va -> mapping
};

vmm_state& vs() {
  static auto* s = new vmm_state;
  return *s;
}

bool aligned(uint64_t v) { return v % k_granularity == 0; }

// The reservation wholly holding [va, va + size), or end().
std::map<uintptr_t, size_t>::iterator reservation_of(uintptr_t va, size_t size) {
  auto& r = vs().reservations;
  auto it = r.upper_bound(va);
  if (it == r.begin()) return r.end();
  --it;
  return va >= it->first && va + size <= it->first + it->second && va + size > va ? it : r.end();
}

// The mapping holding `va`, or end().
std::map<uintptr_t, mapping>::iterator mapping_at(uintptr_t va) {
  auto& m = vs().mappings;
  auto it = m.upper_bound(va);
  if (it == m.begin()) return m.end();
  --it;
  return va < it->first + it->second.size ? it : m.end();
}

// Calls f(mapping, first granule, granule count) for each mapping over [va, va + size);
// false when some part of the range is not mapped.
template <typename F>
bool for_each_mapped(uintptr_t va, size_t size, F&& f) {
  uintptr_t at = va;
  const uintptr_t end = va + size;
  while (at < end) {
    auto it = mapping_at(at);
    if (it == vs().mappings.end()) return false;
    const uintptr_t map_end = it->first + it->second.size;
    const uintptr_t stop = map_end < end ? map_end : end;
    f(it->second, (at - it->first) / k_granularity, (stop - at + k_granularity - 1) / k_granularity);
    at = stop;
  }
  return true;
}

void drop_if_unused(std::map<CUmemGenericAllocationHandle, handle_record>::iterator it) {
  handle_record& h = it->second;
  if (h.refs != 0 || h.mappings != 0) return;
  ::close(h.fd);
  if (!h.imported) uncharge(h.prop.location.id, h.size);
  vs().handles.erase(it);
}

// The allocation properties cuMemCreate and cuMemGetAllocationGranularity accept.
CUresult check_prop(const CUmemAllocationProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return prop->type == CU_MEM_ALLOCATION_TYPE_MANAGED ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return prop->location.type == CU_MEM_LOCATION_TYPE_INVALID ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!valid_device(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  const unsigned types = static_cast<unsigned>(prop->requestedHandleTypes);
  if ((types & ~unsigned{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR}) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

int to_prot(CUmemAccess_flags f) {
  return f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE : f == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ : PROT_NONE;
}

// The device an exported memfd was made for: its name says ("hostcuda-device-N").
CUdevice device_of_fd(int fd) {
  char link[64];
  char target[256] = {};
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof target - 1);
  const char* tag = n > 0 ? std::strstr(target, "hostcuda-device-") : nullptr;
  return tag != nullptr ? static_cast<CUdevice>(std::atoi(tag + std::strlen("hostcuda-device-"))) : 0;
}

}  // namespace

int check_vmm_range(CUdeviceptr p, size_t bytes, bool write) {
  auto& r = vs().reservations;
  auto it = r.upper_bound(p);
  const bool starts_inside = it != r.begin() && p < std::prev(it)->first + std::prev(it)->second;
  const bool reaches_one = it != r.end() && it->first < p + bytes;
  if (!starts_inside && !reaches_one) return -1;  // not reserved here: host memory
  if (reservation_of(p, bytes) == r.end()) return CUDA_ERROR_INVALID_VALUE;
  const int need = write ? PROT_WRITE : PROT_READ;
  bool accessible = true;
  const bool mapped = for_each_mapped(p, bytes, [&](const mapping& m, size_t first, size_t count) {
    for (size_t g = first; g < first + count; ++g) accessible &= (m.prot[g] & need) != 0;
  });
  return mapped && accessible ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace hostcuda

using namespace hostcuda;

namespace {
using guard = std::lock_guard<std::mutex>;
}

extern "C" {

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult r = check_prop(prop); r != CUDA_SUCCESS) return r;
  *granularity = k_granularity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment < k_granularity) alignment = k_granularity;
  if (size > SIZE_MAX - alignment) return CUDA_ERROR_OUT_OF_MEMORY;
  constexpr int k_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  uintptr_t base = 0;
  // The address asked for is a hint: taken when it is aligned and free.
  if (addr != 0 && addr % alignment == 0) {
    void* p = ::mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, k_flags | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && reinterpret_cast<uintptr_t>(p) == addr) {
      base = addr;
    } else if (p != MAP_FAILED) {
      ::munmap(p, size);  // a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
    }
  }
  if (base == 0) {
    const size_t span = size + alignment;
    void* p = ::mmap(nullptr, span, PROT_NONE, k_flags, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const auto start = reinterpret_cast<uintptr_t>(p);
    base = (start + alignment - 1) & ~(uintptr_t{alignment} - 1);
    if (base > start) ::munmap(p, base - start);
    if (start + span > base + size) ::munmap(reinterpret_cast<void*>(base + size), start + span - base - size);
  }
  vs().reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

// The whole reservation, with nothing mapped in it any more.
CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  auto it = vs().reservations.find(ptr);
  if (it == vs().reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = vs().mappings.lower_bound(ptr);
  if (m != vs().mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  ::munmap(reinterpret_cast<void*>(ptr), size);
  vs().reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop, unsigned long long flags) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult r = check_prop(prop); r != CUDA_SUCCESS) return r;
  const CUdevice device = prop->location.id;
  if (const CUresult r = charge(device, size); r != CUDA_SUCCESS) return r;
  char name[32];
  std::snprintf(name, sizeof name, "hostcuda-device-%d", device);
  const int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) ::close(fd);
    uncharge(device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUmemGenericAllocationHandle h = vs().next_handle++;
  vs().handles[h] = handle_record{fd, size, *prop, 1, 0, false};
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  auto it = vs().handles.find(handle);
  if (it == vs().handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  --it->second.refs;
  drop_if_unused(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (flags != 0 || size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset)) return CUDA_ERROR_INVALID_VALUE;
  auto h = vs().handles.find(handle);
  if (h == vs().handles.end() || h->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  if (offset > h->second.size || size > h->second.size - offset) return CUDA_ERROR_INVALID_VALUE;
  if (reservation_of(ptr, size) == vs().reservations.end()) return CUDA_ERROR_INVALID_VALUE;
  // No overlap with a mapping already there.
  auto next = vs().mappings.lower_bound(ptr);
  if (next != vs().mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (mapping_at(ptr) != vs().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  void* p = ::mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->second.fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  vs().mappings[ptr] = mapping{size, handle, std::vector<int>(size / k_granularity, PROT_NONE)};
  ++h->second.mappings;
  return CUDA_SUCCESS;
}

// Whole mappings only: [ptr, ptr + size) must start at a mapping and end at one's end.
CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (size == 0 || !aligned(ptr) || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
  auto& maps = vs().mappings;
  uintptr_t at = ptr;
  for (auto it = maps.find(ptr); at < ptr + size; at += it->second.size, ++it) {
    if (it == maps.end() || it->first != at || at + it->second.size > ptr + size) return CUDA_ERROR_INVALID_VALUE;
  }
  void* p = ::mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_UNKNOWN;
  for (auto it = maps.find(ptr); it != maps.end() && it->first < ptr + size;) {
    auto h = vs().handles.find(it->second.handle);
    --h->second.mappings;
    drop_if_unused(h);
    it = maps.erase(it);
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0 || size == 0 || !aligned(ptr) || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
  // Every device sees the same host pages: the range gets the widest access asked.
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    const CUmemAccess_flags f = desc[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ && f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    prot |= to_prot(f);
  }
  if (!for_each_mapped(ptr, size, [](const mapping&, size_t, size_t) {})) return CUDA_ERROR_INVALID_VALUE;
  if (::mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_UNKNOWN;
  for_each_mapped(ptr, size, [&](mapping& m, size_t first, size_t n) {
    for (size_t i = first; i < first + n; ++i) m.prot[i] = prot;
  });
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(location->id)) return CUDA_ERROR_INVALID_DEVICE;
  auto it = mapping_at(ptr);
  if (it == vs().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  const int prot = it->second.prot[(ptr - it->first) / k_granularity];
  *flags = (prot & PROT_WRITE) != 0 ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
           : (prot & PROT_READ) != 0 ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                     : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

// Any address inside a mapping; the handle gets one more reference (cuMemRelease drops it).
CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = mapping_at(reinterpret_cast<uintptr_t>(addr));
  if (it == vs().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  ++vs().handles.at(it->second.handle).refs;
  *handle = it->second.handle;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  auto it = vs().handles.find(handle);
  if (prop == nullptr || it == vs().handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.prop;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType, unsigned long long flags) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  auto it = vs().handles.find(handle);
  if (it == vs().handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  if ((it->second.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) return CUDA_ERROR_INVALID_VALUE;
  const int fd = ::dup(it->second.fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

// The descriptor stays the caller's (it may close it at once); the handle holds its own.
CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle, CUmemAllocationHandleType shHandleType) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int given = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
  struct stat s {};
  if (given < 0 || ::fstat(given, &s) != 0 || !S_ISREG(s.st_mode) || s.st_size <= 0 || !aligned(static_cast<uint64_t>(s.st_size))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = ::fcntl(given, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_of_fd(fd);
  if (!valid_device(prop.location.id)) prop.location.id = 0;
  const CUmemGenericAllocationHandle h = vs().next_handle++;
  vs().handles[h] = handle_record{fd, static_cast<size_t>(s.st_size), prop, 1, 0, true};
  *handle = h;
  return CUDA_SUCCESS;
}

}  // extern "C"
