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
//   vmm.cpp     the driver's virtual memory API (cuMemAddressReserve, cuMemCreate, cuMemMap,
//               ...), virtualized: the program's allocations become vramswap pages at the
//               addresses it maps them at.
//   bypass.cpp  every other way to get device memory, which goes to the driver: said once
//               per path, and counted as this process's memory outside the pool.
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
void* resolve_real_dlsym();  // uncached, and safe before a sanitizer runtime is initialized
get_proc_v2_fn real_get_proc_address();
void* real_dlsym(void* handle, const char* symbol);
// A real driver function, with the ABI of `version` (nullptr if the driver lacks it); for
// the functions of core/cuda/declared_abi.hpp, the ABI cuda.h declares.
void* real_driver(const char* name, int version = CUDA_VERSION);
// The same, in its per-thread-default-stream flavour (the _ptsz function).
void* real_driver_per_thread(const char* name);
template <typename Fn>
Fn driver(const char* name, int version = CUDA_VERSION) {
  static_assert(sizeof(Fn) == sizeof(void*));
  return reinterpret_cast<Fn>(real_driver(name, version));
}

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

// memory.cpp: what the replacements share. The calling thread's current device; the number
// of devices; vramswap's error as the driver's, said once in the log with vramswap's words;
// a normal-priority process's turn (the device lock, taken at its first allocation and kept
// for its life; nothing for an oversubscribed one).
CUresult current_device(int* out);
CUresult device_count(int* out);
CUresult as_cuda(int rc, const char* what);
CUresult ensure_turn(int device);

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

// vmm.cpp: the virtual memory API (the driver's ABI, as cuda.h declares it).
CUresult vmm_address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
CUresult vmm_address_free(CUdeviceptr ptr, size_t size);
CUresult vmm_create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop, unsigned long long flags);
CUresult vmm_release(CUmemGenericAllocationHandle handle);
CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult vmm_unmap(CUdeviceptr ptr, size_t size);
CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count);
CUresult vmm_get_access(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr);
CUresult vmm_retain_allocation_handle(CUmemGenericAllocationHandle* handle, void* addr);
CUresult vmm_get_allocation_properties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle);
CUresult vmm_export(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type, unsigned long long flags);
CUresult vmm_map_array_async(CUarrayMapInfo* info, unsigned int count, CUstream stream);

// bypass.cpp: memory the driver gives past vramswap. note_bypass: `bytes` of `device` came
// through `path` (the first time a path is used it is said); key (a pointer or handle, 0:
// none) is what note_bypass_freed is given when they are freed.
void note_bypass(const char* path, int device, size_t bytes, uintptr_t key);
void note_bypass_freed(uintptr_t key);
CUresult bypass_alloc_pitch(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int element_size);
CUresult bypass_alloc_managed(CUdeviceptr* dptr, size_t bytes, unsigned int flags);
CUresult bypass_alloc_from_pool_async(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream);
CUresult bypass_alloc_from_pool_async_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream);
CUresult bypass_array_create(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* desc);
CUresult bypass_array_3d_create(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc);
CUresult bypass_array_destroy(CUarray array);
CUresult bypass_mipmapped_array_create(CUmipmappedArray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned int levels);
CUresult bypass_graph_add_mem_alloc_node(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t count,
                                         CUDA_MEM_ALLOC_NODE_PARAMS* params);

}  // namespace vramswap::detail::preload
