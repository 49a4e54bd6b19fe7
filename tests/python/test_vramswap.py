"""The Python package on the host backend: the lock as context manager and decorator, a
timeout against another process (a Python subprocess holding the lock), errors mapped to
the Python exceptions a user expects, stats, and device memory round trips."""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import vramswap

HOLDER = r"""
import sys, time, vramswap
with vramswap.gpu_lock(int(sys.argv[1])):
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def spawn_holder(device=0, seconds=2.0):
    """A second process that holds the lock; returns once it does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(device), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    line = proc.stdout.readline()
    assert line.strip() == "holding", f"the holder did not take the lock (exit {proc.poll()})"
    return proc


def test_context_manager_holds_and_releases():
    assert vramswap.held(0) == 0
    with vramswap.gpu_lock() as lock:
        assert isinstance(lock, vramswap.gpu_lock)
        assert vramswap.held(0) == 1
        with vramswap.gpu_lock(0, priority="high"):  # re-entry: counted
            assert vramswap.held(0) == 2
        assert vramswap.held(0) == 1
    assert vramswap.held(0) == 0
    assert vramswap.stats()["acquires"] == 1


def test_released_when_the_block_raises():
    with pytest.raises(KeyError):
        with vramswap.gpu_lock():
            raise KeyError("boom")
    assert vramswap.held(0) == 0


def test_decorator_with_and_without_arguments():
    @vramswap.gpu_lock(device=0, timeout=5)
    def step(x):
        assert vramswap.held(0) == 1
        return x * 2

    @vramswap.gpu_lock
    def plain():
        return vramswap.held(0)

    assert step(21) == 42
    assert plain() == 1
    assert step.__name__ == "step"
    assert vramswap.held(0) == 0
    assert vramswap.stats()["acquires"] == 2


def test_timeout_while_another_process_holds_the_lock():
    holder = spawn_holder(0, 2.0)
    try:
        assert vramswap.acquire(0, timeout=0) is False  # a try
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"gpu_lock\(device 0\): not acquired within 0.2 s"):
            with vramswap.gpu_lock(timeout=0.2):
                pass
        assert time.monotonic() - t0 >= 0.2
        assert vramswap.held(0) == 0
        # Waiting releases the GIL: another thread runs meanwhile.
        ticks = []
        stop = threading.Event()

        def ticker():
            while not stop.is_set():
                ticks.append(1)
                time.sleep(0.01)

        t = threading.Thread(target=ticker)
        t.start()
        with vramswap.gpu_lock():  # waits for the holder to finish
            stop.set()
        t.join()
        assert len(ticks) >= 10
    finally:
        assert holder.wait(timeout=30) == 0


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="priority must be 'normal' or 'high'"):
        vramswap.gpu_lock(priority="urgent")
    with pytest.raises(ValueError, match="priority"):
        vramswap.acquire(0, "urgent")
    with pytest.raises(ValueError, match="no such device"):
        with vramswap.gpu_lock(device=5):
            pass
    with pytest.raises(ValueError, match="device must be an int"):
        vramswap.gpu_lock(device="0")
    with pytest.raises(ValueError, match="timeout"):
        vramswap.acquire(0, timeout=-1)
    # Told at construction, as the other arguments are, not when the block is entered.
    with pytest.raises(ValueError, match="gpu_lock: timeout must be None .* not '5'"):
        vramswap.gpu_lock(timeout="5")
    with pytest.raises(ValueError, match="gpu_lock: timeout must be None .* not nan"):
        vramswap.gpu_lock(timeout=float("nan"))
    # Longer than nanoseconds in 64 bits can count: refused, not wrapped into a negative time.
    with pytest.raises(ValueError, match="timeout 1e\\+10 s is longer than .* use None"):
        vramswap.acquire(0, timeout=1e10)
    with pytest.raises(ValueError, match="use None to wait"):
        with vramswap.gpu_lock(timeout=1e300):
            pass
    assert vramswap.held(0) == 0
    with pytest.raises(ValueError, match="size 0"):
        vramswap.malloc(0)
    with pytest.raises(ValueError, match="advice must be"):
        vramswap.advise(0, 1, "sometimes")


def test_device_order_is_enforced():
    with vramswap.gpu_lock(1):
        with pytest.raises(ValueError, match="increasing device order") as info:
            with vramswap.gpu_lock(0):
                pass
        assert info.value.code == -1000
        assert vramswap.acquire(0, timeout=0) is True  # a try may go in any order
        vramswap.release(0)
    with vramswap.gpu_lock(0), vramswap.gpu_lock(1):
        assert vramswap.held(0) == 1 and vramswap.held(1) == 1


GANG_WORKER = r"""
import random, sys, vramswap
seed, rounds = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
for r in range(rounds):
    kind = rng.randrange(3)
    lock = vramswap.gpu_lock(kind) if kind < 2 else vramswap.gpu_lock(devices=[1, 0])
    with lock:
        held = [vramswap.held(d) for d in (0, 1)]
        want = [1, 1] if kind == 2 else [int(kind == 0), int(kind == 1)]
        assert held == want, (held, want)
print("done", flush=True)
"""


def test_gang_of_devices_all_or_none():
    with vramswap.gpu_lock(devices=[1, 0]) as both:
        assert both.devices == (0, 1) and both.device == 0
        assert vramswap.held(0) == 1 and vramswap.held(1) == 1
        with vramswap.gpu_lock(devices=[0, 1]):  # the whole gang again: re-entry
            assert vramswap.held(1) == 2
    assert vramswap.held(0) == 0 and vramswap.held(1) == 0
    assert "devices=[0, 1]" in repr(vramswap.gpu_lock(devices=[0, 1]))
    holder = spawn_holder(1, 1.0)
    try:
        # Device 0 is free, device 1 held: a gang try takes nothing.
        assert vramswap.acquire_devices([0, 1], timeout=0) is False
        assert vramswap.held(0) == 0
        with pytest.raises(TimeoutError, match="devices 0,1"):
            with vramswap.gpu_lock(devices=[0, 1], timeout=0.2):
                pass
        with vramswap.gpu_lock(devices=[0, 1], timeout=30):  # granted once the holder is done
            assert holder.poll() is not None or vramswap.held(1) == 1
    finally:
        holder.wait()
    assert vramswap.acquire_devices([0, 1]) is True
    vramswap.release_devices([0, 1])
    with pytest.raises(vramswap.Error, match="does not hold"):
        vramswap.release_devices([0, 1])
    with vramswap.gpu_lock(1):
        with pytest.raises(ValueError, match="increasing device order"):
            with vramswap.gpu_lock(devices=[0, 1]):
                pass
    for bad in ([], [0, 0], ["0"], 5):
        with pytest.raises(ValueError):
            vramswap.gpu_lock(devices=bad)
    with pytest.raises(ValueError, match="not both"):
        vramswap.gpu_lock(1, devices=[0, 1])


def test_gangs_and_singles_in_several_processes():
    procs = [
        subprocess.Popen([sys.executable, "-c", GANG_WORKER, str(seed), "60"], stdout=subprocess.PIPE, text=True,
                         env=os.environ.copy())
        for seed in (1, 2, 3)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "done"


RANK_WORKER = r"""
import os, sys, vramswap
vramswap.join_gang(job=sys.argv[1])  # rank, world size, device: torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE
for _ in range(20):
    with vramswap.gpu_lock(int(os.environ["LOCAL_RANK"])):
        pass
print("done", flush=True)
"""


def test_ranks_of_a_job_take_turns_together(deployment):
    job = "py-" + deployment["VRAMSWAP_SHM_PREFIX"]
    procs = []
    for rank in (0, 1):
        env = os.environ.copy()
        env.update({"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"})
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_WORKER, job], stdout=subprocess.PIPE, text=True, env=env))
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "done"
    with pytest.raises(ValueError, match="no job given"):
        saved = {k: os.environ.pop(k, None) for k in ("TORCHELASTIC_RUN_ID",)}
        try:
            vramswap.join_gang(rank=0, world_size=2)
        finally:
            os.environ.update({k: v for k, v in saved.items() if v is not None})
    with pytest.raises(ValueError, match="world size"):
        vramswap.join_gang("j", rank=2, world_size=2, device=0)


def test_release_without_acquire_is_an_error():
    with pytest.raises(vramswap.Error, match="does not hold") as info:
        vramswap.release(0)
    assert isinstance(info.value, RuntimeError)
    assert info.value.code == -1010


def test_out_of_memory_raises_memory_error():
    with pytest.raises(MemoryError, match="malloc"):
        vramswap.malloc(1 << 40)


def test_stats_keys():
    s = vramswap.stats()
    assert set(s) == {
        "allocated_bytes", "allocations", "resident_bytes", "host_bytes", "disk_bytes", "bytes_in", "bytes_out",
        "acquires", "evictions_served", "lock_holder_deaths", "acquire_seconds", "lock_wait_seconds",
        "evict_seconds", "restore_seconds", "cached_bytes", "graph_bytes", "host_frame_bytes", "pages_demoted",
        "pages_promoted", "reclaim_seconds", "cache_hits", "cache_misses", "cache_trims", "allocator_seconds",
        "yield_waits", "yield_seconds", "frames_asked_ahead", "frames_asked_at_acquire", "cache_miss_bytes",
        "placement_rounds", "placement_rounds_skipped", "pages_placed_in", "pages_placed_out", "host_pinned_bytes",
        "asleep_bytes",
    }
    assert s["allocations"] == 0 and s["acquires"] == 0


PINNED = r"""
import json, vramswap
n = 8 << 20
ptr = vramswap.malloc(n)
before = vramswap.stats()["host_pinned_bytes"]
with vramswap.gpu_lock():
    vramswap._testing.write(ptr, bytes(range(256)) * (n // 256))
after = vramswap.stats()
with vramswap.gpu_lock():
    intact = vramswap._testing.read(ptr, n) == bytes(range(256)) * (n // 256)
print(json.dumps({"before": before, "host": after["host_bytes"], "pinned": after["host_pinned_bytes"], "intact": intact}))
"""


def test_host_pinned_bytes_count_what_the_first_eviction_pinned():
    # A fresh process whose release evicts everything, with nothing pinned ahead: before
    # the eviction it has pinned nothing, after it at least what it saved.
    env = dict(os.environ, VRAMSWAP_EAGER_RELEASE="1", VRAMSWAP_HOST_PIN_AHEAD="0")
    out = subprocess.run([sys.executable, "-c", PINNED], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["intact"]
    assert r["before"] == 0
    assert r["host"] >= 8 << 20
    assert r["pinned"] >= r["host"]


def test_malloc_free_round_trip_across_turns():
    n = 5 * (1 << 20) + 77
    ptr = vramswap.malloc(n)
    assert ptr % 256 == 0
    data = random.Random(1).randbytes(n)
    with pytest.raises(vramswap.Error, match="take the device's lock first"):
        vramswap._testing.write(ptr, data)
    with vramswap.gpu_lock():
        vramswap._testing.write(ptr, data)
        assert vramswap.stats()["resident_bytes"] >= n
    spawn_holder(0, 0.05).wait(timeout=30)  # another process takes a turn in between
    with vramswap.gpu_lock():
        assert vramswap._testing.read(ptr, n) == data
    vramswap.advise(ptr, n, "read_mostly")
    s = vramswap.stats()
    assert s["allocations"] == 1 and s["allocated_bytes"] >= n and s["acquires"] == 2
    vramswap.free(ptr)
    with pytest.raises(ValueError):
        vramswap.free(ptr)  # double free
    vramswap.free(0)
    assert vramswap.stats()["allocations"] == 0


def test_memory_larger_than_the_pool_is_a_clear_error_and_the_lock_is_not_kept():
    ptr = vramswap.malloc(80 << 20)  # the pool has 64 MiB
    with pytest.raises(MemoryError):
        with vramswap.gpu_lock():
            pass
    assert vramswap.held(0) == 0
    vramswap.free(ptr)
    with vramswap.gpu_lock():
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_child_gets_a_clear_error():
    with vramswap.gpu_lock():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it saw, and leave without cleanup
            try:
                vramswap.acquire(0)
                msg = b"no error"
            except vramswap.UnavailableError as e:
                msg = b"ok" if "forked" in str(e) else str(e).encode()
            except BaseException as e:  # noqa: BLE001
                msg = repr(e).encode()
            os.write(w, msg)
            os._exit(0)
        os.close(w)
        got = os.read(r, 4096)
        os.close(r)
        os.waitpid(pid, 0)
        assert got == b"ok"
        assert vramswap.held(0) == 1


def test_release_cached_with_nothing_cached_is_harmless():
    vramswap.release_cached()
    assert vramswap.stats()["cached_bytes"] == 0


def test_torch_module_imports_without_torch_and_bad_env_is_refused():
    import subprocess
    import sys

    import vramswap.torch

    assert vramswap.torch.enabled() is False
    env = dict(os.environ, VRAMSWAP_TORCH="yes")
    r = subprocess.run([sys.executable, "-c", "import vramswap"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "VRAMSWAP_TORCH='yes'" in r.stderr, r.stderr


TORCH_ENTRY_POINTS = r"""
import ctypes, vramswap
lib = ctypes.CDLL(vramswap._vramswap.__file__)
malloc, free = lib.vramswap_torch_malloc, lib.vramswap_torch_free
malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
MiB = 1 << 20
stream = ctypes.c_void_p(0x77)
with vramswap.gpu_lock():
    p = malloc(MiB, 0, stream)
    assert p, "no memory"
    vramswap._testing.write(p, b"x" * MiB)
    free(p, MiB, 0, stream)
    q = malloc(MiB, 0, stream)
    assert q == p, "a block freed on a stream serves that stream's next allocation"
    free(q, MiB, 0, stream)
assert vramswap.stats()["cached_bytes"] == 2 * MiB, vramswap.stats()  # its small segment, all free
assert malloc(0, 0, stream) is None, "0 bytes: no memory, as PyTorch's own allocator"
a, b = malloc(4096, 0, stream), malloc(4096, 0, stream)  # outside the lock: backed from free frames
free(a, 4096, 0, stream)
free(b, 4096, 0, stream)
free(a, 4096, 0, stream)  # a double free is reported, never fatal
vramswap.release_cached()
print("ok")
"""


def test_torch_allocator_entry_points_on_the_host_backend():
    """The two functions vramswap.torch hands to PyTorch, called as PyTorch calls them (through
    dlsym'd C symbols), on the host backend: no PyTorch or GPU needed."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", TORCH_ENTRY_POINTS], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert "does not hold" not in r.stderr, "an allocation outside the lock that could be backed warns of nothing"
    assert "freeing a PyTorch block failed" in r.stderr and "double free" in r.stderr, r.stderr


def test_a_malformed_setting_raises_at_the_first_lock_and_a_typo_warns_once():
    code = "import vramswap\nwith vramswap.gpu_lock(0):\n    pass\nwith vramswap.gpu_lock(0):\n    pass\n"
    env = dict(os.environ, VRAMSWAP_HOST_LIMIT="abc", VRAMSWAP_LOG="warn")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stderr
    assert "ValueError" in r.stderr, r.stderr
    assert 'VRAMSWAP_HOST_LIMIT="abc" is not a size; expected a size' in r.stderr, r.stderr
    assert 'percentage of RAM ("50%")' in r.stderr, r.stderr

    env = dict(os.environ, VRAMSWAP_POOLSIZE="1", VRAMSWAP_LOG="warn")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("VRAMSWAP_POOLSIZE") == 1, r.stderr
    assert "did you mean VRAMSWAP_POOL_SIZE?" in r.stderr, r.stderr


# --- interrupting a wait (Ctrl-C) ------------------------------------------------------------

HOLD_UNTIL_EOF = r"""
import sys, vramswap
with vramswap.gpu_lock(0):
    print("holding", flush=True)
    sys.stdin.read()
"""

WAIT_THEN_REPORT = r"""
import sys, vramswap
print("ready", flush=True)
try:
    with vramswap.gpu_lock(0):
        print("granted", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {vramswap.held(0)}", flush=True)
sys.stdin.read()
"""


def default_sigint():
    """For the processes these tests interrupt: Python installs its KeyboardInterrupt handler
    only where SIGINT is not ignored at start, and a shell's background job (a CI runner's
    `cmd &`) inherits it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn_script(script):
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
        preexec_fn=default_sigint,
    )


def read_line(proc, timeout=30.0):
    """The next line of proc's stdout, or None when none came within `timeout`."""
    import queue

    lines = getattr(proc, "_lines", None)
    if lines is None:
        lines = proc._lines = queue.Queue()

        def pump():
            for line in proc.stdout:
                lines.put(line.strip())

        threading.Thread(target=pump, daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def eventually(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def queued_pids():
    return [pid for pid, holding in vramswap._testing.lock_queue("host-0") if not holding]


def finish(proc):
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=20)
        except Exception:
            proc.kill()
            proc.wait()


def test_ctrl_c_while_waiting_leaves_the_queue_at_once_and_raises():
    holder = spawn_script(HOLD_UNTIL_EOF)
    waiter = None
    try:
        assert read_line(holder) == "holding"
        # Only now: started together, the waiter could take the lock before the holder.
        waiter = spawn_script(WAIT_THEN_REPORT)
        assert read_line(waiter) == "ready"
        queued = eventually(lambda: waiter.pid in queued_pids())
        assert queued, f"the waiter never queued: it said {read_line(waiter, 1)!r}; queue {vramswap._testing.lock_queue('host-0')}"
        t0 = time.monotonic()
        waiter.send_signal(signal.SIGINT)
        line = read_line(waiter, timeout=10)
        elapsed = time.monotonic() - t0
        # Before the fix the interrupt waited for the grant, then leaked the lock ("interrupted 1").
        assert line == "interrupted 0", f"after SIGINT the waiter said {line!r}"
        assert elapsed < 5, f"KeyboardInterrupt took {elapsed:.1f} s"
        assert waiter.pid not in queued_pids(), "the interrupted waiter's ticket is still queued"
        # The holder's release grants the next waiter (this process), not the gone ticket.
        holder.stdin.close()
        with vramswap.gpu_lock(timeout=20):
            assert vramswap.held(0) == 1
        assert waiter.poll() is None  # alive, and holding nothing
    finally:
        finish(holder)
        if waiter is not None:
            finish(waiter)


def all_threads_stopped(pid):
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            pass  # a thread that ended meanwhile
    return bool(states) and all(state in ("T", "t") for state in states)


@contextlib.contextmanager
def stopped_pool_server():
    """Device 0's pool server, started by a process that took the lock once, stopped (SIGSTOP)
    for the block: it takes connections and answers none. Resumed at the end."""
    holder = spawn_script(HOLD_UNTIL_EOF)
    try:
        assert read_line(holder) == "holding"
    finally:
        finish(holder)
    server = vramswap._testing.pool_server_pid(0)
    assert server > 0
    os.kill(server, signal.SIGSTOP)
    # kill() returns while a thread of it may still run; the server is not this process's
    # child, so its stop is read from /proc.
    assert eventually(lambda: all_threads_stopped(server), timeout=5), f"the pool server (pid {server}) did not stop"
    try:
        yield server
    finally:
        try:
            os.kill(server, signal.SIGCONT)
        except ProcessLookupError:
            pass


# Waits without a timeout for a pool server that does not answer; says how long it waited
# when Ctrl-C ended the wait.
WAIT_FOR_A_SILENT_SERVER = r"""
import time, vramswap
print("ready", flush=True)
t0 = time.monotonic()
try:
    with vramswap.gpu_lock(0):
        print("granted", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {vramswap.held(0)} after {time.monotonic() - t0:.2f} s", flush=True)
"""


def test_a_pool_server_that_does_not_answer_is_waited_for_within_the_timeout_and_until_ctrl_c():
    # The first lock of a device opens its session: it waits for the pool server to answer its
    # hello. A server stopped after taking the connection (SIGSTOP, stuck in a driver call)
    # held that wait for 30 s, past timeout= and through Ctrl-C.
    with stopped_pool_server() as server:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"not acquired within 0.3 s: .*to answer this process's hello"):
            with vramswap.gpu_lock(0, timeout=0.3):
                pass
        assert time.monotonic() - t0 < 5, "timeout= should bound the wait for the server"
        assert vramswap.held(0) == 0
        waiter = spawn_script(WAIT_FOR_A_SILENT_SERVER)
        try:
            assert read_line(waiter) == "ready"
            time.sleep(1.5)  # it waits for the server's answer by now
            # Ctrl-C, again every 100 ms: one that comes before the wait began (while the
            # process started its session) is seen only when the session opens.
            first = time.monotonic()
            line = None
            while line is None and time.monotonic() - first < 10:
                waiter.send_signal(signal.SIGINT)
                line = read_line(waiter, timeout=0.1)
            assert line is not None and line.startswith("interrupted 0 after "), f"after SIGINT the waiter said {line!r}"
            assert time.monotonic() - first < 5, f"the wait went on {time.monotonic() - first:.1f} s after Ctrl-C"
            assert float(line.split()[3]) >= 1.0, f"interrupted before it waited for the server: {line!r}"
        finally:
            os.kill(server, signal.SIGCONT)
            finish(waiter)
    with vramswap.gpu_lock(0, timeout=20):
        assert vramswap.held(0) == 1


# Keeps 56 MiB of the 64 MiB pool idle after one lock, until its stdin closes.
KEEP_FRAMES_IDLE = r"""
import sys, vramswap
n = 56 << 20
ptr = vramswap.malloc(n)
with vramswap.gpu_lock(0):
    vramswap._testing.write(ptr, b"k" * n)
print("keeping", flush=True)
sys.stdin.read()
"""

# 24 MiB of random bytes written under one lock; then, on "go", a lock that must bring them
# back into the pool: it waits for frames another process holds. Says how Ctrl-C ended that
# wait; on "verify", locks again and says whether every byte came back.
WAIT_FOR_FRAMES = r"""
import random, sys, time, vramswap
n = 24 << 20
data = random.Random(7).randbytes(n)
ptr = vramswap.malloc(n)
with vramswap.gpu_lock(0):
    vramswap._testing.write(ptr, data)
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
t0 = time.monotonic()
try:
    with vramswap.gpu_lock(0):
        print("granted", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {vramswap.held(0)} after {time.monotonic() - t0:.2f} s", flush=True)
assert sys.stdin.readline().strip() == "verify"
with vramswap.gpu_lock(0, timeout=20):
    print("intact" if vramswap._testing.read(ptr, n) == data else "changed", flush=True)
"""


def test_ctrl_c_ends_the_wait_for_frames_a_stopped_owner_holds_and_loses_nothing():
    # After the grant, a lock brings its process's memory back in, waiting for the pool frames
    # other processes hold idle. An owner that does not answer (SIGSTOP) held that wait for
    # VRAMSWAP_EVICT_TIMEOUT (30 s), through every Ctrl-C.
    waiter = spawn_script(WAIT_FOR_FRAMES)
    owner = None
    try:
        assert read_line(waiter) == "ready"
        owner = spawn_script(KEEP_FRAMES_IDLE)
        assert read_line(owner) == "keeping"
        os.kill(owner.pid, signal.SIGSTOP)
        # kill() returns before every thread of the owner has stopped; waitpid reports the stop.
        _, stop_status = os.waitpid(owner.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(stop_status)
        try:
            waiter.stdin.write("go\n")
            waiter.stdin.flush()
            time.sleep(1.0)  # granted, and waiting for the owner's frames by now
            assert read_line(waiter, timeout=0) is None, "the lock was granted without the owner's frames"
            first = time.monotonic()
            waiter.send_signal(signal.SIGINT)
            line = read_line(waiter, timeout=5)
            took = time.monotonic() - first
            assert line is not None and line.startswith("interrupted 0 after "), f"after SIGINT the waiter said {line!r}"
            # The library's part is bounded by a wait slice; the rest is this test's reading.
            assert took < 0.5, f"KeyboardInterrupt came {took * 1000:.0f} ms after Ctrl-C"
            assert float(line.split()[3]) >= 0.9, f"interrupted before it waited for the frames: {line!r}"
        finally:
            os.kill(owner.pid, signal.SIGCONT)
        waiter.stdin.write("verify\n")
        waiter.stdin.flush()
        assert read_line(waiter, timeout=30) == "intact"
        assert waiter.wait(timeout=20) == 0
    finally:
        if owner is not None:
            finish(owner)
        finish(waiter)


# The first lock waits for a pool server that does not answer, while signals whose handlers
# do not raise keep arriving (SIGUSR1 with a handler that counts): each ends the wait, the lock
# opens the session again (its debug log says so), and takes the lock once the server answers.
HANDLED_SIGNALS_DURING_OPENING = r"""
import signal, vramswap
seen = []
signal.signal(signal.SIGUSR1, lambda *_: seen.append(1))
print("ready", flush=True)
with vramswap.gpu_lock(0, timeout=30):
    print(f"held after {len(seen)} signal(s)", flush=True)
"""


def test_signals_whose_handlers_do_not_raise_leave_the_first_lock_waiting_for_the_server():
    with stopped_pool_server() as server:
        child = subprocess.Popen(
            [sys.executable, "-c", HANDLED_SIGNALS_DURING_OPENING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, "VRAMSWAP_LOG": "debug"}, preexec_fn=default_sigint,
        )
        log = []  # drained as it comes: a full pipe would stop the child
        drain = threading.Thread(target=lambda: log.append(child.stderr.read()), daemon=True)
        drain.start()
        try:
            assert read_line(child) == "ready"
            time.sleep(1.0)  # it waits for the server's answer by now
            for _ in range(20):
                child.send_signal(signal.SIGUSR1)
                time.sleep(0.1)
            os.kill(server, signal.SIGCONT)
            line = read_line(child, timeout=20)
            assert line is not None and line.startswith("held after "), f"the process said {line!r}"
            assert child.wait(timeout=20) == 0
            drain.join(timeout=10)
            said = "".join(log)
            assert "no handler raised; opening the session again" in said, said[-2000:]
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


# The first lock opens the device's session under the runtime's mutex, waiting for a pool
# server that does not answer; meanwhile another thread allocates through a C entry point that
# keeps the GIL (as PyTorch's allocator calls vramswap's) and waits for that mutex. The
# opening must not take the GIL to look for Ctrl-C then: both threads would wait for ever.
GIL_HELD_ALLOCATION_DURING_OPENING = r"""
import ctypes, threading, time, vramswap
lib = ctypes.PyDLL(vramswap._vramswap.__file__)  # PyDLL: the GIL stays held during the call
lib.vramswap_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
def allocate():
    time.sleep(1.0)  # the main thread waits for the server by now, under the runtime's mutex
    p = ctypes.c_void_p()
    print(f"allocated {lib.vramswap_malloc(ctypes.byref(p), 1 << 20, 0)}", flush=True)
t = threading.Thread(target=allocate)
print("ready", flush=True)
t.start()
try:
    with vramswap.gpu_lock(0, timeout=2):
        print("held", flush=True)
except TimeoutError:
    print("timed out", flush=True)
t.join()
print("done", flush=True)
"""


def test_an_allocation_that_keeps_the_gil_does_not_deadlock_the_first_lock_waiting_for_the_server():
    with stopped_pool_server() as server:
        child = spawn_script(GIL_HELD_ALLOCATION_DURING_OPENING)
        try:
            assert read_line(child) == "ready"
            time.sleep(3.5)  # the lock timed out; the allocation now waits for the server, GIL held
            os.kill(server, signal.SIGCONT)
            said = [read_line(child, timeout=20) for _ in range(3)]
            assert said[-1] == "done" and sorted(said[:2]) == ["allocated 0", "timed out"], f"the process said {said}: deadlocked?"
        finally:
            child.kill()
            child.wait()


# A process whose thread sends it SIGINT every {gap} s while its main thread takes turns
# ({turn}) until argv[1] seconds have passed; it counts the interrupts, and those after
# which the lock was still held (giving it back so that the loop goes on).
PESTERED = r"""
import os, random, signal, sys, threading, time, vramswap
stop = False
go = threading.Event()  # no SIGINT before the loop below can take it (Thread.start() waits)
def pester():
    go.wait()
    while not stop:
        time.sleep({gap})
        os.kill(os.getpid(), signal.SIGINT)
completed = interrupted = leaked = 0
threading.Thread(target=pester, daemon=True).start()
go.set()
deadline = time.monotonic() + float(sys.argv[1])
while True:
    try:
        while time.monotonic() < deadline:
            try:
                {turn}
            except KeyboardInterrupt:
                interrupted += 1
                if vramswap.held(0) != 0:
                    leaked += 1
                    while vramswap.held(0) > 0:
                        vramswap.release(0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop = True
        break
    except KeyboardInterrupt:
        interrupted += 1
print(completed, interrupted, leaked, vramswap.held(0), flush=True)
"""

INTERRUPTED_AROUND_THE_GRANT = PESTERED.format(
    gap="random.uniform(0, 0.003)",
    turn="with vramswap.gpu_lock(0, timeout=10):\n                    completed += 1\n                    time.sleep(0.0005)",
)

TAKE_TURNS = r"""
import sys, time, vramswap
deadline = time.monotonic() + float(sys.argv[1])
turns = 0
while time.monotonic() < deadline:
    with vramswap.gpu_lock(0, timeout=20):
        turns += 1
        time.sleep(0.001)
print(turns, flush=True)
"""


def test_interrupts_at_random_moments_around_the_grant_never_keep_the_lock():
    seconds = "3"
    env = os.environ.copy()
    run = lambda script: subprocess.Popen(  # noqa: E731
        [sys.executable, "-c", script, seconds], stdout=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint
    )
    churn = run(TAKE_TURNS)
    victim = run(INTERRUPTED_AROUND_THE_GRANT)
    try:
        out, _ = victim.communicate(timeout=60)
        completed, interrupted, leaked, held = (int(x) for x in out.split())
        assert leaked == 0 and held == 0, f"{leaked} interrupt(s) left the lock held ({completed} turns, {interrupted} interrupts)"
        assert interrupted > 0 and completed > 0
        out, _ = churn.communicate(timeout=60)
        assert churn.returncode == 0 and int(out) > 0, "the other process could not take its turns"
        with vramswap.gpu_lock(timeout=20):
            pass
    finally:
        for p in (churn, victim):
            if p.poll() is None:
                p.kill()
                p.wait()

# An empty block, interrupted every 50 us: the interrupts land at its end too.
INTERRUPTED_AT_THE_BLOCKS_END = PESTERED.format(
    gap="0.00005",
    turn="with vramswap.gpu_lock(0):\n                    pass\n                completed += 1",
)


def test_interrupts_as_the_block_ends_never_keep_the_lock():
    """A signal every 50 us at an empty block: the interrupts land at its end too (Jupyter's
    "interrupt kernel" as a cell's block finishes). A Python __exit__ let a handler raise
    before its release, leaving the lock held thousands of times a second; every interrupt
    must find it released."""
    victim = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_AT_THE_BLOCKS_END, "1.5"], stdout=subprocess.PIPE, text=True,
        env=os.environ.copy(), preexec_fn=default_sigint,
    )
    try:
        out, _ = victim.communicate(timeout=60)
        turns, interrupted, leaked, held = (int(x) for x in out.split())
        assert leaked == 0, f"{leaked} of {interrupted} interrupts left the lock held ({turns} turns)"
        assert held == 0
        assert interrupted > 100 and turns > 0, f"the interrupts did not meet the blocks ({turns} turns, {interrupted} interrupts)"
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


FILLER = r"""
import sys, vramswap
with vramswap.gpu_lock(0):
    p = vramswap.malloc(int(sys.argv[1]))
    vramswap._testing.write(p, b"\xa5" * int(sys.argv[1]))
    print("holding", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    vramswap.free(p)
"""


def spawn_filler(nbytes=64 << 20):
    """A second process that takes the lock and the whole pool (64 MiB); it lets go when its
    stdin is closed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FILLER, str(nbytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    line = proc.stdout.readline()
    assert line.strip() == "holding", f"the filler did not take the pool (exit {proc.poll()})"
    return proc


def test_memory_allocated_and_written_outside_the_lock_is_kept():
    """The model.cuda()-before-the-loop shape through vramswap's own memory API (the host
    backend's device memory is process memory, so ctypes writes it as a CUDA copy would):
    backed at once while the pool has free frames, saved when another process takes the
    pool, back byte for byte at the next lock."""
    import ctypes

    n = (40 << 20) + 123
    data = random.Random(5).randbytes(n)
    p = vramswap.malloc(n)
    assert vramswap.stats()["resident_bytes"] >= n, "free frames: backed at once, without the lock"
    ctypes.memmove(p, data, n)
    filler = spawn_filler()
    filler.stdin.close()
    assert filler.wait(timeout=120) == 0
    s = vramswap.stats()
    assert s["bytes_out"] >= 20 << 20 and s["resident_bytes"] == 0, s
    with vramswap.gpu_lock():
        assert vramswap._testing.read(p, n) == data, "bytes written outside the lock were lost"
    vramswap.free(p)


OUTSIDE_FULL = r"""
import ctypes, vramswap
lib = ctypes.CDLL(vramswap._vramswap.__file__)  # the C API, through the module's dependencies
lib.vramswap_last_error.restype = ctypes.c_char_p
q = ctypes.c_void_p()
rc = lib.vramswap_malloc_async(ctypes.byref(q), ctypes.c_size_t(4 << 20), 0, ctypes.c_void_p(0x77))
print("malloc_async", rc, lib.vramswap_last_error().decode(), flush=True)
p = vramswap.malloc(4 << 20)  # a plain allocation waits for the next lock...
print("resident", vramswap.stats()["resident_bytes"], flush=True)
ctypes.memset(p, 1, 4 << 20)  # ...and touching it outside the lock faults
print("not reached", flush=True)
"""


def test_outside_the_lock_with_no_free_frame_allocation_fails_or_touch_is_explained():
    filler = spawn_filler()
    try:
        r = subprocess.run([sys.executable, "-c", OUTSIDE_FULL], capture_output=True, text=True, timeout=120, env=os.environ.copy())
    finally:
        filler.stdin.close()
        filler.wait(timeout=120)
    lines = r.stdout.splitlines()
    assert lines and lines[0].startswith("malloc_async -1001 "), r.stdout + r.stderr  # VRAMSWAP_ERR_OUT_OF_MEMORY
    assert "does not hold the device lock" in lines[0] and "Allocate inside the lock" in lines[0], lines[0]
    assert "resident 0" in lines, r.stdout
    assert "not reached" not in r.stdout
    assert r.returncode < 0 or r.returncode >= 128, f"touching unbacked memory must kill the process (exit {r.returncode})"
    assert "vramswap: segmentation fault at 0x" in r.stderr and "did not hold the device lock" in r.stderr, r.stderr


def _release_request(device_key="host-0"):
    """`vramswap release-request --device KEY`, the operator's command, from the package."""
    from vramswap import _launch

    return subprocess.run(
        [_launch.binary_path("vramswap"), "release-request", "--device", device_key], capture_output=True, text=True
    )


def test_release_requested_says_when_an_operator_asks_for_the_device():
    assert vramswap.release_requested() is False  # no session yet: none is opened
    with vramswap.gpu_lock():
        assert vramswap.release_requested() is False
        r = _release_request()
        assert r.returncode == 0, r.stderr
        assert f"asked pid {os.getpid()} (" in r.stdout
        assert vramswap.release_requested() is True
    assert vramswap.release_requested() is False  # the request was for that hold only
    r = _release_request()
    assert r.returncode == 0 and "nobody holds its lock" in r.stdout


def test_release_signal_sigint_interrupts_a_holder_that_does_not_poll():
    # A notebook cell in a long `with gpu_lock()`: with VRAMSWAP_RELEASE_SIGNAL=SIGINT an
    # operator's request becomes a KeyboardInterrupt, and leaving the block releases the lock.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, vramswap\n"
            "try:\n"
            "    with vramswap.gpu_lock():\n"
            "        print('holding', flush=True)\n"
            "        time.sleep(60)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', vramswap.held(0), flush=True)\n",
        ],
        preexec_fn=default_sigint,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, VRAMSWAP_RELEASE_SIGNAL="SIGINT"),
    )
    try:
        assert proc.stdout.readline().strip() == "holding"
        t0 = time.monotonic()
        assert _release_request().returncode == 0
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert out.strip() == "interrupted 0", (out, err)
        assert time.monotonic() - t0 < 20
        assert "asked this process to release" in err and "VRAMSWAP_RELEASE_SIGNAL" in err, err
        with vramswap.gpu_lock(timeout=10):  # the lock was let go
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
