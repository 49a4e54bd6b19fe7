"""vramswap.torch: PyTorch's CUDA memory through vramswap, so that it swaps.

    import vramswap, vramswap.torch
    vramswap.torch.enable()            # before the first CUDA tensor (or VRAMSWAP_TORCH=1)

    with vramswap.gpu_lock():          # every CUDA operation under the lock
        model = Net().cuda()
    for batch in data:
        with vramswap.gpu_lock():
            loss = step(model, batch)

How: enable() installs a torch.cuda.memory.CUDAPluggableAllocator whose two functions live
in vramswap's native module (python/src/torch_allocator.cpp) and call vramswap's
stream-ordered allocator (vramswap_malloc_async / vramswap_free_async). Why that and not a
torch.cuda.MemPool: a MemPool routes only the allocations made inside
`torch.cuda.use_mem_pool()`, and only on the calling thread; autograd's backward pass runs
on its own threads, so gradients would land in PyTorch's own, unswappable cache. The
pluggable allocator replaces PyTorch's allocator for every thread and stream, which is what
time-sharing needs; it must be installed before PyTorch's allocator is first used.

What that means:
  - Every CUDA tensor's memory is vramswap memory: it keeps its address across swaps and is
    backed while this process holds the lock. Touch CUDA tensors under the lock. Outside it
    (model.cuda() before the loop) a tensor is backed at once from free frames of the pool,
    or its allocation raises a RuntimeError saying to allocate under the lock; once another
    process has taken its frames, it faults there until the next lock.
  - Freed tensors' blocks are kept per stream for reuse (as PyTorch's cache does), and cost
    no transfer time at a swap; empty_cache() gives them back.
  - CUDA graphs (torch.cuda.graph) work: memory allocated or freed during a capture belongs
    to the graph and is held until the process exits. torch.compile works in its default
    mode; mode="reduce-overhead" (CUDA graph trees) needs PyTorch's own allocator.
  - torch.cuda.memory_allocated() and memory_stats() are not available with a pluggable
    allocator (PyTorch raises); use vramswap.stats() instead.
  - Memory PyTorch allocates outside its allocator (the CUDA context, cuBLAS/cuDNN handles,
    kernels) is not swapped: it is the per-process reserve the pool leaves free.
"""

import os

from . import _vramswap

_MALLOC = "vramswap_torch_malloc"
_FREE = "vramswap_torch_free"
_enabled = False
_allocator = None  # kept alive for the process's life: PyTorch holds the C++ side, we the wrapper


def enable():
    """Route all of PyTorch's CUDA allocations in this process through vramswap.

    Call it before the first CUDA tensor is created (importing vramswap with VRAMSWAP_TORCH=1
    does it). Calling it again is a no-op. Raises vramswap.UnavailableError when PyTorch has
    no CUDA, and RuntimeError when PyTorch's own allocator is already in use: tensors made
    before would stay in memory that never swaps, so that is refused rather than half done.
    """
    global _enabled, _allocator
    if _enabled:
        return
    import torch

    if not torch.cuda.is_available():
        raise _vramswap.UnavailableError(
            "vramswap.torch.enable(): PyTorch sees no CUDA device (torch.cuda.is_available() is False); "
            "vramswap.torch needs PyTorch built with CUDA and a visible GPU"
        )
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_vramswap.__file__, _MALLOC, _FREE)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError(
            "vramswap.torch.enable(): PyTorch's CUDA allocator is already in use in this process (a CUDA tensor "
            "was created, or torch.cuda was initialized, before enable()); its memory could never be swapped. "
            "Call vramswap.torch.enable() before any CUDA work, or set VRAMSWAP_TORCH=1 and import vramswap "
            f"first. (PyTorch said: {e})"
        ) from e
    _allocator = allocator
    _enabled = True


def enabled():
    """Whether enable() routed PyTorch's CUDA allocations through vramswap in this process."""
    return _enabled


def empty_cache(device=None):
    """Give back the blocks of freed tensors that vramswap keeps for reuse (synchronizes the
    device). torch.cuda.empty_cache() does not reach a pluggable allocator; this does."""
    import torch

    _vramswap.release_cached(torch.cuda.current_device() if device is None else int(device))


def _enable_from_environment():
    value = os.environ.get("VRAMSWAP_TORCH", "")
    if value in ("", "0"):
        return
    if value != "1":
        raise ValueError(f"VRAMSWAP_TORCH={value!r}: use 1 (route PyTorch's CUDA memory through vramswap) or 0")
    enable()
