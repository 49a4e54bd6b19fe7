"""Memory classes and sleep/wake (docs/sleep.md): the Python face of vramswap_sleep & co.

    import vramswap
    vramswap.keep_resident()                       # share the GPU by sleeping, not by turns
    with vramswap.memory_tag("weights"):
        weights = vramswap.malloc(16 << 30)        # (or PyTorch tensors, with vramswap.torch)
    vramswap.sleep({"weights": "offload", "kv_cache": "discard"})
    ...                                            # another process has the GPU's memory
    vramswap.wake()                                # every sleeping tag back, addresses unchanged
"""

import contextlib

from . import _vramswap

_MODES = {"offload": 0, "discard": 1}


def _mode_number(tag, mode):
    try:
        return _MODES[mode]
    except (KeyError, TypeError):
        raise ValueError(f"vramswap.sleep: tag {tag!r}: mode {mode!r} is neither 'offload' nor 'discard'") from None


def sleep(tags=None, mode="offload", device=0):
    """Put memory classes to sleep: their memory leaves the GPU, and its frames go to whoever
    needs them next, until wake(). The addresses stay valid; the GPU must not touch the memory
    while it sleeps.

    tags: a tag, a list of tags, a dict {tag: mode}, or None (every tag of this process that is
    awake). mode (for a tag or a list): 'offload' keeps the bytes in host memory (disk past its
    limit) and wake() brings them back; 'discard' drops them, and wake() gives the memory back
    zero-filled. A tag asleep already stays so (a discard drops what an offload kept). Raises
    ValueError (an unknown tag, a bad mode, an oversubscribed process), MemoryError,
    vramswap.Error (the message says which tags sleep after a failure; offloaded bytes are
    never lost)."""
    if tags is None:
        asked = [(t["name"], _mode_number(t["name"], mode)) for t in _vramswap.tags(device) if not t["asleep"]]
    elif isinstance(tags, str):
        asked = [(tags, _mode_number(tags, mode))]
    elif isinstance(tags, dict):
        asked = [(t, _mode_number(t, m)) for t, m in tags.items()]
    else:
        asked = [(t, _mode_number(t, mode)) for t in tags]
    for t, _ in asked:
        if not isinstance(t, str):
            raise ValueError(f"vramswap.sleep: a tag is a str, not {t!r}")
    _vramswap._sleep(asked, device)


def wake(tags=None, device=0):
    """Wake memory classes: a tag, a list of tags, or None (every sleeping tag). Their memory
    comes back now when this process's memory is resident (it holds the lock, or called
    keep_resident()), else at its next lock; frames are taken free, or asked of processes
    between turns, as a lock takes them. Offloaded bytes come back as they were, discarded
    ones zero-filled, at the same addresses. A tag awake already is left as it is. Raises
    ValueError (an unknown tag), TimeoutError (no frames within VRAMSWAP_EVICT_TIMEOUT: the
    message names who holds them), vramswap.Error; the tags not woken stay asleep."""
    if isinstance(tags, str):
        tags = [tags]
    _vramswap._wake(None if tags is None else list(tags), device)


@contextlib.contextmanager
def memory_tag(tag):
    """Allocations this thread makes inside (vramswap.malloc, and PyTorch's through
    vramswap.torch) are memory of `tag`. Scopes nest; the previous tag is back on exit."""
    previous = _vramswap._thread_tag()
    _vramswap._set_thread_tag(tag)
    try:
        yield
    finally:
        _vramswap._set_thread_tag(previous)
