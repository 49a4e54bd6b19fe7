// libvramswap_preload.so: unmodified CUDA programs (and PyTorch) allocate through vramswap.
//
//   LD_PRELOAD=libvramswap_preload.so [VRAMSWAP_OVERSUBSCRIBE=1] program ...
//
// Two halves, one concern each:
//   lookup.cpp  how the program's calls reach us. The CUDA runtime (dynamic or static, and
//               the copies inside cuBLAS, cuDNN, NCCL) finds every driver function through
//               cuGetProcAddress, which it gets with dlsym from libcuda: the shim answers
//               that dlsym with its own cuGetProcAddress, which hands out the shim's versions
//               of the functions below and the real ones for everything else. The driver's
//               and the runtime's exported symbols are interposed too, for programs that
//               call them directly.
//               The exported dlsym itself is an x86-64 trampoline (dlsym_trampoline.cpp)
//               over lookup.cpp's decision.
//   memory.cpp  what the replaced functions do: allocation, free and memory info through the
//               vramswap runtime (runtime/runtime.hpp).
// Beside them: exports.cpp (the driver's and runtime's symbols by name) and
// crash_backtrace.cpp (VRAMSWAP_PRELOAD_BACKTRACE).
// Every driver function that queues device work (launches, graph launches, copies,
// memsets, stream memory operations) is handed out wrapped in the launch gate
// (core/launch_gate.hpp), the safe point for moving an oversubscribed process's pages.
//
// docs/oversubscription.md has the full list, the memory-info view and the limits.
#pragma once

#include <cuda.h>

namespace vramswap::detail::preload {

// The real driver (libcuda) entry point lookup, and the real dlsym.
using get_proc_v2_fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using dlsym_fn = void* (*)(void*, const char*);
dlsym_fn real_dlsym_function();
get_proc_v2_fn real_get_proc_address();
void* real_dlsym(void* handle, const char* symbol);
// A real driver function, with the ABI of `version` (nullptr if the driver lacks it); for
// the functions of core/cuda/declared_abi.hpp, the ABI cuda.h declares.
void* real_driver(const char* name, int version = CUDA_VERSION);

// lookup.cpp: the shim's function for the real driver function `real` (itself when the
// shim does not replace it); `symbol` for the debug log, may be null.
void* substitute(void* real, const char* symbol);
// The shim's cuGetProcAddress (_v2, and the CUDA 11 one without the status argument).
CUresult hook_get_proc_v2(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status);
CUresult hook_get_proc_v1(const char* symbol, void** pfn, int version, cuuint64_t flags);
// cuGetProcAddress looked up through a lookup: the shim's, by `version`. True if it was.
bool own_lookup(const char* symbol, int version, void** pfn);
// dlsym's replacement for an object at `caller`, or nullptr: the real dlsym answers.
void* lookup_for(const void* caller, void* handle, const char* symbol);

// memory.cpp: the replacements.
CUresult mem_alloc(CUdeviceptr* dptr, size_t bytes);
CUresult mem_free(CUdeviceptr dptr);
CUresult mem_get_info(size_t* free_bytes, size_t* total_bytes);
CUresult mem_alloc_async(CUdeviceptr* dptr, size_t bytes, CUstream stream);
CUresult mem_free_async(CUdeviceptr dptr, CUstream stream);
// The _ptsz entry points (a program built with --default-stream per-thread): there stream 0
// is the calling thread's default stream, not the legacy one.
CUresult mem_alloc_async_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream);
CUresult mem_free_async_ptsz(CUdeviceptr dptr, CUstream stream);

}  // namespace vramswap::detail::preload
