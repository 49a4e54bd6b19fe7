// The host driver's shared state (tests/host_driver/: libcuda.so.1 over plain Linux, for
// running driver-API programs and the preload shim in CI without a GPU; see CMakeLists.txt).
//
// One process-wide state under one mutex: the devices, the contexts, the streams, the
// cuMemAlloc allocations (memory.cpp) and the VMM objects (vmm.cpp). Every work item runs
// at once on the calling thread (a stream is always idle when a call returns), which is
// one legal schedule of the real driver's asynchronous work.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace hostcuda {

// Every allocation's granularity (cuMemGetAllocationGranularity), as on current NVIDIA GPUs.
inline constexpr size_t k_granularity = 2ull << 20;

struct context {
  CUdevice device;
  bool primary;
};

struct stream {
  context* ctx;
  unsigned flags;
};

struct state {
  std::mutex m;
  bool initialized = false;
  int device_count = 1;            // HOSTCUDA_DEVICES (default 1)
  size_t device_memory = 4ull << 30;  // HOSTCUDA_MEMORY in MiB (default 4096)
  std::vector<size_t> used;        // bytes in use per device: allocations and created handles
  std::vector<context*> primary;   // one per device, made at cuInit, never freed
  std::vector<unsigned> primary_refs;
  std::unordered_set<const context*> contexts;  // live contexts (primary ones included)
  std::vector<context*> destroyed;  // kept, never reused: a stale handle reads as destroyed
  std::unordered_set<const stream*> streams;    // live streams
};

// The state; its lock is held by the callers of the functions below unless they say otherwise.
state& st();

// NOT_INITIALIZED before cuInit.
CUresult require_init();
// The calling thread's current context (the top of its stack), or nullptr.
context* current_context();
// CUDA_SUCCESS and *out = the current context, or NOT_INITIALIZED / INVALID_CONTEXT /
// CONTEXT_IS_DESTROYED.
CUresult require_context(context** out);
bool valid_device(CUdevice device);
// Stream 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD and live streams are valid.
bool valid_stream(CUstream s);

// Device memory accounting: OUT_OF_MEMORY when the device lacks `bytes`.
CUresult charge(CUdevice device, size_t bytes);
void uncharge(CUdevice device, size_t bytes);

// Device address ranges before a copy: `write` for a destination. A range in a cuMemAlloc
// allocation or in a VMM reservation must lie wholly in one and, for a reservation, be mapped
// with the access the copy needs (else INVALID_VALUE). Any other address is host memory,
// used as is: a device pointer is a host address here (as with vramswap's host backend).
CUresult check_range(CUdeviceptr p, size_t bytes, bool write);
// The two halves of check_range: -1 not known to this half, else a CUresult.
int check_allocation_range(CUdeviceptr p, size_t bytes);  // memory.cpp
int check_vmm_range(CUdeviceptr p, size_t bytes, bool write);  // vmm.cpp

}  // namespace hostcuda
