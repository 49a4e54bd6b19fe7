// Device memory a program gets past vramswap (preload/shim.hpp): never silent.
//
// The shim virtualizes cuMemAlloc, the stream-ordered allocator's default pool and the VMM
// API. The other ways to get device memory go to the driver, and their memory is outside the
// pool: on the GPU while others need it, out of reach of a lock holder. Each is wrapped here:
// the real function runs, then the first use of each path logs one warning naming it, and
// the bytes are counted as this process's memory outside the pool (`vramswap status`, the
// metrics' vramswap_process_outside_pool_bytes) until the matching free.
#include <cinttypes>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "runtime/runtime.hpp"
#include "shim.hpp"

namespace vramswap::detail::preload {
namespace {

struct outside {
  int device;
  size_t bytes;
};

std::mutex g_mutex;
std::set<std::string> g_paths_said;
std::unordered_map<uintptr_t, outside> g_outside;  // pointer or handle -> what it holds

size_t element_bytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;  // block-compressed and planar formats: not counted
  }
}

int device_or_zero() {
  int device = 0;
  return current_device(&device) == CUDA_SUCCESS ? device : 0;
}

}  // namespace

void note_bypass(const char* path, int device, size_t bytes, uintptr_t key) {
  std::lock_guard<std::mutex> guard(g_mutex);
  if (g_paths_said.insert(path).second) {
    rt::log_line(rt::log_severity::warn,
                 "preload: device %d: the program got device memory through %s, which vramswap does not virtualize: that memory "
                 "(%zu bytes%s) stays on the GPU outside the pool, where other processes cannot have it and a lock holder cannot take "
                 "it back (`vramswap status` shows it as outside the pool; docs/oversubscription.md, \"What the shim covers\")",
                 device, path, bytes, bytes == 0 ? ": its size is not tracked" : " now; later ones are counted, not said");
  }
  if (bytes == 0) return;
  if (key != 0) g_outside[key] = outside{device, bytes};
  rt::note_outside_pool(device, static_cast<int64_t>(bytes));
}

void note_bypass_freed(uintptr_t key) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto it = g_outside.find(key);
  if (it == g_outside.end()) return;
  rt::note_outside_pool(it->second.device, -static_cast<int64_t>(it->second.bytes));
  g_outside.erase(it);
}

CUresult bypass_alloc_pitch(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int element_size) {
  static auto real = driver<decltype(&bypass_alloc_pitch)>("cuMemAllocPitch");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(dptr, pitch, width, height, element_size);
  if (r == CUDA_SUCCESS) note_bypass("cuMemAllocPitch (cudaMallocPitch)", device_or_zero(), *pitch * height, *dptr);
  return r;
}

CUresult bypass_alloc_managed(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  static auto real = driver<decltype(&bypass_alloc_managed)>("cuMemAllocManaged");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(dptr, bytes, flags);
  if (r == CUDA_SUCCESS) note_bypass("cuMemAllocManaged (cudaMallocManaged, unified memory)", device_or_zero(), bytes, *dptr);
  return r;
}

namespace {
CUresult alloc_from_pool(void* real_fn, CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  auto real = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream)>(real_fn);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(dptr, bytes, pool, stream);
  if (r == CUDA_SUCCESS) note_bypass("cuMemAllocFromPoolAsync (cudaMallocFromPoolAsync: a memory pool of the program's own)", device_or_zero(), bytes, *dptr);
  return r;
}
}  // namespace

CUresult bypass_alloc_from_pool_async(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  static void* real = real_driver("cuMemAllocFromPoolAsync");
  return alloc_from_pool(real, dptr, bytes, pool, stream);
}

CUresult bypass_alloc_from_pool_async_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  static void* real = real_driver_per_thread("cuMemAllocFromPoolAsync");
  return alloc_from_pool(real, dptr, bytes, pool, stream);
}

CUresult bypass_array_create(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* desc) {
  static auto real = driver<decltype(&bypass_array_create)>("cuArrayCreate");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(array, desc);
  if (r == CUDA_SUCCESS) {
    const size_t bytes = desc->Width * (desc->Height ? desc->Height : 1) * desc->NumChannels * element_bytes(desc->Format);
    note_bypass("cuArrayCreate (a CUDA array)", device_or_zero(), bytes, reinterpret_cast<uintptr_t>(*array));
  }
  return r;
}

CUresult bypass_array_3d_create(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  static auto real = driver<decltype(&bypass_array_3d_create)>("cuArray3DCreate");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(array, desc);
  if (r == CUDA_SUCCESS) {
    const size_t bytes = desc->Width * (desc->Height ? desc->Height : 1) * (desc->Depth ? desc->Depth : 1) * desc->NumChannels *
                         element_bytes(desc->Format);
    note_bypass("cuArray3DCreate (a CUDA array)", device_or_zero(), bytes, reinterpret_cast<uintptr_t>(*array));
  }
  return r;
}

CUresult bypass_array_destroy(CUarray array) {
  static auto real = driver<decltype(&bypass_array_destroy)>("cuArrayDestroy");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(array);
  if (r == CUDA_SUCCESS) note_bypass_freed(reinterpret_cast<uintptr_t>(array));
  return r;
}

CUresult bypass_mipmapped_array_create(CUmipmappedArray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned int levels) {
  static auto real = driver<decltype(&bypass_mipmapped_array_create)>("cuMipmappedArrayCreate");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(array, desc, levels);
  if (r == CUDA_SUCCESS) note_bypass("cuMipmappedArrayCreate (a mipmapped CUDA array)", device_or_zero(), 0, 0);
  return r;
}

CUresult bypass_graph_add_mem_alloc_node(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t count,
                                         CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  static auto real = driver<decltype(&bypass_graph_add_mem_alloc_node)>("cuGraphAddMemAllocNode");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(node, graph, deps, count, params);
  if (r == CUDA_SUCCESS) note_bypass("cuGraphAddMemAllocNode (a CUDA graph's own memory node)", device_or_zero(), 0, 0);
  return r;
}

}  // namespace vramswap::detail::preload
