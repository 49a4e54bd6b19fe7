// The two functions PyTorch's CUDAPluggableAllocator loads from this module's file (dlopen +
// dlsym by name; vramswap/torch.py passes them): every CUDA tensor's memory comes from
// vramswap_malloc_async and goes back through vramswap_free_async, ordered on the stream
// PyTorch allocated it for. Their signatures are PyTorch's, not ours.
#include <sys/types.h>

#include <atomic>
#include <cstdio>

#include "cpp_api/src/runtime.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

#define VRAMSWAP_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

// PyTorch has no error channel here: a failure is thrown as a vramswap exception, which
// PyTorch's bindings turn into a RuntimeError carrying our message (naming the size, the
// device and what is cached) at the tensor operation that needed the memory.
VRAMSWAP_TORCH_EXPORT void* vramswap_torch_malloc(ssize_t size, int device, void* stream) {
  if (size <= 0) return nullptr;  // PyTorch's own allocator gives 0-byte tensors no memory either
  void* p = nullptr;
  if (const int rc = vramswap_malloc_async(&p, static_cast<size_t>(size), device, stream); rc != VRAMSWAP_OK) {
    vramswap::throw_error(rc, std::string("PyTorch allocation through vramswap: ") + vramswap_last_error());
  }
  // Allocating outside the lock is allowed, but in PyTorch a kernel nearly always follows
  // (zeros, a copy), and on memory not yet backed it faults with a CUDA error that names
  // nothing. Say why, once per process, before that happens.
  static std::atomic<bool> warned{false};
  bool resident = true;
  if (vramswap::rt::resident(device, &resident) == VRAMSWAP_OK && !resident && !warned.exchange(true)) {
    std::fprintf(stderr,
                 "vramswap: warning: a CUDA tensor (%zd bytes) was allocated on device %d while this process does not hold "
                 "the device's lock; its memory is backed only at the next vramswap.gpu_lock(), and a kernel that touches it "
                 "before then (torch.zeros, .cuda(), .to(), ...) fails with an illegal memory access. Do CUDA work under "
                 "vramswap.gpu_lock(). (Said once per process.)\n",
                 size, device);
  }
  return p;
}

// Called from tensor destructors, where an exception would terminate the process: a failure
// (a bug: PyTorch frees only what it allocated) is reported and the block stays allocated.
VRAMSWAP_TORCH_EXPORT void vramswap_torch_free(void* ptr, ssize_t /*size*/, int device, void* stream) {
  if (ptr == nullptr) return;
  if (vramswap_free_async(ptr, device, stream) != VRAMSWAP_OK) {
    std::fprintf(stderr, "vramswap: freeing a PyTorch block failed (the block stays allocated): %s\n", vramswap_last_error());
  }
}
