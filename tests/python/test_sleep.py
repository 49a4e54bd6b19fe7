"""Memory classes, sleep and wake on the host backend (docs/sleep.md): tagged memory leaves the
device and comes back with every byte at the same address, a sleeping process's frames go to
another process that needs them (real processes, one waiting on the other's frames), a lock
user's sleeping tags stay out of its turns, and bad input is refused with what to do."""

import contextlib
import os
import random
import subprocess
import sys
import threading
import time

import pytest

import vramswap

MiB = 1 << 20


def randbytes(n, seed):
    return random.Random(seed).randbytes(n)


def test_tagged_memory_sleeps_and_wakes_with_every_byte():
    vramswap.keep_resident()
    with vramswap.memory_tag("weights"):
        weights = vramswap.malloc(8 * MiB)
        assert vramswap._vramswap._thread_tag() == "weights"
    assert vramswap._vramswap._thread_tag() == ""
    kv = vramswap.malloc(6 * MiB, tag="kv_cache")
    plain = vramswap.malloc(4 * MiB)
    data = {weights: randbytes(8 * MiB, 1), kv: randbytes(6 * MiB, 2), plain: randbytes(4 * MiB, 3)}
    for ptr, b in data.items():
        vramswap._testing.write(ptr, b)
    before = vramswap.stats()
    assert before["resident_bytes"] == 18 * MiB

    vramswap.sleep({"weights": "offload", "kv_cache": "discard"})
    s = vramswap.stats()
    assert s["asleep_bytes"] == 14 * MiB
    assert s["resident_bytes"] == 4 * MiB, "only the untagged memory keeps its frames"
    assert s["host_bytes"] == 8 * MiB, "the offloaded tag's bytes are in host memory, the discarded one's nowhere"
    assert s["bytes_out"] - before["bytes_out"] == 8 * MiB
    listed = {t["name"]: t for t in vramswap.tags()}
    assert listed["weights"]["asleep"] and listed["weights"]["mode"] == "offload"
    assert listed["kv_cache"]["asleep"] and listed["kv_cache"]["mode"] == "discard"
    assert listed["weights"]["allocated_bytes"] == 8 * MiB and listed["weights"]["allocations"] == 1
    assert vramswap._testing.read(plain, 4 * MiB) == data[plain]

    vramswap.wake()
    assert vramswap.stats()["asleep_bytes"] == 0
    assert vramswap.stats()["resident_bytes"] == 18 * MiB
    assert vramswap._testing.read(weights, 8 * MiB) == data[weights], "offloaded: every byte back at the same address"
    assert vramswap._testing.read(kv, 6 * MiB) == bytes(6 * MiB), "discarded: zero-filled"
    assert vramswap._testing.read(plain, 4 * MiB) == data[plain]
    assert not any(t["asleep"] for t in vramswap.tags())

    # Partial wake by tag, and a second cycle.
    vramswap._testing.write(kv, data[kv])
    vramswap.sleep(["weights", "kv_cache"])
    vramswap.wake(["kv_cache"])
    listed = {t["name"]: t for t in vramswap.tags()}
    assert listed["weights"]["asleep"] and not listed["kv_cache"]["asleep"]
    assert vramswap._testing.read(kv, 6 * MiB) == data[kv]
    vramswap.wake(["weights"])
    assert vramswap._testing.read(weights, 8 * MiB) == data[weights]
    for ptr in data:
        vramswap.free(ptr)
    assert vramswap.stats()["allocated_bytes"] == 0


# A keep-resident process that fills most of the pool with tagged memory, sleeps when told,
# and wakes when told; its bytes are checked after every wake.
SLEEPER = r"""
import random, sys, vramswap
MiB = 1 << 20
vramswap.keep_resident()
data = random.Random(7).randbytes(40 * MiB)
with vramswap.memory_tag("weights"):
    w = vramswap.malloc(40 * MiB)
vramswap._testing.write(w, data)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "sleep":
        vramswap.sleep("weights")
        print("asleep", vramswap.stats()["resident_bytes"], flush=True)
    elif cmd == "wake":
        vramswap.wake()
        ok = vramswap._testing.read(w, 40 * MiB) == data
        print("awake", "intact" if ok else "CORRUPT", flush=True)
    elif cmd == "exit":
        break
"""


@contextlib.contextmanager
def sleeper_process():
    """The sleeper, awake and ready; told to exit (and waited for) at the end, killed if it hangs."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=os.environ.copy())
    try:
        assert proc.stdout.readline().strip() == "ready", f"the sleeper did not start (exit {proc.poll()})"
        yield proc
        ask(proc, "exit")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def ask(proc, cmd):
    proc.stdin.write(cmd + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().split()


def test_a_sleeping_process_gives_its_frames_to_the_next_and_gets_them_back():
    # Pool 64 MiB: the sleeper's 40 MiB and this process's 40 MiB do not fit together.
    with sleeper_process() as sleeper:
        assert ask(sleeper, "sleep") == ["asleep", "0"]
        vramswap.keep_resident()
        mine_data = randbytes(40 * MiB, 9)
        mine = vramswap.malloc(40 * MiB, tag="rollout")
        vramswap._testing.write(mine, mine_data)
        # The sleeper's wake needs frames this process holds awake: it waits until this
        # process sleeps (well within VRAMSWAP_EVICT_TIMEOUT).
        answer = []
        waker = threading.Thread(target=lambda: answer.extend(ask(sleeper, "wake")))
        waker.start()
        time.sleep(1.0)
        assert waker.is_alive(), "the wake found frames that this awake process holds"
        vramswap.sleep("rollout")
        waker.join(30)
        assert answer == ["awake", "intact"]
        assert ask(sleeper, "sleep") == ["asleep", "0"]
        vramswap.wake("rollout")
        assert vramswap._testing.read(mine, 40 * MiB) == mine_data


def test_a_lock_users_sleeping_tag_stays_out_of_its_turns_until_woken():
    with vramswap.gpu_lock():
        p = vramswap.malloc(6 * MiB, tag="weights")
        data = randbytes(6 * MiB, 11)
        vramswap._testing.write(p, data)
    vramswap.sleep("weights")  # between turns: no lock needed
    with vramswap.gpu_lock():
        s = vramswap.stats()
        assert s["resident_bytes"] == 0 and s["asleep_bytes"] == 6 * MiB, "not brought in by the turn"
        vramswap.wake("weights")  # holding the lock: back at once
        assert vramswap._testing.read(p, 6 * MiB) == data
    vramswap.sleep("weights")
    vramswap.wake()  # between turns: back at the next lock
    with vramswap.gpu_lock():
        assert vramswap._testing.read(p, 6 * MiB) == data


def test_bad_input_is_refused_and_changes_nothing():
    p = vramswap.malloc(2 * MiB, tag="weights")
    with pytest.raises(ValueError, match="no memory of this process.*'weights'"):
        vramswap.sleep("wieghts")
    with pytest.raises(ValueError, match="neither 'offload' nor 'discard'"):
        vramswap.sleep("weights", mode="drop")
    with pytest.raises(ValueError, match="letters, digits"):
        vramswap.malloc(MiB, tag="bad tag")
    with pytest.raises(ValueError, match="1 to 63"):
        vramswap.malloc(MiB, tag="x" * 64)
    with pytest.raises(ValueError, match="letters, digits"):
        with vramswap.memory_tag("no spaces"):
            pass
    assert vramswap._vramswap._thread_tag() == ""
    assert not vramswap.tags()[0]["asleep"], "a refused sleep changed nothing"
    vramswap.sleep("weights")
    with pytest.raises(ValueError, match="asleep.*wake it"):
        vramswap.malloc(MiB, tag="weights")
    vramswap.wake()
    vramswap.free(p)
    with pytest.raises(ValueError, match="holds the device's lock"):
        with vramswap.gpu_lock():
            vramswap.keep_resident()
    vramswap.keep_resident()
    with pytest.raises(ValueError, match="keeps its memory resident"):
        with vramswap.gpu_lock():
            pass


def test_waiting_on_an_awake_process_times_out_naming_it(monkeypatch):
    with sleeper_process() as sleeper:  # awake: 40 MiB of the 64 MiB pool
        monkeypatch.setenv("VRAMSWAP_EVICT_TIMEOUT", "2")
        vramswap._testing.reread_options()
        vramswap.keep_resident()
        with pytest.raises(TimeoutError, match=rf"process {sleeper.pid} \(\d+ frames\) keeps its memory resident.*sleep"):
            vramswap.malloc(40 * MiB, tag="rollout")
        assert vramswap.stats()["allocated_bytes"] == 0, "the failed allocation left nothing behind"
        assert ask(sleeper, "sleep") == ["asleep", "0"]
        p = vramswap.malloc(40 * MiB, tag="rollout")  # its frames are free now
        vramswap.free(p)
