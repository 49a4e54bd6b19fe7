"""The drop-in fronts on the host backend: vramswap.torch_memory_saver driven with the calls of
torch_memory_saver's own examples (regions with and without a CPU backup, pause and resume by
tag and for all, disable(), the calls it does not support), and the vLLM sleep-mode backend
driven as vLLM 0.25-0.34's worker drives it (levels 1 and 2, wake by tag, 0.34's
suspend(discardable), the factory's registration by name). The memory is vramswap.malloc's
under the regions' tags: without a CUDA PyTorch here, the same tags PyTorch's tensors get."""

import random
import sys
import types

import pytest

import vramswap

MiB = 1 << 20


def randbytes(n, seed):
    return random.Random(seed).randbytes(n)


@pytest.fixture
def tms():
    from vramswap.torch_memory_saver import TorchMemorySaver

    return TorchMemorySaver()  # a fresh one per test: each test has its own deployment


def test_torch_memory_saver_regions_pause_and_resume(tms):
    from vramswap import torch_memory_saver as module

    assert isinstance(module.torch_memory_saver, module.TorchMemorySaver)
    with tms.region(tag="weights", enable_cpu_backup=True):
        weights = vramswap.malloc(8 * MiB)
    with tms.region(tag="kv_cache"):
        kv = vramswap.malloc(6 * MiB)
    with tms.region(tag="weights"):  # the same tag without a backup: dropped on pause
        scratch = vramswap.malloc(2 * MiB)
    outside = vramswap.malloc(4 * MiB)
    data = {weights: randbytes(8 * MiB, 1), kv: randbytes(6 * MiB, 2), scratch: randbytes(2 * MiB, 3), outside: randbytes(4 * MiB, 4)}
    for p, b in data.items():
        vramswap._testing.write(p, b)

    tms.pause("kv_cache")
    assert vramswap.stats()["asleep_bytes"] == 6 * MiB
    tms.pause("kv_cache")  # paused already: nothing happens
    tms.pause()  # every tag
    s = vramswap.stats()
    assert s["asleep_bytes"] == 16 * MiB and s["resident_bytes"] == 4 * MiB
    assert vramswap._testing.read(outside, 4 * MiB) == data[outside], "memory outside regions is never paused"
    with tms.disable():  # temporary work while paused: untagged, resident
        tmp = vramswap.malloc(2 * MiB)
        vramswap._testing.write(tmp, b"\x01" * (2 * MiB))
    vramswap.free(tmp)

    tms.resume("weights")
    assert vramswap._testing.read(weights, 8 * MiB) == data[weights], "backed up: every byte"
    assert vramswap._testing.read(scratch, 2 * MiB) == bytes(2 * MiB), "no backup: not kept (zero-filled here)"
    assert vramswap.stats()["asleep_bytes"] == 6 * MiB
    tms.resume()
    assert vramswap._testing.read(kv, 6 * MiB) == bytes(6 * MiB)
    tms.resume()  # not paused: nothing happens
    assert vramswap.stats()["asleep_bytes"] == 0
    assert tms.enabled is True


def test_torch_memory_saver_refuses_what_it_cannot_honour(tms):
    with pytest.raises(ValueError, match="requires enable_cpu_backup"):
        with tms.region(cpu_backup_backend="pinned"):
            pass
    tms.hook_mode = "torch"
    with pytest.raises(ValueError, match="preload"):
        tms.hook_mode = "magic"
    with pytest.raises(AttributeError):
        tms.hook_mode
    with pytest.raises(NotImplementedError, match="page store"):
        tms.get_cpu_backup(None)
    tms.memory_margin_bytes = 1 << 30  # accepted, said once in the log
    tms.retain_cpu_backup = True
    assert tms.retain_cpu_backup is False
    with tms.region(tag="w", enable_cpu_backup=True):
        p = vramswap.malloc(MiB)
    tms.pause("w")
    with pytest.raises(ValueError, match="asleep"):
        with tms.region(tag="w", enable_cpu_backup=True):
            vramswap.malloc(MiB)
    tms.resume("w")
    vramswap.free(p)


def test_configure_subprocess_routes_children_through_vramswap(monkeypatch):
    from vramswap.torch_memory_saver import configure_subprocess

    monkeypatch.delenv("VRAMSWAP_TORCH", raising=False)
    import os

    with configure_subprocess():
        assert os.environ["VRAMSWAP_TORCH"] == "1"
    assert "VRAMSWAP_TORCH" not in os.environ


@pytest.fixture
def vllm_backend():
    import vramswap.vllm as module

    module.VramswapMemAllocator._instance = None  # one per process; each test has its own deployment
    return module


def worker_loads(allocator):
    """What vLLM's GPU worker does: weights under use_memory_pool("weights"), then the KV cache."""
    assert allocator.get_current_usage() == 0
    with allocator.use_memory_pool(tag="weights"):
        weights = vramswap.malloc(10 * MiB)
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = vramswap.malloc(8 * MiB)
    assert allocator.get_current_usage() == 18 * MiB
    return weights, kv


def test_vllm_backend_levels_and_wake_by_tag(vllm_backend):
    backend = vllm_backend.VramswapSleepBackend()  # the factory makes it with no arguments
    assert backend.state() == "RUNNING"
    weights, kv = worker_loads(vllm_backend.VramswapMemAllocator.get_instance())
    w, k = randbytes(10 * MiB, 5), randbytes(8 * MiB, 6)
    vramswap._testing.write(weights, w)
    vramswap._testing.write(kv, k)

    backend.suspend(1)  # level 1: weights offloaded, KV discarded
    assert backend.state() == "SUSPENDED"
    s = vramswap.stats()
    assert s["asleep_bytes"] == 18 * MiB and s["host_bytes"] == 10 * MiB
    backend.resume(["weights"])  # the RL pattern: weights first (then updated), KV after
    assert backend.state() == "RUNNING"
    assert vramswap._testing.read(weights, 10 * MiB) == w
    assert vramswap.stats()["asleep_bytes"] == 8 * MiB
    backend.resume(["kv_cache"])
    assert vramswap._testing.read(kv, 8 * MiB) == bytes(8 * MiB)

    backend.suspend(2)  # level 2: both discarded
    assert vramswap.stats()["host_bytes"] == 0
    backend.resume(None)
    assert vramswap._testing.read(weights, 10 * MiB) == bytes(10 * MiB)

    vramswap._testing.write(weights, w)
    backend.suspend(())  # vLLM 0.34: nothing discardable = level 1
    backend.resume()
    assert vramswap._testing.read(weights, 10 * MiB) == w
    backend.suspend({weights})  # vLLM 0.34: storages named = level 2
    assert vramswap.stats()["host_bytes"] == 0
    backend.resume()
    backend.discard(("kv_cache", "not_a_tag"))
    assert vramswap.stats()["asleep_bytes"] == 8 * MiB
    backend.resume(["kv_cache", "scheduling"])  # vLLM's own non-memory tags are ignored
    with pytest.raises(ValueError, match="level 3"):
        backend.suspend(3)
    assert vllm_backend.VramswapSleepBackend.preserves_communicators() is True


def test_vllm_plugin_registers_the_backend_by_name(vllm_backend, monkeypatch):
    # vLLM's registry as 0.25-0.34 have it (vllm/device_allocator/sleep_mode_backend.py):
    # register_backend(name, module_path, class_name), lazily imported, ValueError on a duplicate.
    registry = {}

    class SleepModeBackendFactory:
        @classmethod
        def register_backend(cls, name, module_path, class_name):
            if name in registry:
                raise ValueError(f"sleep-mode backend {name!r} is registered already")
            registry[name] = (module_path, class_name)

    fake = {
        "vllm": types.ModuleType("vllm"),
        "vllm.device_allocator": types.ModuleType("vllm.device_allocator"),
        "vllm.device_allocator.sleep_mode_backend": types.ModuleType("vllm.device_allocator.sleep_mode_backend"),
    }
    fake["vllm.device_allocator.sleep_mode_backend"].SleepModeBackendFactory = SleepModeBackendFactory
    fake["vllm.device_allocator"].get_mem_allocator_instance = lambda: "cumem"
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("VRAMSWAP_TORCH", "1")
    vllm_backend.register()
    vllm_backend.register()  # loaded twice: no error
    assert registry == {"vramswap": ("vramswap.vllm", "VramswapSleepBackend")}
    assert fake["vllm.device_allocator"].get_mem_allocator_instance() is vllm_backend.VramswapMemAllocator.get_instance()
