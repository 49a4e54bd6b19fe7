"""vramswap.gpu_lock: the device lock as a context manager and a decorator."""

import functools

from ._vramswap import _install_gpu_lock_enter, release


class gpu_lock:
    """Hold a device's cross-process lock for a block or a function call.

    with vramswap.gpu_lock(device=0, priority="normal", timeout=None):
        ...                         # this process's memory on the device is resident

    @vramswap.gpu_lock(timeout=10)  # or plain @vramswap.gpu_lock
    def step(batch): ...

    priority: "normal" or "high" (high waiters go first; FIFO within a class).
    timeout: None waits as long as it takes; otherwise seconds, and TimeoutError when the
    lock was not had in time (0: only try); its message names the holder and the waiters
    ahead. The GIL is released while waiting.

    Interruptible like threading.Lock: Ctrl-C (any signal whose handler raises) while
    waiting leaves the queue and raises KeyboardInterrupt, holding nothing. Once the lock
    is granted, the block has begun: an interrupt from then on is raised inside the block
    and __exit__ releases the lock. (__enter__ is C++, so nothing runs in between.)

    The object keeps no state between uses: one instance may be entered by several threads
    (each waits for the lock in turn), re-entered by the holding thread (counted), and used
    as a decorator of recursive functions. Leaving the block releases the lock, also when an
    exception leaves it. Locks of several devices: take them in increasing device order.
    """

    def __new__(cls, device=0, *args, **kwargs):
        if callable(device):  # bare @vramswap.gpu_lock
            return cls()(device)
        return super().__new__(cls)

    def __init__(self, device=0, priority="normal", timeout=None):
        if isinstance(device, bool) or not isinstance(device, int):
            raise ValueError(f"gpu_lock: device must be an int, not {device!r}")
        if priority not in ("normal", "high"):
            raise ValueError(f"gpu_lock: priority must be 'normal' or 'high', not {priority!r}")
        self.device = device
        self.priority = priority
        self.timeout = timeout

    # __enter__: installed below, from C++ (vramswap._vramswap._install_gpu_lock_enter).

    def __exit__(self, exc_type, exc, tb):
        release(self.device)
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def locked(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return locked

    def __repr__(self):
        return f"vramswap.gpu_lock(device={self.device}, priority={self.priority!r}, timeout={self.timeout!r})"


_install_gpu_lock_enter(gpu_lock)
