"""vramswap.torch_memory_saver: torch_memory_saver's interface, on vramswap's sleep and wake.

An SGLang or verl user changes one import:

    from vramswap.torch_memory_saver import torch_memory_saver   # was: from torch_memory_saver import ...

    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = load_model().cuda()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(kv_shape, dtype=torch.bfloat16, device="cuda")
    torch_memory_saver.pause("kv_cache")      # its frames are free for the trainer
    torch_memory_saver.pause()                # every tag
    torch_memory_saver.resume()               # back at the same addresses

What it does (docs/sleep.md): at first use this process keeps its GPU memory resident
(vramswap.keep_resident: it shares the GPU by sleeping, not by taking turns under the lock)
and PyTorch's CUDA memory goes through vramswap (vramswap.torch.enable(): import this module
before the first CUDA tensor, or set VRAMSWAP_TORCH=1). Inside region(tag), allocations of
the calling thread are vramswap memory of that tag; pause(tag) puts it to sleep: with
enable_cpu_backup=True its bytes go to host memory and come back on resume(); without, they
are dropped and resume() gives zero-filled memory (torch_memory_saver leaves it undefined:
zeros are one of its possible contents). The bytes move at the link rate through vramswap's
pager, and the frames pause() frees go to whichever process asks next.

Differences, each for a reason:
  - hook_mode: accepted ("preload", "torch") and ignored: vramswap routes PyTorch's memory
    one way (vramswap.torch), needing no LD_PRELOAD of torch_memory_saver's hook library.
  - cuda_graph(): captures with torch.cuda.graph as asked, but the graph's private memory is
    not tagged (it stays resident through pause()); torch_memory_saver's own "torch" hook mode
    cannot pause graph memory either. Said once in the log.
  - get_cpu_backup(): raises NotImplementedError: the offloaded bytes live in vramswap's page
    store, not in a tensor of the caller's.
  - memory_margin_bytes, retain_cpu_backup, set_disk_backup_dir(): accepted, with a warning
    that they change nothing here (vramswap sizes its host tier and swap directory itself:
    VRAMSWAP_HOST_LIMIT, VRAMSWAP_SWAP_DIR).
  - pause() of a tag paused already, or resume() of one not paused, does nothing (torch_memory_saver
    exits the process); pause/resume of a tag with no memory does nothing, as there.
  - enable_disk_backup=True: the bytes are offloaded like a CPU backup (vramswap spills to its
    swap directory past its host limit by itself).
"""

import contextlib
import logging
import os
import threading

from . import _sleep, _vramswap

__all__ = ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"]

_log = logging.getLogger("vramswap.torch_memory_saver")

# torch_memory_saver's tag and backup choice become one vramswap tag: offloaded or discarded
# as a whole on pause.
_KEEP = "keep"
_DROP = "drop"


def _vramswap_tag(tag, keep):
    return f"tms:{tag}:{_KEEP if keep else _DROP}"


def _split(vramswap_tag):
    """(tms tag, keep) of a vramswap tag this front made, else None."""
    if not vramswap_tag.startswith("tms:"):
        return None
    tag, _, kind = vramswap_tag[4:].rpartition(":")
    return (tag, kind == _KEEP) if kind in (_KEEP, _DROP) else None


class TorchMemorySaver:
    def __init__(self):
        self._lock = threading.Lock()
        self._devices = set()
        self._hook_mode = None
        self._warned = set()
        self._torch_routed = False

    # --- what torch_memory_saver users call ------------------------------------------------

    @contextlib.contextmanager
    def region(self, tag="default", enable_cpu_backup=False, enable_disk_backup=False, cpu_backup_backend=None):
        if cpu_backup_backend is not None and not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if cpu_backup_backend not in (None, "pinned", "mmap"):
            raise ValueError(f"cpu_backup_backend must be 'pinned' or 'mmap', not {cpu_backup_backend!r}")
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"region: tag must be a non-empty str, not {tag!r}")
        self._ensure_initialized()
        with _sleep.memory_tag(_vramswap_tag(tag, enable_cpu_backup or enable_disk_backup)):
            yield

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", tag="default", enable_cpu_backup=False,
                   cpu_backup_backend=None):
        import torch

        self._warn_once("cuda_graph", "cuda_graph(): the graph's private memory stays resident through pause() "
                        "(vramswap does not tag memory allocated during a capture)")
        self._ensure_initialized()
        with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
            yield

    @contextlib.contextmanager
    def disable(self):
        """Allocations inside are untagged (they stay resident through pause())."""
        self._ensure_initialized()
        previous = _vramswap._thread_tag()
        _vramswap._set_thread_tag("")
        try:
            yield
        finally:
            _vramswap._set_thread_tag(previous)

    def pause(self, tag=None):
        """Put the memory of `tag` (None or "": every tag) to sleep: backed-up regions' bytes go
        to host memory, the others are dropped; the frames are free for other processes. The
        blocks of freed tensors that vramswap keeps for reuse are given back too."""
        self._ensure_initialized()
        for device in sorted(self._devices):
            asked = {}
            for t in _vramswap.tags(device):
                parts = _split(t["name"])
                if parts is None or (tag and parts[0] != tag) or t["asleep"]:
                    continue
                asked[t["name"]] = "offload" if parts[1] else "discard"
            if asked:
                _sleep.sleep(asked, device=device)
            # Freed tensors' blocks kept for reuse hold frames too: give them back with the pause.
            _vramswap.release_cached(device)

    def resume(self, tag=None):
        """Bring the memory of `tag` (None or "": every tag) back at the same addresses."""
        self._ensure_initialized()
        for device in sorted(self._devices):
            names = [t["name"] for t in _vramswap.tags(device)
                     if t["asleep"] and (parts := _split(t["name"])) is not None and (not tag or parts[0] == tag)]
            if names:
                _sleep.wake(names, device=device)

    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        raise AttributeError("hook_mode is write-only (as in torch_memory_saver)")

    @hook_mode.setter
    def hook_mode(self, mode):
        if mode not in ("preload", "torch"):
            raise ValueError(f"hook_mode must be 'preload' or 'torch', not {mode!r}")
        self._hook_mode = mode  # accepted; vramswap routes PyTorch's memory one way

    @property
    def memory_margin_bytes(self):
        raise NotImplementedError("memory_margin_bytes can only be set (as in torch_memory_saver)")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        self._warn_once("memory_margin_bytes", "memory_margin_bytes changes nothing under vramswap (allocations fail when the "
                        "pool cannot hold them)")

    @property
    def retain_cpu_backup(self):
        return False

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        self._warn_once("retain_cpu_backup", "retain_cpu_backup changes nothing under vramswap (its host tier keeps slots "
                        "pinned ahead for the next pause)")

    def set_disk_backup_dir(self, path):
        os.makedirs(path, exist_ok=True)
        self._warn_once("set_disk_backup_dir", "set_disk_backup_dir changes nothing under vramswap: its swap directory is "
                        "VRAMSWAP_SWAP_DIR")

    def get_cpu_backup(self, x, zero_copy=False):
        raise NotImplementedError("vramswap.torch_memory_saver: get_cpu_backup() is not supported: paused bytes live in "
                                  "vramswap's page store, not in a tensor; resume() the tag and read the tensor instead")

    # --- helpers ------------------------------------------------------------------------------

    def _ensure_initialized(self):
        with self._lock:
            device = 0
            try:
                import torch
            except ImportError:
                torch = None
            if torch is not None and torch.cuda.is_available():
                if not self._torch_routed:
                    from . import torch as vramswap_torch

                    vramswap_torch.enable()
                    self._torch_routed = True
                device = torch.cuda.current_device()
            if device not in self._devices:
                _vramswap.keep_resident(device)
                self._devices.add(device)

    def _warn_once(self, key, text):
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("vramswap.torch_memory_saver: %s", text)


@contextlib.contextmanager
def configure_subprocess():
    """Children started inside route PyTorch's memory through vramswap from their start
    (VRAMSWAP_TORCH=1), as torch_memory_saver's hook library would be preloaded into them."""
    previous = os.environ.get("VRAMSWAP_TORCH")
    os.environ["VRAMSWAP_TORCH"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("VRAMSWAP_TORCH", None)
        else:
            os.environ["VRAMSWAP_TORCH"] = previous


torch_memory_saver = TorchMemorySaver()
