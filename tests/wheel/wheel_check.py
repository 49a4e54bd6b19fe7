"""Run by wheel_test.sh with the fresh venv's python, under env -i with PATH=<venv>/bin alone
(and, with WHEEL_CHECK_HIDDEN=1, headers, compilers' back ends, CMake's modules and the
system's liburing hidden): the installed wheel's commands, module, on-demand vramswapd and
vramswap.status() on the host backend. Prints what it checked; any failure raises."""

import ctypes
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

PKG = os.environ["WHEEL_CHECK_PKG"]
WORK = os.environ["WHEEL_CHECK_WORK"]


def check(cond, what):
    if not cond:
        raise SystemExit(f"wheel_check: FAILED: {what}")
    print(f"wheel_check: ok: {what.splitlines()[0][:160]}", flush=True)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=60, **kw)


# --- nothing to build with -----------------------------------------------------------------
print(f"wheel_check: PATH={os.environ['PATH']}")
for tool in ("cc", "c++", "gcc", "g++", "clang", "cmake", "ninja", "make", "ld"):
    check(shutil.which(tool) is None, f"`{tool}` is not on PATH (found: {shutil.which(tool)})")
for mod in ("pybind11", "scikit_build_core", "setuptools_scm"):
    r = run([sys.executable, "-c", f"import {mod}"])
    check(r.returncode != 0, f"the venv has no {mod}")
if os.environ.get("WHEEL_CHECK_HIDDEN") == "1":
    check(not os.path.exists("/usr/include/liburing.h"), "liburing's header is not reachable (/usr/include/liburing.h)")
    check(not os.path.exists("/usr/include/boost"), "Boost's headers are not reachable (/usr/include/boost)")
    check(not os.listdir("/usr/lib/gcc"), "GCC's back ends are not reachable (/usr/lib/gcc is empty)")
    for lib in glob.glob("/usr/lib/x86_64-linux-gnu/liburing.so*"):
        try:
            ctypes.CDLL(lib)
            loaded = True
        except OSError:
            loaded = False
        check(not loaded, f"the system's {lib} cannot be loaded")

# --- the module and the commands ---------------------------------------------------------
import vramswap  # noqa: E402

check(os.path.dirname(os.path.realpath(vramswap.__file__)) == os.path.realpath(PKG), f"vramswap imports from {PKG}")
check(callable(vramswap.status) and callable(vramswap.gpu_lock), "vramswap.status and vramswap.gpu_lock exist")

r = run(["vramswap", "--help"])
check(r.returncode == 0 and "usage: vramswap status" in r.stdout, f"`vramswap --help` (from {shutil.which('vramswap')}): exit {r.returncode}\n{r.stdout}{r.stderr}")
r = run([sys.executable, "-m", "vramswap", "--help"])
check(r.returncode == 0 and "usage: vramswap status" in r.stdout, f"`python -m vramswap --help`: exit {r.returncode}\n{r.stdout}{r.stderr}")
r = run(["vramswapd", "--help"])
check(r.returncode == 0 and "usage: vramswapd" in r.stdout, f"`vramswapd --help`: exit {r.returncode}\n{r.stdout}{r.stderr}")
r = run(["vramswap", "frobnicate"])
check(r.returncode == 2 and "unknown command" in r.stderr, f"`vramswap frobnicate` exits 2 (usage), through the launcher: exit {r.returncode}")

shim = os.path.join(PKG, "libvramswap_preload.so")
r = run(["vramswap-preload-path"])
r2 = run([sys.executable, "-m", "vramswap.preload"])
if os.path.exists(shim):
    check(r.returncode == 0 and r.stdout.strip() == shim, f"`vramswap-preload-path` prints {shim}: exit {r.returncode} {r.stdout!r} {r.stderr!r}")
    check(r2.returncode == 0 and r2.stdout.strip() == shim, f"`python -m vramswap.preload` prints {shim}: exit {r2.returncode} {r2.stderr!r}")
    import vramswap.preload

    check(vramswap.preload.path() == shim, "vramswap.preload.path() is the shim")
    # The bundled shim loads (its liburing from the wheel) into a program that never touches CUDA.
    r = run([sys.executable, "-c", "print('preloaded')"], env={**os.environ, "LD_PRELOAD": r.stdout.strip()})
    check(r.returncode == 0 and r.stdout.strip() == "preloaded", f"python runs with LD_PRELOAD=$(vramswap-preload-path): exit {r.returncode} {r.stderr[-2000:]}")
else:
    check(r.returncode == 1 and "built without the CUDA driver's header cuda.h" in r.stderr,
          f"`vramswap-preload-path` says this wheel has no shim: exit {r.returncode} {r.stderr!r}")
    check(r2.returncode == 1, "`python -m vramswap.preload` fails the same way")

# --- status on an empty deployment ---------------------------------------------------------
runtime = os.path.join(WORK, "runtime")
check(os.path.isdir(runtime) and not os.listdir(runtime), f"the runtime dir {runtime} is empty")
os.environ.update({
    "VRAMSWAP_RUNTIME_DIR": runtime,
    "VRAMSWAP_SHM_PREFIX": f"vswheel{os.getpid()}-",  # none of this machine's other deployments
    "VRAMSWAP_BACKEND": "host",
    "VRAMSWAP_HOST_DEVICES": "1",
    "VRAMSWAP_HOST_DEVICE_MEMORY": "256MiB",
    "VRAMSWAP_POOL_SIZE": "64MiB",
    "VRAMSWAP_FRAME_SIZE": "2MiB",
    "VRAMSWAP_POOL_IDLE_EXIT": "3",
    "VRAMSWAP_SWAP_DIR": WORK,
})
os.environ.pop("VRAMSWAP_SERVER", None)  # the session must find vramswapd in the package
empty = vramswap.status()
check(empty == {"version": 2, "devices": []}, f"vramswap.status() with no device: {empty!r}")
try:
    vramswap.status("host-7")
    check(False, "vramswap.status('host-7') raises")
except vramswap.Error as e:
    check("host-7" in str(e) and "vramswap status --json --device host-7" in str(e), f"vramswap.status('host-7') raises vramswap.Error: {e}")

# --- a real user: allocate, take the lock; vramswapd starts on demand from the wheel ------
HOLDER = r"""
import sys, vramswap
ptr = vramswap.malloc(8 << 20)
with vramswap.gpu_lock(0):
    vramswap._testing.write(ptr, b"wheel" * 1000)
    assert vramswap._testing.read(ptr, 5000) == b"wheel" * 1000
    print("holding", flush=True)
    sys.stdin.readline()
vramswap.free(ptr)
print("done", flush=True)
"""
holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    line = holder.stdout.readline()
    check(line.strip() == "holding", f"the holder allocated and took the lock (exit {holder.poll()}, said {line!r})")
    report = vramswap.status()
    devices = report["devices"]
    check(len(devices) == 1 and devices[0]["key"] == "host-0", f"vramswap.status() shows host-0: {json.dumps(report)[:600]}")
    dev = devices[0]
    check(dev["holder"] is not None and dev["holder"]["pid"] == holder.pid, f"host-0's holder is the holder, pid {holder.pid}: {dev['holder']}")
    check(dev["pool_bytes"] == 64 << 20 and dev["frame_size"] == 2 << 20, f"host-0's pool is 64 MiB of 2 MiB frames: {dev['pool_bytes']}, {dev['frame_size']}")
    mine = [p for p in dev["processes"] if p["pid"] == holder.pid]
    check(mine and mine[0]["resident_bytes"] >= 8 << 20, f"the holder has its 8 MiB resident: {mine}")
    check(dev["server"]["state"] == "running", f"host-0's daemon runs: {dev['server']}")
    server = dev["server"]["pid"]
    server_exe = os.readlink(f"/proc/{server}/exe")
    check(server_exe == os.path.realpath(os.path.join(PKG, "vramswapd")), f"vramswapd (pid {server}) was started on demand from the wheel: {server_exe}")
    check(vramswap.status("host-0")["devices"][0]["key"] == "host-0", "vramswap.status('host-0') reports that device alone")

    # Signals reach the bundled binary: the launcher became it (same pid), and SIGINT ends
    # `vramswap trace` the way it ends it run directly (it writes the trace, exits 0).
    out = os.path.join(WORK, "trace.json")
    trace = subprocess.Popen(["vramswap", "trace", "--out", out, "--seconds", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    exe = ""
    while time.monotonic() < deadline:
        try:
            exe = os.readlink(f"/proc/{trace.pid}/exe")
        except OSError:
            pass
        if exe == os.path.realpath(os.path.join(PKG, "vramswap")):
            break
        time.sleep(0.05)
    check(exe == os.path.realpath(os.path.join(PKG, "vramswap")), f"the `vramswap` launcher execs the bundled binary in its own pid: {exe}")
    time.sleep(0.5)
    trace.send_signal(signal.SIGINT)
    t_out, t_err = trace.communicate(timeout=30)
    check(trace.returncode == 0 and os.path.exists(out), f"SIGINT through the launcher ended `vramswap trace` cleanly: exit {trace.returncode} {t_err.strip()}")
    json.load(open(out))

    holder.stdin.write("\n")
    holder.stdin.flush()
    check(holder.stdout.readline().strip() == "done" and holder.wait(timeout=30) == 0, "the holder released, freed and exited")
finally:
    if holder.poll() is None:
        holder.kill()
        holder.wait()

after = vramswap.status()["devices"]
check(after and after[0]["holder"] is None, f"after the holder exited host-0 has no holder: {after[0]['holder'] if after else after}")

# --- a missing binary: the launcher and status() say what is missing -----------------------
cli = os.path.join(PKG, "vramswap")
os.rename(cli, cli + ".hidden")
try:
    r = run(["vramswap", "--help"])
    check(r.returncode == 127 and f"the binary {cli} is missing" in r.stderr, f"without its binary `vramswap` exits 127 and names it: {r.returncode} {r.stderr!r}")
    try:
        vramswap.status()
        check(False, "vramswap.status() without the CLI raises")
    except vramswap.Error as e:
        check(cli in str(e) and "missing" in str(e), f"vramswap.status() without the CLI raises vramswap.Error: {e}")
finally:
    os.rename(cli + ".hidden", cli)

# The on-demand server exits once idle (VRAMSWAP_POOL_IDLE_EXIT); it is not this process's child.
deadline = time.monotonic() + 30
while time.monotonic() < deadline and os.path.exists(f"/proc/{server}"):
    time.sleep(0.2)
if os.path.exists(f"/proc/{server}"):
    os.kill(server, signal.SIGTERM)
    check(False, f"vramswapd (pid {server}) did not exit within 30 s of going idle (VRAMSWAP_POOL_IDLE_EXIT=3); sent it SIGTERM")
check(True, f"vramswapd (pid {server}) exited once idle")
print("wheel_check: OK")
