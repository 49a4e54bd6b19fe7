"""vramswap: time-share one GPU among processes whose GPU memory does not fit on it together.

    import vramswap

    with vramswap.gpu_lock():          # waits (FIFO, by priority); memory swapped in
        step(model, batch)             # the device is this process's alone
                                       # on exit: device work synchronized, lock released

    @vramswap.gpu_lock(device=0, priority="high", timeout=30)
    def step(...): ...

Errors: ValueError (bad argument, device order), MemoryError, TimeoutError, and
vramswap.Error (a RuntimeError) for the rest. Configuration: VRAMSWAP_* environment
variables (see README.md). PyTorch integration will live in vramswap.torch (not yet).
"""

from ._vramswap import (
    CudaError,
    Error,
    UnavailableError,
    VersionMismatchError,
    __version__,
    _testing,
    acquire,
    advise,
    free,
    held,
    malloc,
    release,
    stats,
)
from ._lock import gpu_lock

__all__ = [
    "CudaError",
    "Error",
    "UnavailableError",
    "VersionMismatchError",
    "__version__",
    "acquire",
    "advise",
    "free",
    "gpu_lock",
    "held",
    "malloc",
    "release",
    "stats",
]
