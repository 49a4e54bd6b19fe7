"""vramswap.gpu_lock: the device lock as a context manager and a decorator."""

import functools
import os

from ._vramswap import _check_timeout, _install_gpu_lock_methods, _join_gang


def join_gang(job=None, rank=None, world_size=None, device=None):
    """Make this process a rank of a gang: the ranks of one job, one process per device, that
    take their turns together (docs/lock.md, "Gangs of processes").

    From now on this process's locks of `device` (gpu_lock, acquire, vramswap.torch) are
    granted when every rank of the job has asked and the gang is next on every rank's device;
    each rank then has its own device's memory resident, and each release releases its own
    device. Release after the step's last collective.

    Under torchrun the defaults fit a job's ranks on one node: rank = LOCAL_RANK, world_size =
    LOCAL_WORLD_SIZE, device = the rank, and job = TORCHELASTIC_RUN_ID and
    TORCHELASTIC_RESTART_COUNT (a restarted job is a new gang); give job explicitly
    otherwise (a name that every rank gives: letters, digits, '-', '_', '.').

    Raises ValueError (bad arguments, another world size than the other ranks', the device
    held now), vramswap.Error (code VRAMSWAP_ERR_BUSY: that rank is taken; OWNER_DIED: the
    gang is broken, a rank died). A lock of the device raises vramswap.Error with
    code -1007 (owner died) when a rank died (restart the whole job), and TimeoutError naming
    the ranks that never asked.
    """
    env = os.environ
    if rank is None:
        rank = env.get("LOCAL_RANK")
        if rank is None:
            raise ValueError("join_gang: no rank given and LOCAL_RANK is not set (torchrun sets it)")
    if world_size is None:
        world_size = env.get("LOCAL_WORLD_SIZE")
        if world_size is None:
            raise ValueError("join_gang: no world_size given and LOCAL_WORLD_SIZE is not set (torchrun sets it)")
    try:
        rank, world_size = int(rank), int(world_size)
    except (TypeError, ValueError):
        raise ValueError(f"join_gang: rank {rank!r} and world_size {world_size!r} must be integers") from None
    if device is None:
        device = rank
    if job is None:
        run_id = env.get("TORCHELASTIC_RUN_ID", "")
        if run_id in ("", "none"):
            raise ValueError(
                "join_gang: no job given, and TORCHELASTIC_RUN_ID is not set (torchrun --rdzv-id sets it): name the job, "
                "the same for every rank"
            )
        job = f"{run_id}-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if not isinstance(job, str) or not job:
        raise ValueError(f"join_gang: job must be a non-empty str, not {job!r}")
    _join_gang(job, rank, world_size, device)


def leave_gang(device=0):
    """Leave the gang this process joined on `device` (join_gang): plain locks again."""
    _join_gang(None, 0, 0, device)


class gpu_lock:
    """Hold a device's cross-process lock for a block or a function call.

    with vramswap.gpu_lock(device=0, priority="normal", timeout=None):
        ...                         # this process's memory on the device is resident

    with vramswap.gpu_lock(devices=[0, 1]):
        ...                         # a gang: both devices at once, all or none

    @vramswap.gpu_lock(timeout=10)  # or plain @vramswap.gpu_lock
    def step(batch): ...

    priority: "normal" or "high" (high waiters go first; FIFO within a class).
    timeout: None waits as long as it takes; otherwise seconds, and TimeoutError when the
    lock was not had in time (0: only try); its message names the holder and the waiters
    ahead. The GIL is released while waiting.

    Interruptible like threading.Lock: Ctrl-C (any signal whose handler raises) while
    waiting leaves the queue and raises KeyboardInterrupt, holding nothing. Once the lock
    is granted, the block has begun: an interrupt from then on is raised inside the block
    and __exit__ releases the lock, or after the release. (__enter__ and __exit__ are C++:
    Python runs signal handlers only between its own bytecodes, so none can run between
    the grant and the block, nor between the block's end and the release.)

    The object keeps no state between uses: one instance may be entered by several threads
    (each waits for the lock in turn), re-entered by the holding thread (counted), and used
    as a decorator of recursive functions. Leaving the block releases the lock, also when an
    exception leaves it.

    Several devices: a gang, devices=[0, 1] (docs/lock.md, "Gangs"), waits in FIFO order on
    every one of them and is granted them together when it is next on each (a free member
    device idles meanwhile rather than serve those behind the gang); then this process's
    memory on all of them is resident, and leaving the block releases them all. Or one block
    per device, in increasing device order. A gang counts as taking all its devices at its
    lowest one.
    """

    def __new__(cls, device=0, *args, **kwargs):
        if callable(device):  # bare @vramswap.gpu_lock
            return cls()(device)
        return super().__new__(cls)

    def __init__(self, device=0, priority="normal", timeout=None, devices=None):
        if isinstance(device, bool) or not isinstance(device, int):
            raise ValueError(f"gpu_lock: device must be an int, not {device!r}")
        if priority not in ("normal", "high"):
            raise ValueError(f"gpu_lock: priority must be 'normal' or 'high', not {priority!r}")
        if devices is None:
            devices = (device,)
        else:
            if device != 0:
                raise ValueError("gpu_lock: give device or devices, not both")
            try:
                devices = tuple(devices)
            except TypeError:
                raise ValueError(f"gpu_lock: devices must be a list of ints, not {devices!r}") from None
            if not devices:
                raise ValueError("gpu_lock: devices is empty; list at least one")
            for d in devices:
                if isinstance(d, bool) or not isinstance(d, int):
                    raise ValueError(f"gpu_lock: devices must be ints, not {d!r}")
            if len(set(devices)) != len(devices):
                raise ValueError(f"gpu_lock: devices {list(devices)} lists a device twice")
            devices = tuple(sorted(devices))
        if timeout is not None:
            # Anything float() takes (numpy scalars, Decimal, Fraction), as acquire() does; its
            # range is acquire()'s rule (_check_timeout), told here rather than at the block.
            try:
                seconds = None if isinstance(timeout, (bool, str, bytes)) else float(timeout)
            except OverflowError:
                raise ValueError(f"gpu_lock: timeout {timeout!r} s is longer than a wait can be told; use None to wait "
                                 "as long as it takes") from None
            except (TypeError, ValueError):
                seconds = None
            if seconds is None:
                raise ValueError(f"gpu_lock: timeout must be None (wait) or a number of seconds, not {timeout!r}")
            _check_timeout("gpu_lock", seconds)
        self.devices = devices
        self.device = devices[0]
        self.priority = priority
        self.timeout = timeout

    # __enter__ and __exit__: installed below, from C++ (vramswap._vramswap._install_gpu_lock_methods).

    def __call__(self, func):
        @functools.wraps(func)
        def locked(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return locked

    def __repr__(self):
        if len(self.devices) > 1:
            return f"vramswap.gpu_lock(devices={list(self.devices)}, priority={self.priority!r}, timeout={self.timeout!r})"
        return f"vramswap.gpu_lock(device={self.device}, priority={self.priority!r}, timeout={self.timeout!r})"


_install_gpu_lock_methods(gpu_lock)
