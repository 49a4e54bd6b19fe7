// The CUDA driver API, loaded at run time. Only core/cuda/ includes this header.
//
// libvramswap has no link-time dependency on libcuda: it loads "libcuda.so.1" with dlopen
// on first use, finds cuGetProcAddress_v2 (CUDA 12.0+; cuGetProcAddress, 11.3+, as a
// fallback) with dlsym, and fetches every other function through it into one table of
// typed pointers. So the library loads, and its host-backend tests run, on machines
// without a GPU or a driver.
//
// Versioned entry points. cuda.h #defines many names to versioned symbols
// (cuMemGetInfo -> cuMemGetInfo_v2, cuStreamDestroy -> cuStreamDestroy_v2, ...), while
// cuGetProcAddress wants the base name plus the CUDA version whose ABI the caller was
// compiled for. The table's X-macros get both from one token: `#name` is the unexpanded
// base name ("cuMemGetInfo") and `decltype(&name)` the expanded declaration's type
// (cuMemGetInfo_v2's). Each pointer is requested at the header's CUDA_VERSION, lowered to
// the driver's own version when the driver is older (cuGetProcAddress rejects a version
// newer than the driver). Every function in the list has had its current ABI since CUDA
// 11.4 (checked against cudaTypedefs.h), so the lowered request returns the same ABI;
// older drivers are refused.
//
// Exceptions: functions whose name cuda.h declares with an older ABI than the newest
// (cuCtxSynchronize in CUDA 13) are fetched at the version of the declared ABI
// (core/cuda/declared_abi.hpp).
#pragma once

#include <cuda.h>

namespace vramswap::detail::cuda {

// X(name): fetched at the header's CUDA_VERSION (or the driver's, if older), capped by
// declared_abi_version (see above).
// The names must appear here literally (not passed through another macro's argument), so
// that `#name` in X sees them unexpanded.
#define VRAMSWAP_CUDA_DRIVER_FUNCTIONS(X)                      \
  X(cuGetErrorName)                                            \
  X(cuGetErrorString)                                          \
  X(cuInit)                                                    \
  X(cuDeviceGet)                                               \
  X(cuDeviceGetCount)                                          \
  X(cuDeviceGetName)                                           \
  X(cuDeviceGetUuid)                                           \
  X(cuDeviceGetAttribute)                                      \
  X(cuDeviceTotalMem)                                          \
  X(cuDevicePrimaryCtxRetain)                                  \
  X(cuDevicePrimaryCtxRelease)                                 \
  X(cuCtxGetCurrent)                                           \
  X(cuCtxSetCurrent)                                           \
  X(cuCtxSynchronize)                                          \
  X(cuMemGetInfo)                                              \
  X(cuMemGetAllocationGranularity)                             \
  X(cuMemGetAllocationPropertiesFromHandle)                    \
  X(cuMemAddressReserve)                                       \
  X(cuMemAddressFree)                                          \
  X(cuMemCreate)                                               \
  X(cuMemRelease)                                              \
  X(cuMemExportToShareableHandle)                              \
  X(cuMemImportFromShareableHandle)                            \
  X(cuMemMap)                                                  \
  X(cuMemUnmap)                                                \
  X(cuMemSetAccess)                                            \
  X(cuMemHostAlloc)                                            \
  X(cuMemFreeHost)                                             \
  X(cuMemHostRegister)                                         \
  X(cuMemHostUnregister)                                       \
  X(cuStreamCreate)                                            \
  X(cuStreamDestroy)                                           \
  X(cuStreamSynchronize)                                       \
  X(cuStreamWaitEvent)                                         \
  X(cuStreamIsCapturing)                                       \
  X(cuThreadExchangeStreamCaptureMode)                         \
  X(cuMemcpyDtoHAsync)                                         \
  X(cuMemcpyHtoDAsync)                                         \
  X(cuMemcpyDtoDAsync)                                         \
  X(cuMemsetD8Async)                                           \
  X(cuEventCreate)                                             \
  X(cuEventDestroy)                                            \
  X(cuEventRecord)                                             \
  X(cuEventSynchronize)                                        \
  X(cuEventQuery)

// The oldest driver whose ABIs for the functions above match cuda.h's (CUDA 11.4).
inline constexpr int min_driver_version = 11040;

// The loaded driver: one pointer per function above, named like the function (so
// `drv.cuMemGetInfo(...)` goes through the same #define as a direct call would).
struct driver {
// (::name, qualified: an unqualified name would change meaning inside the class.)
#define VRAMSWAP_CUDA_FIELD(name) decltype(&::name) name = nullptr;
  VRAMSWAP_CUDA_DRIVER_FUNCTIONS(VRAMSWAP_CUDA_FIELD)
#undef VRAMSWAP_CUDA_FIELD

  int driver_version = 0;  // cuDriverGetVersion: 1000 * major + 10 * minor
  int api_version = 0;     // the version the pointers were requested at (see declared_abi_version)
};

// The process-wide driver table: loaded on the first call (thread-safe), never unloaded
// (libcuda must not be dlclosed while CUDA objects may exist), the outcome cached.
// Returns 0 and sets *out, or err_unavailable naming what is missing (libcuda.so.1 with
// dlerror()'s text, a function, or a driver too old), the same detail on every call.
int load_driver(const driver** out) noexcept;

// "CUDA_ERROR_INVALID_VALUE" / "invalid argument"; never null, for any value (unknown
// codes read "CUresult 12345" / "unknown CUDA error"). Need a loaded driver for the names;
// before that they give the number.
const char* error_name(CUresult result) noexcept;
const char* error_string(CUresult result) noexcept;

// 0 when `result` is CUDA_SUCCESS. Otherwise records
//   "<call> failed: CUDA_ERROR_NAME (description)"
// where <call> is the printf-style rest ("cuMemMap(va=0x7f0000000000, size=33554432, ...)"),
// and returns err_out_of_memory for CUDA_ERROR_OUT_OF_MEMORY, err_cuda for anything else.
int check(CUresult result, const char* call_fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

}  // namespace vramswap::detail::cuda
