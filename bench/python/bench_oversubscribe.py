"""Oversubscription benchmark: unmodified programs under the preload shim.

Run by scripts/device-run.sh (bench:oversubscribe), which sets VRAMSWAP_BUILD_DIR. Prints a
markdown report on stdout.

1. A memory-bound kernel (examples/plain_cuda.cu: every 32-bit word += 1, read and written
   once per pass) over working sets of 0.5x, 1x, 1.5x and 2x the pool, oversubscribed
   (VRAMSWAP_OVERSUBSCRIBE=1), against the same program with plain device memory (no shim)
   and with pinned, mapped host memory (cudaHostAlloc), all in this run.
2. A PyTorch training step (tests/gpu/torch_unmodified.py: linear layers, Adam; weights,
   gradients and Adam state ~4x the weights) at the same multiples of a smaller pool,
   oversubscribed, against plain PyTorch (device memory) and against everything in host
   frames (the shim with a pool of one frame: the host-mapped case for PyTorch).
3. Reclaim: an oversubscribed job runs on 1.5x the pool; a lock user (plain_cuda, normal
   priority under the shim) then allocates 3/4 of the pool, twice. Its allocation time (the
   lock, plus the job's demotion of the frames it needs) against the same allocation on an
   idle pool: cold (a job that makes no host frames ahead, VRAMSWAP_OVERSUBSCRIBE_AHEAD=0),
   warm (its spares), and with host frames made ahead (the default); the job's breakdown of
   each burst from its log.
4. Compute (VRAMSWAP_OVERSUBSCRIBE_COMPUTE): a PyTorch lock holder (vramswap.torch, holds of
   COMPUTE_STEPS training steps under one gpu_lock, COMPUTE_VALLEY_S valleys between) alone,
   then beside a low-priority job (the same training step, unmodified, under the shim with
   VRAMSWAP_OVERSUBSCRIBE=1) with each policy: the holder's step time against alone, and the
   job's throughput in the valleys and during the holds against the job alone.

Both tables also give the floor: the time in device memory plus the bytes beyond the pool
crossing the link once, at the pinned host-to-device copy rate measured in the same run.

5. The PyTorch step of 2 with Adam(fused=True): one sweep over the optimizer's tensors per step
   instead of the default's seven, at 1x, 1.5x and 2x the pool, against device memory.

VRAMSWAP_BENCH_PARTS=kernel,torch,torch_fused,reclaim,compute (the default: all) picks sections.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BUILD = os.environ.get("VRAMSWAP_BUILD_DIR", "build/device")
PLAIN = os.path.join(BUILD, "examples", "vramswap_plain_cuda")
SHIM = os.path.join(BUILD, "libvramswap_preload.so")
TORCH = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "gpu", "torch_unmodified.py")
GiB = 1 << 30
PREFIX = os.environ.get("VRAMSWAP_SHM_PREFIX", "vsbench-")


def environment(shim, env):
    """This process's environment for a child: vramswap's log at info (the shim's summaries),
    pools that go soon after their last client, the shim preloaded or not, then `env`."""
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e["VRAMSWAP_LOG"] = "info"
    e["VRAMSWAP_POOL_IDLE_EXIT"] = "2"
    if shim:
        e["LD_PRELOAD"] = SHIM
    e.update(env or {})
    return e


def run(args, shim=False, env=None, timeout=600):
    p = subprocess.run(args, env=environment(shim, env), capture_output=True, text=True, timeout=timeout)
    nums = dict(re.findall(r"(\w+)=([-\d.e+]+)", p.stdout))
    if p.returncode != 0:
        sys.stderr.write(f"FAILED ({p.returncode}): {' '.join(args)}\n{p.stdout}\n{p.stderr[-3000:]}\n")
    return p.returncode, {k: float(v) for k, v in nums.items()}, p.stderr


PINNED_RATE = r"""
import time, torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
d = torch.empty(n, dtype=torch.uint8, device="cuda")
def rate(f):
    best = 0.0
    for _ in range(5):
        torch.cuda.synchronize(); t = time.perf_counter(); f(); torch.cuda.synchronize()
        best = max(best, n / (time.perf_counter() - t) / 1e9)
    return best
print(f"h2d_gbps={rate(lambda: d.copy_(h, non_blocking=True)):.2f} d2h_gbps={rate(lambda: h.copy_(d, non_blocking=True)):.2f}")
"""
_link = {}


def link_rate():
    """The pinned copy rates host -> device and back, GB/s, measured once in this run (a child
    process, so that this one holds no CUDA context)."""
    if not _link:
        rc, nums, _ = run([sys.executable, "-c", PINNED_RATE])
        _link.update(nums if rc == 0 else {"h2d_gbps": 0, "d2h_gbps": 0})
        print(f"Pinned copy rate in this run: {_link['h2d_gbps']:.1f} GB/s host to device, "
              f"{_link['d2h_gbps']:.1f} GB/s device to host (1 GiB copies, best of 5).\n")
    return _link["h2d_gbps"]


HOST_FRAMES_AT_EXIT = re.compile(r"at exit: [\d.]+ MiB allocated in \d+ allocation\(s\); ([\d.]+) MiB in host frames")


def oversubscribed(pool, tag, extra=None):
    """The shim's environment for an oversubscribed run on a pool of `pool` bytes."""
    return {"VRAMSWAP_OVERSUBSCRIBE": "1", "VRAMSWAP_POOL_SIZE": str(pool), "VRAMSWAP_SHM_PREFIX": f"{PREFIX}{tag}-", **(extra or {})}


ALL_IN_HOST_FRAMES = 32 << 20  # a pool of one frame: everything beyond it is in host frames


def step_floor(device_step, over_err, weights, pool, link):
    """A PyTorch step's floor: its time in device memory plus the bytes in host frames at the
    oversubscribed run's exit (the shim's exit line; the state beyond the pool where the line
    is missing) over the pinned rate. Returns (bytes in host frames, floor in s)."""
    beyond = [float(m) for m in HOST_FRAMES_AT_EXIT.findall(over_err)]
    beyond_bytes = beyond[-1] * (1 << 20) if beyond else max(0.0, 4 * weights * GiB - pool)
    return beyond_bytes, device_step + (beyond_bytes / (link * 1e9) if link else 0)


def kernel_table(pool):
    print(f"## Memory-bound kernel (plain_cuda: read + write every word; 3 passes), pool {pool // GiB} GiB\n")
    link = link_rate()
    print("floor: one pass in device memory plus the bytes beyond the pool over the pinned rate, as GB/s of the pass.\n")
    print("| working set | x pool | device memory GB/s | oversubscribed GB/s | host-mapped GB/s | floor GB/s | oversub / device | oversub / host-mapped | oversub / floor | words wrong |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mult in (0.5, 1.0, 1.5, 2.0):
        ws = int(pool * mult)
        rc_d, dev, _ = run([PLAIN, str(ws)])
        rc_o, over, _ = run([PLAIN, str(ws)], shim=True, env=oversubscribed(pool, f"k{mult}"))
        rc_h, host, _ = run([PLAIN, str(ws), "--host-mapped"])
        d, o, h = dev.get("bump_gbps", 0), over.get("bump_gbps", 0), host.get("bump_gbps", 0)
        wrong = int(dev.get("wrong", -1) + over.get("wrong", -1) + host.get("wrong", -1)) if min(rc_d, rc_o, rc_h) == 0 else "run failed"
        pass_s = 2 * ws / (d * 1e9) if d else 0
        floor_s = pass_s + (max(0, ws - pool) / (link * 1e9) if link else 0)
        f = 2 * ws / floor_s / 1e9 if floor_s else 0
        print(f"| {ws / GiB:.0f} GiB | {mult} | {d:.1f} | {o:.1f} | {h:.1f} | {f:.1f} | {o / d if d else 0:.3f} | {o / h if h else 0:.2f} "
              f"| {o / f if f else 0:.3f} | {wrong} |")
    print()


TORCH_OVERSUB_STEPS = int(os.environ.get("VRAMSWAP_BENCH_TORCH_STEPS", "30"))


def torch_table(pool):
    print(f"## PyTorch training step (linear layers + Adam; state ~4x the weights), pool {pool // GiB} GiB\n")
    link = link_rate()
    print(f"s/step: the mean of steps 2-6; oversubscribed: the mean of the last 5 of {TORCH_OVERSUB_STEPS} steps (placement by use "
          "moves pages as the run goes), and with VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=0 (pages where they were first backed); the first "
          "step (allocating gradients and Adam's state) apart. floor: device memory plus the bytes in host frames at the "
          "oversubscribed run's exit (the shim's exit line) over the pinned rate.\n")
    print("| state | x pool | device memory s/step | oversubscribed, placement on s/step | placement off (the default) s/step | all in host frames s/step | floor s/step "
          "| oversub / device | oversub / host | oversub / floor | placement off / floor | first step: oversub / device | loss falls |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mult in (0.5, 1.0, 1.5, 2.0):
        weights = pool * mult / 4 / GiB
        args = [sys.executable, TORCH, f"{weights:.3f}", "6"]
        rc_d, dev, _ = run(args)
        rc_o, over, over_err = run(args[:-1] + [str(TORCH_OVERSUB_STEPS)], shim=True,
                                   env=oversubscribed(pool, f"t{mult}", {"VRAMSWAP_OVERSUBSCRIBE_PLACEMENT": "1"}))
        rc_f, off, _ = run(args, shim=True, env=oversubscribed(pool, f"f{mult}", {"VRAMSWAP_OVERSUBSCRIBE_PLACEMENT": "0"}))
        rc_h, host, _ = run(args, shim=True, env=oversubscribed(ALL_IN_HOST_FRAMES, f"h{mult}"))
        d, o, h = dev.get("step_s", 0), over.get("last_steps_s", 0), host.get("step_s", 0)
        p_off = off.get("step_s", 0)
        fd, fo = dev.get("first_step_s", 0), over.get("first_step_s", 0)
        _, floor = step_floor(d, over_err, weights, pool, link)
        good = "yes" if all(x.get("ok") == 1 for x in (dev, over, off, host)) else "NO"
        print(f"| {4 * weights:.1f} GiB | {mult} | {d:.4f} | {o:.4f} | {p_off:.4f} | {h:.4f} | {floor:.4f} | {o / d if d else 0:.2f} "
              f"| {o / h if h else 0:.2f} | {o / floor if floor else 0:.2f} | {p_off / floor if floor else 0:.2f} "
              f"| {fo / fd if fd else 0:.2f} | {good} |")
        placed = re.findall(r"placement by use: (\d+) round\(s\), (\d+) page\(s\) into pool frames, (\d+) into host frames, "
                            r"the gate closed ([\d.]+) s for it; (\d+) launch\(es\) observed, (\d+) whose[^;]*(?:; (\d+) round\(s\) skipped)?",
                            over_err)
        if placed:
            r = placed[-1]
            print(f"<!-- {mult}x: placement {r[0]} rounds, {r[1]} pages in, {r[2]} out, gate closed {r[3]} s, "
                  f"{r[4]} launches observed, {r[5]} unreadable, {r[6] or 0} rounds skipped by the cost model -->")
    print()


def torch_fused_table(pool):
    print(f"## PyTorch training step with Adam(fused=True), pool {pool // GiB} GiB\n")
    link = link_rate()
    print("The same step as above, with PyTorch's fused Adam: one sweep over the weights, gradients and both states "
          "per step and no temporaries, where the default (foreach) Adam makes seven sweeps and a temporary the size of "
          f"the weights. Device memory: the mean of steps 2-6; oversubscribed (placement off, the default): the mean of "
          f"the last 5 of {TORCH_OVERSUB_STEPS} steps; all in host frames: the shim with a pool of one frame, steps 2-6. floor: as "
          "above, from this run's bytes in host frames.\n")
    print("| state | x pool | device memory s/step | oversubscribed s/step | all in host frames s/step | in host frames at exit "
          "| floor s/step | oversub / device | oversub / host | oversub / floor | loss falls |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mult in (1.0, 1.5, 2.0):
        weights = pool * mult / 4 / GiB
        args = [sys.executable, TORCH, f"{weights:.3f}", "6", "fused"]
        rc_d, dev, _ = run(args)
        rc_o, over, over_err = run(args[:3] + [str(TORCH_OVERSUB_STEPS), "fused"], shim=True, env=oversubscribed(pool, f"u{mult}"))
        rc_h, host, _ = run(args, shim=True, env=oversubscribed(ALL_IN_HOST_FRAMES, f"v{mult}"))
        d, o, h = dev.get("step_s", 0), over.get("last_steps_s", 0), host.get("step_s", 0)
        beyond_bytes, floor = step_floor(d, over_err, weights, pool, link)
        good = "yes" if all(rc == 0 for rc in (rc_d, rc_o, rc_h)) and all(x.get("ok") == 1 for x in (dev, over, host)) else "NO"
        print(f"| {4 * weights:.1f} GiB | {mult} | {d:.4f} | {o:.4f} | {h:.4f} | {beyond_bytes / GiB:.2f} GiB | {floor:.4f} "
              f"| {o / d if d else 0:.2f} | {o / h if h else 0:.2f} | {o / floor if floor else 0:.2f} | {good} |")
    print()


RECLAIM_LINE = re.compile(
    r"reclaim: (\d+) page\(s\) \(\d+ MiB\) for (\d+) request\(s\) moved to host frames in ([\d.]+) ms: host frames ready ahead "
    r"in ([\d.]+) ms \((\d+), (\d+) of them spares; (\d+) created while the lock holder waited\); gate closed ([\d.]+) ms "
    r"\(closing it ([\d.]+), running work ([\d.]+), new frames ([\d.]+), filling ([\d.]+), copies ([\d.]+), remapping ([\d.]+), "
    r"scrubbing ([\d.]+), waiting for more requests ([\d.]+)\)(?:; waits for a next request (\d+) \((\d+) ended by one\), "
    r"(\d+) skipped; began ([-\d.]+) ms after the previous burst ended)?"
    r"(?: \(-1: none before\); of the filling, mapping ([\d.]+) ms and granting access ([\d.]+) ms)?")
READY_LINE = re.compile(r"(\d+) host frame\(s\) \((\d+) MiB\) ready ahead for reclaims")


# The lock user's own timeline, from its debug log (runtime, session, acquire and pager lines).
BACKEND_LINE = re.compile(r"backend ready in ([\d.]+) ms")
SESSION_LINE = re.compile(r"session: device \d+ opened in ([\d.]+) ms \(joining the pool ([\d.]+), its frame source and store "
                          r"([\d.]+), the pager and the rest ([\d.]+)\)")
GRANTED_LINE = re.compile(r"acquire: lock granted after ([\d.]+) ms")
RESIDENT_LINE = re.compile(r"acquire: memory resident, \d+ bytes brought in in ([\d.]+) ms")
MALLOC_LINE = re.compile(r"pager: malloc\(\d+ bytes\): \d+ page\(s\) backed in ([\d.]+) ms \(asking for frames ([\d.]+), waiting "
                         r"for them ([\d.]+), mapping ([\d.]+), granting access ([\d.]+)\)")
USER_LOG = {"VRAMSWAP_LOG": "debug"}


def user_timeline(err, alloc_s):
    """Where a lock user's timed allocation went, ms, from its debug log: vramswap's backend,
    the session (joining the pool), the lock, and its mallocs summed (asking, waiting for
    frames, mapping, access); the rest is between them (the shim's and the runtime's own)."""
    mallocs = [[float(x) for x in m] for m in MALLOC_LINE.findall(err)]
    if not mallocs:
        return {}
    t = {}
    if m := BACKEND_LINE.search(err):
        t["backend"] = float(m.group(1))
    if m := SESSION_LINE.search(err):
        t["joining the pool"] = float(m.group(2))
        t["frame source, store, pager"] = float(m.group(3)) + float(m.group(4))
    if (g := GRANTED_LINE.search(err)) and (r := RESIDENT_LINE.search(err)):
        t["lock"] = float(g.group(1)) + float(r.group(1))
    for i, name in enumerate(("asking for frames", "waiting for frames", "mapping", "granting access"), start=1):
        t[name] = sum(x[i] for x in mallocs)
    t["the rest"] = alloc_s * 1e3 - sum(t.values())
    return t


def timeline_table(rows):
    """rows: (name, alloc_s, err) per lock user."""
    cols = ("backend", "joining the pool", "frame source, store, pager", "lock", "asking for frames",
            "waiting for frames", "mapping", "granting access", "the rest")
    print("Where each lock user's timed allocation goes, ms (its debug log; the mallocs' parts are summed over its "
          "requests; the rest is the time outside them, the shim's and the CUDA runtime's own):\n")
    print("| lock user | allocation | " + " | ".join(cols) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in cols) + " |")
    for name, alloc_s, err in rows:
        t = user_timeline(err, alloc_s)
        print(f"| {name} | {alloc_s * 1e3:.0f} | " + " | ".join(f"{t[c]:.1f}" if c in t else "-" for c in cols) + " |")
    print()


def reclaim_job(pool, made_ahead, tag):
    """A job on 1.5x the pool, then two lock users taking 3/4 of the pool from it, 8 s apart
    (the second after the job's pages moved back: it finds the first one's host frames as
    spares). made_ahead: the job makes host frames ahead of reclaims (the default) and the
    first user comes once they are ready; else VRAMSWAP_OVERSUBSCRIBE_AHEAD=0 (a cold reclaim
    creates them while the user waits). Returns what the tables need."""
    user_bytes = str(pool * 3 // 4)
    env = oversubscribed(pool, tag)
    if not made_ahead:
        env["VRAMSWAP_OVERSUBSCRIBE_AHEAD"] = "0"
    seconds = RECLAIM_AHEAD_WAIT_S + 45 if made_ahead else 45
    t0 = time.monotonic()
    job = subprocess.Popen([PLAIN, str(pool * 3 // 2), str(seconds)], env=environment(True, env), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lines = []
    ready = {}
    reader = threading.Thread(target=lambda: [lines.append(line) for line in job.stderr], daemon=True)
    reader.start()
    time.sleep(12)  # its memory allocated and filled, passes running
    if made_ahead:
        while time.monotonic() - t0 < RECLAIM_AHEAD_WAIT_S and not any(READY_LINE.search(line) for line in list(lines)):
            time.sleep(0.2)
        for line in list(lines):
            if m := READY_LINE.search(line):
                ready = {"frames": int(m.group(1)), "mib": int(m.group(2)), "after_s": time.monotonic() - t0}
                break
    users = []
    for _ in range(2):
        users.append(run([PLAIN, user_bytes, "0", "--context-first"], shim=True,
                         env={"VRAMSWAP_POOL_SIZE": str(pool), "VRAMSWAP_SHM_PREFIX": f"{PREFIX}{tag}-", **USER_LOG}))
        time.sleep(8)
    out = job.stdout.read()
    job.wait(timeout=300)
    reader.join(timeout=30)
    err = "".join(lines)
    jn = {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", out)}
    m = re.search(r"in host frames; (\d+) page\(s\) moved to host frames for lock holders in ([\d.]+) s in all, (\d+) moved back", err)
    pages, secs, back = (int(m.group(1)), float(m.group(2)), int(m.group(3))) if m else (0, 0.0, 0)
    if job.returncode != 0:
        sys.stderr.write(err[-3000:])
    return {"users": users, "job": jn, "rc": job.returncode, "pages": pages, "secs": secs, "back": back,
            "bursts": RECLAIM_LINE.findall(err), "ready": ready}


# How long the made-ahead job may take to make its host frames (one per lent pool frame,
# at most half of one thread: ~512 frames of 32 MiB for a 16 GiB pool, ~15 s while it runs).
RECLAIM_AHEAD_WAIT_S = 60


def reclaim(pool):
    print(f"## Reclaim: a lock user takes 3/4 of the pool ({pool // GiB} GiB) from a running oversubscribed job\n")
    print("The job (plain_cuda) runs on 1.5x the pool. A lock user (plain_cuda at normal priority under the shim) "
          "allocates 3/4 of the pool in 1 GiB cudaMallocs, checks its words and exits; 8 s later, after the job's pages "
          "moved back, a second lock user does the same. Two jobs: one with VRAMSWAP_OVERSUBSCRIBE_AHEAD=0 (no host "
          "frames made ahead: the first user's reclaim creates them, cold), one with the default (host frames made "
          "ahead; its first user comes once they are ready). The baseline: the same lock user on an idle pool whose "
          "server runs already, as the job's does for its lock users (every allocation includes the lock user's attach to "
          "the pool; its CUDA context is started first, by cudaFree(0), and timed apart). The first idle run starts that "
          "server on demand, building the pool inside its timed allocation; it is shown, not used as the baseline.\n")
    user_bytes = str(pool * 3 // 4)
    # Twice on one pool: the second comes within the server's idle exit (VRAMSWAP_POOL_IDLE_EXIT)
    # of the first and finds it running.
    idle_env = {"VRAMSWAP_POOL_SIZE": str(pool), "VRAMSWAP_SHM_PREFIX": f"{PREFIX}ri-", **USER_LOG}
    rc_s, idle_start, _ = run([PLAIN, user_bytes, "0", "--context-first"], shim=True, env=idle_env)
    rc_i, idle, idle_err = run([PLAIN, user_bytes, "0", "--context-first"], shim=True, env=idle_env)
    cold = reclaim_job(pool, False, "rc")
    ahead = reclaim_job(pool, True, "ra")
    idle_s = idle.get("alloc_s", 0)
    rows = [("cold: no host frames made ahead (VRAMSWAP_OVERSUBSCRIBE_AHEAD=0), lock user 1", cold["users"][0]),
            ("warm: the same job, lock user 2 (spares from user 1)", cold["users"][1]),
            ("made ahead (the default), lock user 1", ahead["users"][0]),
            ("made ahead, lock user 2 (spares)", ahead["users"][1])]
    # Each user starts its CUDA context first (cudaFree(0)), timed apart: the allocation is then
    # vramswap's and the job's part alone, and the context's start beside a running job shows.
    idle_both = idle_s + idle.get("context_s", 0)
    print("| lock user's allocation | s | / idle pool (goal <= 2) | its CUDA context's start before it, s | both / idle pool's |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, u in [("idle pool, the server started by this allocation (not the baseline)", idle_start),
                    ("**idle pool, its server running (the baseline)**", idle)] + [(name, u) for name, (_, u, _) in rows]:
        a, c = u.get("alloc_s", 0), u.get("context_s", 0)
        print(f"| {name} | {a:.3f} | {a / idle_s if idle_s else 0:.2f} | {c:.3f} | {(a + c) / idle_both if idle_both else 0:.2f} |")
    print()
    timeline_table([("idle pool, its server running (the baseline)", idle_s, idle_err)] +
                   [(name, u.get("alloc_s", 0), e) for name, (_, u, e) in rows])
    r = ahead["ready"]
    print("| | cold job | made-ahead job |")
    print("| --- | ---: | ---: |")
    print(f"| host frames made ahead, ready after (s from the job's start) | - | "
          f"{(str(r['frames']) + ' (' + str(r['mib'] // 1024) + ' GiB), ' + format(r['after_s'], '.1f') + ' s') if r else 'not ready in time'} |")
    created = [sum(int(g[6]) for g in j["bursts"]) for j in (cold, ahead)]
    print(f"| job: host frames its reclaims created while a lock user waited | {created[0]} | {created[1]} |")
    for key, name in (("pages", "job: pages moved to host frames (32 MiB each)"), ("back", "job: pages moved back into the pool")):
        print(f"| {name} | {cold[key]} | {ahead[key]} |")
    print(f"| job: time with its launch gate closed for reclaims | {cold['secs']:.3f} s | {ahead['secs']:.3f} s |")
    print(f"| words wrong (job, lock users) | " + " | ".join(
        f"{int(j['job'].get('wrong', -1))}, {', '.join(str(int(u.get('wrong', -1))) for _, u, _ in j['users'])}" for j in (cold, ahead)) + " |")
    print(f"| exit status (job, lock users) | " + " | ".join(
        f"{j['rc']}, {', '.join(str(rc) for rc, _, _ in j['users'])}" for j in (cold, ahead)) + " |")
    print()
    # Where the job's time went: one log line per burst of requests under one closing of its gate.
    print("Each burst: the requests that one closing of the job's launch gate served (ms). Filling: the old frames mapped at "
          "scratch slots and the pages' addresses switched to the new frames, access granted, the copies queued (a quarter of "
          "a batch at a time, so copies run during it); copies: waiting for what is left of them; remapping: recording the "
          "copied pages and queueing the old frames' scrubs.\n")
    print("Waits: the burst's waits for a next request after serving one (made, ended by a request, skipped: no wait could "
          "save anything); after previous: how long after the previous burst's end it began (the lock user's time between its "
          "requests, from its last frame given back; -1: the first).\n")
    print("| job | burst | pages | requests | in all | host frames ready ahead (count, spares, created while the user waited) | gate closed | closing it | running work | new frames | filling | copies | remapping | scrubbing | waiting for more requests | waits (made, caught, skipped) | after previous |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, j in (("cold", cold), ("made ahead", ahead)):
        for i, g in enumerate(j["bursts"]):
            waits = f"{g[16]}, {g[17]}, {g[18]}" if g[16] else "-"
            print(f"| {name} | {i + 1} | {g[0]} | {g[1]} | {g[2]} | {g[3]} ({g[4]}, {g[5]}, {g[6]}) | {g[7]} | {g[8]} | {g[9]} | {g[10]} | "
                  f"{g[11]} | {g[12]} | {g[13]} | {g[14]} | {g[15]} | {waits} | {g[19] or '-'} |")
        # Per request (the lock user's allocations come one at a time): the sums over bursts.
        n = sum(int(g[1]) for g in j["bursts"])
        if n:
            cols = {"filling": 11, "copies": 12, "remapping": 13, "scrubbing": 14, "waiting for more requests": 15}
            if all(g[20] for g in j["bursts"]):
                cols.update({"of the filling, mapping": 20, "of the filling, granting access": 21})
            per = ", ".join(f"{k} {sum(float(g[c]) for g in j['bursts']) / n:.1f}" for k, c in cols.items())
            print(f"\n{name}: per request ({n} requests), ms: {per}")
    print()


# --- 4. compute: a lock holder beside a low-priority job ----------------------------------
# Both train the same MLP (fp32, Adam), and both wait for every step's loss (loss.item()), as
# training loops do: so the job has at most about one step queued on the GPU when a hold
# begins, which the holder's first step of each hold shares the GPU with (a launch already
# queued cannot be taken back).
COMPUTE_WIDTH, COMPUTE_DEPTH, COMPUTE_BATCH = 4096, 8, 1024
COMPUTE_HOLDS, COMPUTE_STEPS, COMPUTE_VALLEY_S = 8, 30, 0.5
COMPUTE_POLICIES = ("free", "yield", "share:25")


def compute_step(torch):
    """The training step both sides run, on a model made on the current device."""
    torch.manual_seed(0)
    layers = []
    for _ in range(COMPUTE_DEPTH):
        layers += [torch.nn.Linear(COMPUTE_WIDTH, COMPUTE_WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    x = torch.randn(COMPUTE_BATCH, COMPUTE_WIDTH, device="cuda")

    def step():
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # waits for the step's kernels

    return step


def compute_job():
    """The low-priority job (run under the shim; knows nothing of vramswap): steps until its
    stdin closes. Prints {"ready": t} once warm, then {"ends": [t, ...]}: each step's end
    (time.monotonic, CLOCK_MONOTONIC: comparable with the holder's)."""
    import torch

    step = compute_step(torch)
    for _ in range(5):  # cuBLAS plans, the caching allocator's blocks, Adam's state
        step()
    stop = threading.Event()

    def wait_for_eof():
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    print(json.dumps({"ready": time.monotonic()}), flush=True)
    ends = []
    while not stop.is_set():
        step()
        ends.append(time.monotonic())
    print(json.dumps({"ends": ends}), flush=True)


def compute_holder():
    """The lock holder: a warm-up hold, then COMPUTE_HOLDS holds of COMPUTE_STEPS steps, each
    after a COMPUTE_VALLEY_S valley. Prints {"holds": [[start, end], ...] (the warm-up
    first; time.monotonic), "steps": [[hold, index, seconds], ...]}."""
    import torch
    import vramswap
    import vramswap.torch

    vramswap.torch.enable()
    holds, steps = [], []
    with vramswap.gpu_lock(0):
        start = time.monotonic()
        step = compute_step(torch)
        for _ in range(5):
            step()
    holds.append([start, time.monotonic()])
    for h in range(COMPUTE_HOLDS):
        time.sleep(COMPUTE_VALLEY_S)
        with vramswap.gpu_lock(0):
            start = time.monotonic()
            for i in range(COMPUTE_STEPS):
                t0 = time.perf_counter()
                step()
                steps.append([h, i, time.perf_counter() - t0])
        holds.append([start, time.monotonic()])
    print(json.dumps({"holds": holds, "steps": steps}), flush=True)


def start_compute_job(pool, prefix, policy):
    """The job, warm; returns (process, its stderr file, when it was ready) or (None, ...)."""
    err = tempfile.TemporaryFile(mode="w+")
    env = environment(True, {"VRAMSWAP_OVERSUBSCRIBE": "1", "VRAMSWAP_OVERSUBSCRIBE_COMPUTE": policy,
                             "VRAMSWAP_POOL_SIZE": str(pool), "VRAMSWAP_SHM_PREFIX": prefix})
    job = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--compute-job"], env=env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=err, text=True)
    line = job.stdout.readline()
    try:
        return job, err, json.loads(line)["ready"]
    except (ValueError, KeyError):
        job.kill()
        job.wait()
        err.seek(0)
        sys.stderr.write(f"FAILED: the compute job ({policy}) did not start: {line}\n{err.read()[-3000:]}\n")
        return None, err, 0.0


def stop_compute_job(job, err):
    """Close the job's stdin; returns (its step end times, its launches' waits, seconds waited)."""
    job.stdin.close()
    out = job.stdout.read()
    job.wait(timeout=120)
    err.seek(0)
    said = err.read()
    ends = []
    for line in out.splitlines():
        if line.startswith("{") and "ends" in line:
            ends = json.loads(line)["ends"]
    m = re.search(r"(\d+) launch\(es\) waited ([\d.]+) s in all", said)
    if job.returncode != 0:
        sys.stderr.write(f"FAILED ({job.returncode}): the compute job\n{said[-3000:]}\n")
    return ends, (int(m.group(1)), float(m.group(2))) if m else (0, 0.0)


def run_compute_holder(pool, prefix):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--compute-holder"],
                       env=environment(False, {"VRAMSWAP_POOL_SIZE": str(pool), "VRAMSWAP_SHM_PREFIX": prefix}),
                       capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("{") and "holds" in line:
            return json.loads(line)
    sys.stderr.write(f"FAILED ({p.returncode}): the compute holder\n{p.stdout}\n{p.stderr[-3000:]}\n")
    return None


def steps_within(ends, spans):
    """Job steps that ended within the spans, per second of the spans."""
    total = sum(b - a for a, b in spans)
    n = sum(1 for t in ends if any(a <= t <= b for a, b in spans))
    return n / total if total > 0 else 0.0


def compute(pool):
    print(f"## Compute: a PyTorch lock holder beside a low-priority job (VRAMSWAP_OVERSUBSCRIBE_COMPUTE), pool {pool // GiB} GiB\n")
    print(f"Both train an MLP ({COMPUTE_DEPTH} x Linear {COMPUTE_WIDTH} + GELU, Adam, batch {COMPUTE_BATCH}, fp32) and wait "
          f"for each step's loss. The holder (vramswap.torch) makes {COMPUTE_HOLDS} holds of {COMPUTE_STEPS} steps under one "
          f"gpu_lock each, {COMPUTE_VALLEY_S} s apart; the job runs the same step unmodified under the shim "
          f"(VRAMSWAP_OVERSUBSCRIBE=1) all along. Holder step times: every step of every hold; the first step of a "
          f"hold shares the GPU with the job's work queued before the grant.\n")
    alone = run_compute_holder(pool, f"{PREFIX}ca-")
    job, err, ready = start_compute_job(pool, f"{PREFIX}cj-", "free")
    job_alone = 0.0
    if job is not None:
        time.sleep(6)
        stopped = time.monotonic()
        ends, _ = stop_compute_job(job, err)
        job_alone = steps_within(ends, [(ready, stopped)])
    if alone is None:
        return
    base = [s for _, _, s in alone["steps"]]
    base_median, base_mean = statistics.median(base), statistics.mean(base)
    base_first = statistics.mean([s for _, i, s in alone["steps"] if i == 0])
    print(f"The job alone: {job_alone:.1f} steps/s.\n")
    print("| low-priority job | holder ms/step, median | median / alone | mean / alone | first step of a hold / alone "
          "| job steps/s in the valleys (of alone) | job steps/s during holds | job's launches that waited, s waited |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| none | {base_median * 1e3:.2f} | 1.000 | 1.000 | 1.00 | | | |")
    for i, policy in enumerate(COMPUTE_POLICIES):
        job, err, ready = start_compute_job(pool, f"{PREFIX}c{i}-", policy)
        if job is None:
            print(f"| {policy} | job failed | | | | | | |")
            continue
        held = run_compute_holder(pool, f"{PREFIX}c{i}-")
        ends, (waits, waited) = stop_compute_job(job, err)
        if held is None:
            print(f"| {policy} | holder failed | | | | | | |")
            continue
        t = [s for _, _, s in held["steps"]]
        first = statistics.mean([s for _, k, s in held["steps"] if k == 0])
        holds = held["holds"]
        valleys = [(holds[k][1], holds[k + 1][0]) for k in range(len(holds) - 1)]
        in_valleys = steps_within(ends, valleys)
        in_holds = steps_within(ends, [tuple(h) for h in holds[1:]])
        print(f"| {policy} | {statistics.median(t) * 1e3:.2f} | {statistics.median(t) / base_median:.3f} "
              f"| {statistics.mean(t) / base_mean:.3f} | {first / base_first:.2f} "
              f"| {in_valleys:.1f} ({in_valleys / job_alone if job_alone else 0:.2f}) | {in_holds:.1f} | {waits}, {waited:.2f} |")
    print()


def main():
    sys.stdout.reconfigure(line_buffering=True)  # a run cut short keeps what it measured
    print("# Oversubscription benchmark\n")
    parts = os.environ.get("VRAMSWAP_BENCH_PARTS", "kernel,torch,torch_fused,reclaim,compute").split(",")
    print(f"Command: `VRAMSWAP_BENCH_PARTS={','.join(parts)} bash scripts/device-run.sh bench:oversubscribe` "
          f"(this file: bench/python/bench_oversubscribe.py).\n")
    if "kernel" in parts:
        kernel_table(16 * GiB)
    if "torch" in parts:
        torch_table(8 * GiB)
    if "torch_fused" in parts:
        torch_fused_table(8 * GiB)
    if "reclaim" in parts:
        reclaim(16 * GiB)
    if "compute" in parts:
        compute(16 * GiB)


if __name__ == "__main__":
    if sys.argv[1:] == ["--compute-job"]:
        compute_job()
    elif sys.argv[1:] == ["--compute-holder"]:
        compute_holder()
    else:
        main()
