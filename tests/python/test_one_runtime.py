"""One runtime per process: a real process that runs under the preload shim (LD_PRELOAD),
imports the Python module and calls the C API of libvramswap.so holds one copy of the runtime,
in libvramswap.so: one library mapped, one lock view, one arena, one set of stats, one pool
member. (That the module and the shim define none of the runtime's symbols themselves is
checked on the binaries by the abi.*_holds_no_runtime tests.)"""

import json
import os
import subprocess
import sys

import pytest

import vramswap

# Reports, as one JSON line, what each front end sees of the others' work.
THREE_FRONT_ENDS = r"""
import ctypes, json, os, random, vramswap

def mapped(name):
    files = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith(name):
                files.add(os.path.realpath(path))
    return sorted(files)

# Already loaded (the shim and the module need it): the loader hands out that copy by SONAME.
c = ctypes.CDLL("libvramswap.so.0")
c.vramswap_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
c.vramswap_free.argtypes = [ctypes.c_void_p, ctypes.c_int]
c.vramswap_last_error.restype = ctypes.c_char_p
report = {"libraries": mapped("libvramswap.so"), "shims": mapped("libvramswap_preload.so")}

ptr = ctypes.c_void_p()
report["c_malloc"] = c.vramswap_malloc(ctypes.byref(ptr), 4 << 20, 0)
report["c_lock"] = c.vramswap_lock(0, 1, -1)
report["python_held_after_c_lock"] = vramswap.held(0)
data = random.Random(11).randbytes(4 << 20)
vramswap._testing.write(ptr.value, data)  # the C API's allocation, written through the module
with vramswap.gpu_lock(0):  # re-entry of the C API's hold: one per-thread record
    report["python_held_inside"] = vramswap.held(0)
report["c_unlock"] = c.vramswap_unlock(0)
report["python_held_after_c_unlock"] = vramswap.held(0)
with vramswap.gpu_lock(0, timeout=20):
    report["intact"] = vramswap._testing.read(ptr.value, len(data)) == data
stats = vramswap.stats(0)
report["python_stats"] = {k: stats[k] for k in ("allocations", "allocated_bytes", "acquires")}
report["members"] = [p["pid"] for d in vramswap.status(0)["devices"] for p in d["processes"]]
report["pid"] = os.getpid()
report["c_free"] = c.vramswap_free(ptr, 0)
report["last_error"] = c.vramswap_last_error().decode()
print(json.dumps(report), flush=True)
"""


def shim_path():
    path = os.path.join(os.path.dirname(vramswap.__file__), "libvramswap_preload.so")
    if not os.path.exists(path):
        pytest.skip(f"the preload shim was not built (no cuda.h at configure time): {path} is missing")
    return os.path.realpath(path)


def test_the_shim_the_python_module_and_the_c_api_share_one_runtime():
    shim = shim_path()
    proc = subprocess.run(
        [sys.executable, "-c", THREE_FRONT_ENDS], capture_output=True, text=True, timeout=120,
        env={**os.environ, "LD_PRELOAD": shim},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["shims"] == [shim], report
    assert len(report["libraries"]) == 1, f"more than one libvramswap is mapped: {report['libraries']}"
    assert os.path.dirname(report["libraries"][0]) == os.path.dirname(shim), report  # the shim's own, beside it
    assert (report["c_malloc"], report["c_lock"], report["c_unlock"], report["c_free"]) == (0, 0, 0, 0), report
    assert report["python_held_after_c_lock"] == 1, "the module does not see the C API's lock"
    assert report["python_held_inside"] == 2, "the module's lock is not a re-entry of the C API's"
    assert report["python_held_after_c_unlock"] == 0, report
    assert report["intact"], "the C API's allocation lost bytes written through the module"
    assert report["python_stats"] == {"allocations": 1, "allocated_bytes": 4 << 20, "acquires": 2}, report
    assert report["members"].count(report["pid"]) == 1, f"the process is not one pool member: {report['members']}"
