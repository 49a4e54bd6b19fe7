"""vramswap: time-share one GPU among processes whose GPU memory does not fit on it together.

    import vramswap

    with vramswap.gpu_lock():          # waits (FIFO, by priority); memory swapped in
        step(model, batch)             # the device is this process's alone
                                       # on exit: device work synchronized, lock released

    @vramswap.gpu_lock(device=0, priority="high", timeout=30)
    def step(...): ...

Errors: ValueError (bad argument, device order), MemoryError, TimeoutError, and
vramswap.Error (a RuntimeError) for the rest. Configuration: VRAMSWAP_* environment
variables (see README.md). PyTorch: vramswap.torch.enable(), or VRAMSWAP_TORCH=1 at import,
routes every CUDA tensor's memory through vramswap (see vramswap/torch.py).

vramswap.status() is `vramswap status --json` as a dict: who holds each device, who waits.
vramswap.release_requested() says whether an operator asked this process to let go of the
device (`vramswap release-request`).
Memory classes: vramswap.memory_tag("weights") tags the allocations made inside it;
vramswap.sleep(tags) takes them off the GPU and vramswap.wake(tags) brings them back at the
same addresses; vramswap.keep_resident() for processes that share a GPU by sleeping instead of
taking turns (docs/sleep.md). vramswap.torch_memory_saver is a drop-in for torch_memory_saver.
The package also carries the `vramswap` and `vramswapd` commands (console scripts, and
`python -m vramswap`) and, where it was built with cuda.h, the LD_PRELOAD shim
(`vramswap-preload-path`, vramswap.preload.path()).
"""

from ._vramswap import (
    CudaError,
    Error,
    UnavailableError,
    VersionMismatchError,
    __version__,
    _testing,
    acquire,
    acquire_devices,
    advise,
    free,
    held,
    keep_resident,
    malloc,
    release,
    release_cached,
    release_devices,
    release_requested,
    stats,
    tags,
)
from ._lock import gpu_lock, join_gang, leave_gang
from ._sleep import memory_tag, sleep, wake
from ._status import status

__all__ = [
    "CudaError",
    "Error",
    "UnavailableError",
    "VersionMismatchError",
    "__version__",
    "acquire",
    "acquire_devices",
    "advise",
    "free",
    "gpu_lock",
    "held",
    "join_gang",
    "keep_resident",
    "leave_gang",
    "malloc",
    "memory_tag",
    "release",
    "release_cached",
    "release_devices",
    "release_requested",
    "sleep",
    "stats",
    "status",
    "tags",
    "wake",
]

# VRAMSWAP_TORCH=1: PyTorch's CUDA memory goes through vramswap from the start (importing
# vramswap must then come before the first CUDA tensor).
import os as _os

if _os.environ.get("VRAMSWAP_TORCH", "") not in ("", "0"):
    from . import torch as _torch_integration

    _torch_integration._enable_from_environment()

