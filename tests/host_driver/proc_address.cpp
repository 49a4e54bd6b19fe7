// The host driver's cuGetProcAddress (see driver_state.hpp): the functions it implements, by
// base name and the CUDA version each ABI appeared in, as the real driver hands them out.
//
// A lookup of (name, version, flags) gets the newest ABI of `name` at or below `version`;
// with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the per-thread-default-stream entry
// point where the function has one. A name it lacks: CUDA_ERROR_NOT_FOUND with
// CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; one whose every ABI is newer than `version`:
// CUDA_ERROR_NOT_FOUND with CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. Each entry's type is
// checked at compile time against cudaTypedefs.h's PFN_<name>_v<version>[_ptds|_ptsz].
#include <cudaTypedefs.h>

#include <cstring>
#include <type_traits>

#include "driver_state.hpp"

extern "C" {
// Declared by devices_contexts.cpp and memory.cpp's definitions; restated for the table.
CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int numParams, unsigned int flags, CUdevice dev);
CUresult CUDAAPI hostcuda_cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) __asm__("cuDeviceGetUuid");
CUresult CUDAAPI hostcuda_cuDevicePrimaryCtxRelease(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream);
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
// The CUDA 11.3 cuGetProcAddress, without the symbol status.
CUresult CUDAAPI hostcuda_cuGetProcAddress_v1(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) __asm__("cuGetProcAddress");
}

namespace {

struct entry {
  const char* name;
  int version;      // the CUDA version this ABI appeared in
  bool per_thread;  // the per-thread-default-stream entry point
  void* fn;
};

template <typename F>
void* as_void(F* f) {
  return reinterpret_cast<void*>(f);
}

// E(name, version, function): `name`'s ABI of `version` is `function`. P: the _ptds/_ptsz one.
// O: an old ABI whose PFN cudaTypedefs.h keeps to the driver's own build, checked against
// the newer one of the same signature.
// (`name` is only pasted and stringized: cuda.h's #defines never expand it.)
#define E(name, version, function)                                                   \
  static_assert(std::is_same_v<decltype(&function), PFN_##name##_v##version>, #name);
#define P(name, version, suffix, function)                                                    \
  static_assert(std::is_same_v<decltype(&function), PFN_##name##_v##version##_##suffix>, #name);

#define HOSTCUDA_TABLE(E, P, O)                                                        \
  E(cuGetErrorName, 6000, cuGetErrorName)                                          \
  E(cuGetErrorString, 6000, cuGetErrorString)                                      \
  E(cuInit, 2000, cuInit)                                                          \
  E(cuDriverGetVersion, 2020, cuDriverGetVersion)                                  \
  E(cuDeviceGet, 2000, cuDeviceGet)                                                \
  E(cuDeviceGetCount, 2000, cuDeviceGetCount)                                      \
  E(cuDeviceGetName, 2000, cuDeviceGetName)                                        \
  E(cuDeviceGetUuid, 9020, hostcuda_cuDeviceGetUuid)                               \
  E(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2)                                    \
  E(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2)                                   \
  E(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute)                              \
  E(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain)                      \
  O(cuDevicePrimaryCtxRelease, 7000, hostcuda_cuDevicePrimaryCtxRelease, 11000)    \
  E(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2)                \
  E(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState)                  \
  E(cuCtxCreate, 3020, cuCtxCreate_v2)                                             \
  E(cuCtxCreate, 11040, cuCtxCreate_v3)                                            \
  E(cuCtxCreate, 12050, cuCtxCreate_v4)                                            \
  E(cuCtxDestroy, 4000, cuCtxDestroy_v2)                                           \
  E(cuCtxSetCurrent, 4000, cuCtxSetCurrent)                                        \
  E(cuCtxGetCurrent, 4000, cuCtxGetCurrent)                                        \
  E(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2)                                   \
  E(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2)                                     \
  E(cuCtxGetDevice, 2000, cuCtxGetDevice)                                          \
  E(cuCtxGetDevice, 13000, cuCtxGetDevice_v2)                                      \
  E(cuCtxSynchronize, 2000, cuCtxSynchronize)                                      \
  E(cuCtxSynchronize, 13000, cuCtxSynchronize_v2)                                  \
  E(cuStreamCreate, 2000, cuStreamCreate)                                          \
  E(cuStreamDestroy, 4000, cuStreamDestroy_v2)                                     \
  E(cuStreamSynchronize, 2000, cuStreamSynchronize)                                \
  P(cuStreamSynchronize, 7000, ptsz, cuStreamSynchronize_ptsz)                     \
  E(cuMemAlloc, 3020, cuMemAlloc_v2)                                               \
  E(cuMemFree, 3020, cuMemFree_v2)                                                 \
  E(cuMemAllocManaged, 6000, cuMemAllocManaged)                                    \
  E(cuMemAllocPitch, 3020, cuMemAllocPitch_v2)                                     \
  E(cuMemGetInfo, 3020, cuMemGetInfo_v2)                                           \
  E(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2)                           \
  E(cuMemHostAlloc, 2020, cuMemHostAlloc)                                          \
  E(cuMemAllocHost, 3020, cuMemAllocHost_v2)                                       \
  E(cuMemFreeHost, 2000, cuMemFreeHost)                                            \
  E(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2)                 \
  E(cuMemcpy, 4000, cuMemcpy)                                                      \
  P(cuMemcpy, 7000, ptds, cuMemcpy_ptds)                                           \
  E(cuMemcpyAsync, 4000, cuMemcpyAsync)                                            \
  P(cuMemcpyAsync, 7000, ptsz, cuMemcpyAsync_ptsz)                                 \
  E(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2)                                           \
  P(cuMemcpyHtoD, 7000, ptds, cuMemcpyHtoD_v2_ptds)                                \
  E(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2)                                           \
  P(cuMemcpyDtoH, 7000, ptds, cuMemcpyDtoH_v2_ptds)                                \
  E(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2)                                           \
  P(cuMemcpyDtoD, 7000, ptds, cuMemcpyDtoD_v2_ptds)                                \
  E(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2)                                 \
  P(cuMemcpyHtoDAsync, 7000, ptsz, cuMemcpyHtoDAsync_v2_ptsz)                      \
  E(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2)                                 \
  P(cuMemcpyDtoHAsync, 7000, ptsz, cuMemcpyDtoHAsync_v2_ptsz)                      \
  E(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2)                                 \
  P(cuMemcpyDtoDAsync, 7000, ptsz, cuMemcpyDtoDAsync_v2_ptsz)                      \
  E(cuMemsetD8, 3020, cuMemsetD8_v2)                                               \
  P(cuMemsetD8, 7000, ptds, cuMemsetD8_v2_ptds)                                    \
  E(cuMemsetD16, 3020, cuMemsetD16_v2)                                             \
  P(cuMemsetD16, 7000, ptds, cuMemsetD16_v2_ptds)                                  \
  E(cuMemsetD32, 3020, cuMemsetD32_v2)                                             \
  P(cuMemsetD32, 7000, ptds, cuMemsetD32_v2_ptds)                                  \
  E(cuMemsetD8Async, 3020, cuMemsetD8Async)                                        \
  P(cuMemsetD8Async, 7000, ptsz, cuMemsetD8Async_ptsz)                             \
  E(cuMemsetD16Async, 3020, cuMemsetD16Async)                                      \
  P(cuMemsetD16Async, 7000, ptsz, cuMemsetD16Async_ptsz)                           \
  E(cuMemsetD32Async, 3020, cuMemsetD32Async)                                      \
  P(cuMemsetD32Async, 7000, ptsz, cuMemsetD32Async_ptsz)                           \
  E(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity)           \
  E(cuMemAddressReserve, 10020, cuMemAddressReserve)                               \
  E(cuMemAddressFree, 10020, cuMemAddressFree)                                     \
  E(cuMemCreate, 10020, cuMemCreate)                                               \
  E(cuMemRelease, 10020, cuMemRelease)                                             \
  E(cuMemMap, 10020, cuMemMap)                                                     \
  E(cuMemUnmap, 10020, cuMemUnmap)                                                 \
  E(cuMemSetAccess, 10020, cuMemSetAccess)                                         \
  E(cuMemGetAccess, 10020, cuMemGetAccess)                                         \
  E(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle)               \
  E(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle) \
  E(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle)             \
  E(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle)         \
  E(cuGetProcAddress, 11030, hostcuda_cuGetProcAddress_v1)                         \
  E(cuGetProcAddress, 12000, cuGetProcAddress_v2)

#define O(name, version, function, same_as) \
  static_assert(std::is_same_v<decltype(&function), PFN_##name##_v##same_as>, #name);
// The type checks.
HOSTCUDA_TABLE(E, P, O)
#undef E
#undef P
#undef O

// The table itself.
#define E(name, version, function) {#name, version, false, as_void(&function)},
#define P(name, version, suffix, function) {#name, version, true, as_void(&function)},
#define O(name, version, function, same_as) {#name, version, false, as_void(&function)},
const entry k_table[] = {HOSTCUDA_TABLE(E, P, O)};
#undef E
#undef P
#undef O

}  // namespace

extern "C" {

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* symbolStatus) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_GET_PROC_ADDRESS_DEFAULT && flags != CU_GET_PROC_ADDRESS_LEGACY_STREAM &&
      flags != CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The newest ABI at or below the version; asked for the per-thread default stream, the
  // newest per-thread entry point where the function has one.
  const bool per_thread = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const entry* best = nullptr;
  const entry* best_per_thread = nullptr;
  bool named = false;
  for (const entry& e : k_table) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    named = true;
    if (e.version > cudaVersion) continue;
    const entry*& slot = e.per_thread ? best_per_thread : best;
    if (slot == nullptr || e.version > slot->version) slot = &e;
  }
  if (per_thread && best_per_thread != nullptr) best = best_per_thread;
  if (best == nullptr) {
    *pfn = nullptr;
    if (symbolStatus != nullptr) {
      *symbolStatus = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (symbolStatus != nullptr) *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI hostcuda_cuGetProcAddress_v1(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // extern "C"
