// The two functions PyTorch's CUDAPluggableAllocator loads from this module's file (dlopen +
// dlsym by name; vramswap/torch.py passes them): every CUDA tensor's memory comes from
// vramswap_malloc_async and goes back through vramswap_free_async, ordered on the stream
// PyTorch allocated it for. Their signatures are PyTorch's, not ours.
#include <sys/types.h>

#include <cstdio>

#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

#define VRAMSWAP_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

// PyTorch has no error channel here: a failure is thrown as a vramswap exception, which
// PyTorch's bindings turn into a RuntimeError carrying our message (naming the size, the
// device and what is cached) at the tensor operation that needed the memory. Outside the
// lock (model.cuda() before the training loop) the block is backed at once from free frames
// of the pool, or the allocation fails saying to allocate under vramswap.gpu_lock(): PyTorch
// queues a kernel or a copy on it next, which would fault on memory not backed.
VRAMSWAP_TORCH_EXPORT void* vramswap_torch_malloc(ssize_t size, int device, void* stream) {
  if (size <= 0) return nullptr;  // PyTorch's own allocator gives 0-byte tensors no memory either
  void* p = nullptr;
  if (const int rc = vramswap_malloc_async(&p, static_cast<size_t>(size), device, stream); rc != VRAMSWAP_OK) {
    vramswap::throw_error(rc, std::string("PyTorch allocation through vramswap: ") + vramswap_last_error());
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
