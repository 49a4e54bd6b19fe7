// The symbols libvramswap_preload.so exports over the driver's and the runtime's, for
// programs that call them by name (linked with -lcuda, or with the shared CUDA runtime).
// Each is defined under its exported name with an asm label, so that cuda.h's #defines
// (cuMemAlloc -> cuMemAlloc_v2, ...) and the runtime's declarations never get in the way;
// the runtime's types are restated here (the shim does not need the runtime's headers).
//
// Runtime functions (cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync, cudaMemGetInfo)
// make sure the runtime's context exists first (the real cudaFree(0), the documented way),
// then do what the driver replacements do. Their errors are the runtime's codes; unlike the
// real ones they do not set the runtime's sticky last error (cudaGetLastError).
#include <cuda.h>
#include <dlfcn.h>

#include <mutex>

#include "shim.hpp"

namespace {
using namespace vramswap::detail::preload;

// The runtime's types, as in driver_types.h (stable since CUDA 4).
using cuda_error_t = int;
constexpr cuda_error_t k_cuda_success = 0;
constexpr cuda_error_t k_cuda_invalid_value = 1;
constexpr cuda_error_t k_cuda_memory_allocation = 2;
constexpr cuda_error_t k_cuda_initialization = 3;
constexpr cuda_error_t k_cuda_unknown = 999;

cuda_error_t runtime_error(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return k_cuda_success;
    case CUDA_ERROR_INVALID_VALUE: return k_cuda_invalid_value;
    case CUDA_ERROR_OUT_OF_MEMORY: return k_cuda_memory_allocation;
    case CUDA_ERROR_NOT_INITIALIZED: return k_cuda_initialization;
    default: return k_cuda_unknown;
  }
}

// The real runtime function after the shim in the search order.
template <typename Fn>
Fn next_runtime(const char* name) {
  return reinterpret_cast<Fn>(real_dlsym(RTLD_NEXT, name));
}

// The runtime's context is current on this thread (the runtime creates it lazily).
cuda_error_t runtime_context() {
  static auto ctx_get_current = reinterpret_cast<CUresult (*)(CUcontext*)>(real_driver("cuCtxGetCurrent"));
  CUcontext ctx = nullptr;
  if (ctx_get_current != nullptr && ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr) return k_cuda_success;
  static auto real_cuda_free = next_runtime<cuda_error_t (*)(void*)>("cudaFree");
  return real_cuda_free != nullptr ? real_cuda_free(nullptr) : k_cuda_initialization;
}


}  // namespace

#define VRAMSWAP_EXPORT(name) __asm__(name) __attribute__((visibility("default")))

// --- driver ----
// Not exported: libcuda calls some of its own exported functions through the PLT, which an
// exported replacement here would capture (seen as a crash in libcuda: docs/oversubscription.md).
// Programs reach the driver through cuGetProcAddress (the CUDA runtime, cuBLAS, PyTorch)
// or dlsym, both answered by lookup.cpp.
extern "C" {
cuda_error_t vs_cudaMalloc(void**, size_t) VRAMSWAP_EXPORT("cudaMalloc");
cuda_error_t vs_cudaFree(void*) VRAMSWAP_EXPORT("cudaFree");
cuda_error_t vs_cudaMallocAsync(void**, size_t, CUstream) VRAMSWAP_EXPORT("cudaMallocAsync");
cuda_error_t vs_cudaFreeAsync(void*, CUstream) VRAMSWAP_EXPORT("cudaFreeAsync");
cuda_error_t vs_cudaMemGetInfo(size_t*, size_t*) VRAMSWAP_EXPORT("cudaMemGetInfo");
cuda_error_t vs_cudaGetDriverEntryPoint(const char*, void**, unsigned long long, int*) VRAMSWAP_EXPORT("cudaGetDriverEntryPoint");
cuda_error_t vs_cudaGetDriverEntryPointByVersion(const char*, void**, unsigned, unsigned long long, int*)
    VRAMSWAP_EXPORT("cudaGetDriverEntryPointByVersion");
}

// --- runtime ------------------------------------------------------------------------------
cuda_error_t vs_cudaMalloc(void** out, size_t bytes) {
  if (out == nullptr) return k_cuda_invalid_value;
  if (bytes == 0) {  // the runtime's rule: success, and a null pointer
    *out = nullptr;
    return k_cuda_success;
  }
  if (const cuda_error_t e = runtime_context(); e != k_cuda_success) return e;
  CUdeviceptr p = 0;
  const cuda_error_t e = runtime_error(mem_alloc(&p, bytes));
  if (e == k_cuda_success) *out = reinterpret_cast<void*>(p);
  return e;
}

cuda_error_t vs_cudaFree(void* ptr) {
  if (ptr == nullptr) {  // cudaFree(0) initializes the runtime: let the real one do that
    static auto real = next_runtime<cuda_error_t (*)(void*)>("cudaFree");
    return real != nullptr ? real(nullptr) : k_cuda_success;
  }
  if (const cuda_error_t e = runtime_context(); e != k_cuda_success) return e;
  return runtime_error(mem_free(reinterpret_cast<CUdeviceptr>(ptr)));
}

cuda_error_t vs_cudaMallocAsync(void** out, size_t bytes, CUstream stream) {
  if (out == nullptr) return k_cuda_invalid_value;
  if (bytes == 0) {
    *out = nullptr;
    return k_cuda_success;
  }
  if (const cuda_error_t e = runtime_context(); e != k_cuda_success) return e;
  CUdeviceptr p = 0;
  const cuda_error_t e = runtime_error(mem_alloc_async(&p, bytes, stream));
  if (e == k_cuda_success) *out = reinterpret_cast<void*>(p);
  return e;
}

cuda_error_t vs_cudaFreeAsync(void* ptr, CUstream stream) {
  if (const cuda_error_t e = runtime_context(); e != k_cuda_success) return e;
  return runtime_error(mem_free_async(reinterpret_cast<CUdeviceptr>(ptr), stream));
}

cuda_error_t vs_cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (const cuda_error_t e = runtime_context(); e != k_cuda_success) return e;
  return runtime_error(mem_get_info(free_bytes, total_bytes));
}

cuda_error_t vs_cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags, int* status) {
  static auto real = next_runtime<decltype(&vs_cudaGetDriverEntryPoint)>("cudaGetDriverEntryPoint");
  if (real == nullptr) return k_cuda_initialization;
  const cuda_error_t e = real(symbol, fn, flags, status);
  if (e == k_cuda_success && fn != nullptr && *fn != nullptr && !own_lookup(symbol, CUDA_VERSION, fn)) *fn = substitute(*fn, symbol);
  return e;
}

cuda_error_t vs_cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version, unsigned long long flags, int* status) {
  static auto real = next_runtime<decltype(&vs_cudaGetDriverEntryPointByVersion)>("cudaGetDriverEntryPointByVersion");
  if (real == nullptr) return k_cuda_initialization;
  const cuda_error_t e = real(symbol, fn, version, flags, status);
  if (e == k_cuda_success && fn != nullptr && *fn != nullptr && !own_lookup(symbol, static_cast<int>(version), fn)) {
    *fn = substitute(*fn, symbol);
  }
  return e;
}
