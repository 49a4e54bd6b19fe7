"""vramswap.vllm: a vLLM sleep-mode backend ("vramswap") on vramswap's sleep and wake.

    pip install vramswap                 # registers the plug-in (entry point vllm.general_plugins)
    VRAMSWAP_TORCH=1 vllm serve MODEL --enable-sleep-mode --sleep-mode-backend vramswap

vLLM (0.25 and later) picks its sleep implementation through SleepModeBackendFactory by the
name in --sleep-mode-backend; third-party backends register from a `vllm.general_plugins`
entry point, loaded in every vLLM process. register() below is that entry point: it
registers VramswapSleepBackend as "vramswap" and, when vramswap routes PyTorch's memory
(VRAMSWAP_TORCH=1), puts VramswapMemAllocator where vLLM's worker asks for its memory
allocator (vllm.device_allocator.get_mem_allocator_instance), so that the worker's
use_memory_pool(tag="weights") / (tag="kv_cache") tag vramswap memory instead of making
cuMem* pools of its own.

What each level does (vLLM's meaning, measured in bench/results/sleep_wake.md):
  level 1: "weights" offloaded to host memory, "kv_cache" (and every other tag) discarded;
  level 2: everything discarded (vLLM reloads or receives the weights after waking);
  resume(tags): those tags woken (None: all), at the same addresses, offloaded bytes as
  they were, discarded ones zero-filled.
Sleep gives the frames back to the pool at the link rate; another process (a trainer)
takes them as it wakes or allocates, and this one's wake takes them back.

The interface followed is vLLM 0.25-0.33's SleepModeBackend (suspend(level), resume(tags),
discard(tags), state(), the class-level capability flags) and 0.34's suspend(discardable):
a collection instead of a level, meaning level 2 when it names any storage and level 1 when
empty (vramswap sleeps whole tags, not single tensors). Where vLLM is not installed, the
classes below still exist (their base is a stand-in with the same methods), so that the
backend can be driven as vLLM drives it (tests/python/test_vllm_backend.py).
"""

import contextlib
import os

from . import _sleep, _vramswap

__all__ = ["VramswapMemAllocator", "VramswapSleepBackend", "register"]

BACKEND_NAME = "vramswap"
_OFFLOADED_AT_LEVEL_1 = ("weights",)

try:  # vLLM >= 0.25
    from vllm.device_allocator.sleep_mode_backend import SleepModeBackend as _Base
except ImportError:  # no vLLM (or an older one): the same interface, for driving it without vLLM

    class _Base:
        def __init__(self):
            self._state = "RUNNING"

        def state(self):
            return self._state

        @classmethod
        def is_supported(cls):
            return True

        @classmethod
        def preserves_communicators(cls):
            return False

        @classmethod
        def preserves_compiled_artifacts(cls):
            return False

        @classmethod
        def preserves_graphs_with_communicators(cls):
            return False

        @classmethod
        def supports_durable_storage(cls):
            return False


def _current_device():
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_device()
    except ImportError:
        pass
    return 0


class VramswapMemAllocator:
    """vLLM's MemAllocator (use_memory_pool, sleep, wake_up, get_current_usage, discard) over
    vramswap memory tags. One per process, as vLLM's CuMemAllocator."""

    _instance = None

    @classmethod
    def get_instance(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self):
        self._device = None

    def _ready(self):
        if self._device is None:
            self._device = _current_device()
            _vramswap.keep_resident(self._device)
        return self._device

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        self._ready()
        with _sleep.memory_tag(tag or "default"):
            yield

    def sleep(self, offload_tags=None, discardable=()):
        """offload_tags (None: ("default",); a str: one tag) keep their bytes in host memory;
        every other tag's memory is dropped. `discardable` (vLLM 0.34: storages needing no
        backup) is honoured for whole tags only: it is ignored here."""
        device = self._ready()
        if offload_tags is None:
            offload_tags = ("default",)
        elif isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        asked = {t["name"]: ("offload" if t["name"] in offload_tags else "discard") for t in _vramswap.tags(device)}
        if asked:
            _sleep.sleep(asked, device=device)

    def discard(self, tags):
        device = self._ready()
        known = {t["name"] for t in _vramswap.tags(device)}
        asked = {t: "discard" for t in tags if t in known}
        if asked:
            _sleep.sleep(asked, device=device)

    def wake_up(self, tags=None):
        device = self._ready()
        if tags is not None:
            known = {t["name"] for t in _vramswap.tags(device)}
            tags = [t for t in tags if t in known]
            if not tags:
                return
        _sleep.wake(tags, device=device)

    def get_current_usage(self):
        device = self._ready()
        return sum(t["allocated_bytes"] for t in _vramswap.tags(device))


class VramswapSleepBackend(_Base):
    """vLLM's SleepModeBackend, named "vramswap"."""

    def __init__(self):
        super().__init__()
        self._allocator = VramswapMemAllocator.get_instance()

    def suspend(self, level=1):
        if isinstance(level, int) and not isinstance(level, bool):
            if level not in (1, 2):
                raise ValueError(f"vramswap sleep backend: level {level} is not 1 (offload weights) or 2 (discard all)")
            offload = _OFFLOADED_AT_LEVEL_1 if level == 1 else ()
        else:  # vLLM 0.34: the storages that need no backup; any means level 2
            offload = () if len(level) > 0 else _OFFLOADED_AT_LEVEL_1
        self._allocator.sleep(offload_tags=offload)
        self._state = "SUSPENDED"

    def resume(self, tags=None):
        self._state = "RESUMING"
        self._allocator.wake_up(tags)
        self._state = "RUNNING"

    def discard(self, tags):
        self._allocator.discard(tags)

    @classmethod
    def is_supported(cls):
        try:
            import torch
        except ImportError:
            return False
        return torch.cuda.is_available()

    @classmethod
    def preserves_communicators(cls):
        # NCCL's own buffers are outside vramswap's pool: they stay on the device, and the
        # communicators with them (docs/sleep.md, "NCCL").
        return True


def register():
    """The vllm.general_plugins entry point: register the backend by name, and route the
    worker's memory pools to vramswap tags when vramswap holds PyTorch's memory."""
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
    except ImportError:
        return  # a vLLM without sleep-mode backends: nothing to plug into
    try:
        SleepModeBackendFactory.register_backend(BACKEND_NAME, __name__, "VramswapSleepBackend")
    except ValueError:
        pass  # registered already (the plug-in is loaded once per process, but be safe)
    if os.environ.get("VRAMSWAP_TORCH", "") == "1":
        import vllm.device_allocator as allocators

        allocators.get_mem_allocator_instance = VramswapMemAllocator.get_instance
