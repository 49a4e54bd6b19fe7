// The host driver's allocations, copies and memsets (see driver_state.hpp).
//
// cuMemAlloc (and the managed and pitched forms) is an anonymous read-write mapping; the
// "device pointer" is its host address, counted against the context's device. Copies and
// memsets check their device ranges (check_range) and then run at once with memcpy and
// memset: the asynchronous forms check their stream and complete before they return. The
// _ptds/_ptsz entry points (per-thread default stream) behave the same, as different
// functions, as the real driver's are.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "driver_state.hpp"

extern "C" {
// The per-thread-default-stream entry points; cuda.h declares them only for a program built
// with CUDA_API_PER_THREAD_DEFAULT_STREAM.
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount);
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream);
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N);
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
}

namespace hostcuda {
namespace {

struct allocation {
  size_t size;      // as asked
  size_t mapped;    // page-rounded: what is charged and unmapped
  CUdevice device;
  bool host;        // cuMemHostAlloc / cuMemAllocHost: not device memory
};
std::map<CUdeviceptr, allocation>& allocations() {
  static auto* m = new std::map<CUdeviceptr, allocation>;
  return *m;
}

// The allocation holding `p`, or end().
std::map<CUdeviceptr, allocation>::iterator containing(CUdeviceptr p) {
  auto& all = allocations();
  auto it = all.upper_bound(p);
  if (it == all.begin()) return all.end();
  --it;
  return p < it->first + it->second.size ? it : all.end();
}

}  // namespace

int check_allocation_range(CUdeviceptr p, size_t bytes) {
  auto it = containing(p);
  if (it == allocations().end()) return -1;
  return p + bytes <= it->first + it->second.size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace hostcuda

using namespace hostcuda;

namespace {
using guard = std::lock_guard<std::mutex>;

CUresult allocate(CUdeviceptr* dptr, size_t bytes, bool host) {
  guard g(st().m);
  context* c = nullptr;
  if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page;
  if (mapped < bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!host) {
    if (const CUresult r = charge(c->device, mapped); r != CUDA_SUCCESS) return r;
  }
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    if (!host) uncharge(c->device, mapped);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  allocations()[*dptr] = allocation{bytes, mapped, c->device, host};
  return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr p, bool host) {
  guard g(st().m);
  if (const CUresult r = require_init(); r != CUDA_SUCCESS) return r;
  auto& all = allocations();
  auto it = all.find(p);
  if (it == all.end() || it->second.host != host) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(p), it->second.mapped);
  if (!host) uncharge(it->second.device, it->second.mapped);
  all.erase(it);
  return CUDA_SUCCESS;
}

// A copy of `bytes` from `src` to `dst` once both ranges check. A host side is the caller's.
CUresult copy(void* dst, bool dst_device, const void* src, bool src_device, size_t bytes, CUstream s, bool async) {
  {
    guard g(st().m);
    context* c = nullptr;
    if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
    if (async && !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (bytes == 0) return CUDA_SUCCESS;
    if (dst == nullptr || src == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dst_device) {
      if (const CUresult r = check_range(reinterpret_cast<CUdeviceptr>(dst), bytes, true); r != CUDA_SUCCESS) return r;
    }
    if (src_device) {
      if (const CUresult r = check_range(reinterpret_cast<CUdeviceptr>(src), bytes, false); r != CUDA_SUCCESS) return r;
    }
  }
  std::memmove(dst, src, bytes);
  return CUDA_SUCCESS;
}

void* host_address(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

template <typename T>
CUresult fill(CUdeviceptr dst, T value, size_t count, CUstream s, bool async) {
  {
    guard g(st().m);
    context* c = nullptr;
    if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
    if (async && !valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (count == 0) return CUDA_SUCCESS;
    if (dst % sizeof(T) != 0 || count > SIZE_MAX / sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = check_range(dst, count * sizeof(T), true); r != CUDA_SUCCESS) return r;
  }
  T* p = static_cast<T*>(host_address(dst));
  if constexpr (sizeof(T) == 1) {
    std::memset(p, value, count);
  } else {
    for (size_t i = 0; i < count; ++i) p[i] = value;
  }
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

// --- allocation ----------------------------------------------------------------------------
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) { return allocate(dptr, bytesize, false); }

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) { return release(dptr, false); }

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  return allocate(dptr, bytesize, false);
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                    unsigned int ElementSizeBytes) {
  if (pPitch == nullptr || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) return CUDA_ERROR_INVALID_VALUE;
  const size_t pitch = (WidthInBytes + 511) / 512 * 512;  // CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT
  if (Height > SIZE_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult r = allocate(dptr, pitch * Height, false);
  if (r == CUDA_SUCCESS) *pPitch = pitch;
  return r;
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  guard g(st().m);
  context* c = nullptr;
  if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
  if (free_bytes == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *total = st().device_memory;
  *free_bytes = st().device_memory - st().used[static_cast<size_t>(c->device)];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  guard g(st().m);
  context* c = nullptr;
  if (const CUresult r = require_context(&c); r != CUDA_SUCCESS) return r;
  auto it = containing(dptr);
  if (it == allocations().end() || it->second.host) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = it->first;
  if (psize != nullptr) *psize = it->second.size;
  return CUDA_SUCCESS;
}

// Page-locked host memory: host memory as any other here (it is the device's, too).
CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  if (pp == nullptr || (Flags & ~0x7u) != 0) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p = 0;
  const CUresult r = allocate(&p, bytesize, true);
  if (r == CUDA_SUCCESS) *pp = reinterpret_cast<void*>(p);
  return r;
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

CUresult CUDAAPI cuMemFreeHost(void* p) { return release(reinterpret_cast<CUdeviceptr>(p), true); }

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  if (pdptr == nullptr || p == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

// --- copies --------------------------------------------------------------------------------
CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return copy(host_address(dst), true, host_address(src), true, ByteCount, nullptr, false);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return copy(host_address(dst), true, host_address(src), true, ByteCount, hStream, true);
}
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  return copy(host_address(dstDevice), true, srcHost, false, ByteCount, nullptr, false);
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return copy(dstHost, false, host_address(srcDevice), true, ByteCount, nullptr, false);
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return copy(host_address(dstDevice), true, host_address(srcDevice), true, ByteCount, nullptr, false);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  return copy(host_address(dstDevice), true, srcHost, false, ByteCount, hStream, true);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return copy(dstHost, false, host_address(srcDevice), true, ByteCount, hStream, true);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return copy(host_address(dstDevice), true, host_address(srcDevice), true, ByteCount, hStream, true);
}

// --- memsets -------------------------------------------------------------------------------
CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) { return fill(dstDevice, uc, N, nullptr, false); }
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) { return fill(dstDevice, us, N, nullptr, false); }
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) { return fill(dstDevice, ui, N, nullptr, false); }
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  return fill(dstDevice, uc, N, hStream, true);
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  return fill(dstDevice, us, N, hStream, true);
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  return fill(dstDevice, ui, N, hStream, true);
}

// --- the per-thread default stream's entry points ------------------------------------------
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { return cuMemcpy(dst, src, n); }
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return cuMemcpyAsync(dst, src, n, s); }
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) { return cuMemcpyHtoD_v2(dst, src, n); }
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) { return cuMemcpyDtoH_v2(dst, src, n); }
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { return cuMemcpyDtoD_v2(dst, src, n); }
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return cuMemcpyHtoDAsync_v2(dst, src, n, s);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  return cuMemcpyDtoHAsync_v2(dst, src, n, s);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return cuMemcpyDtoDAsync_v2(dst, src, n, s);
}
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n) { return cuMemsetD8_v2(dst, v, n); }
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr dst, unsigned short v, size_t n) { return cuMemsetD16_v2(dst, v, n); }
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int v, size_t n) { return cuMemsetD32_v2(dst, v, n); }
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { return cuMemsetD8Async(dst, v, n, s); }
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short v, size_t n, CUstream s) { return cuMemsetD16Async(dst, v, n, s); }
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) { return cuMemsetD32Async(dst, v, n, s); }

}  // extern "C"
