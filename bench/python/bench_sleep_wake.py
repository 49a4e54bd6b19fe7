"""Sleep and wake of bf16 weights plus a KV pool: vramswap.torch_memory_saver beside
torch_memory_saver itself, and the pinned copy rate, in one run.

Run by scripts/device-run.sh (bench:sleep_wake), which sets VRAMSWAP_BUILD_DIR and puts the
build's Python package on PYTHONPATH. Prints a markdown report on stdout.

For each weight size (SLEEP_SIZES_GIB, default 4,16,32) and each implementation, a fresh
process allocates the weights (tensors of 512 MiB, random bf16) in region("weights",
enable_cpu_backup=True) and a KV pool (a quarter of the weights, at least 1 GiB) in
region("kv_cache"), then makes SLEEP_CYCLES (default 3) cycles of pause() and resume(),
each timed (device synchronized before and after), and checks the weights bit for bit
after every resume (a fingerprint of each tensor's 16-bit words, taken before the first
pause). GB/s each way is the weights' bytes over the call's time (the KV pool is dropped,
not copied). The pinned copy rate is torch's copy of a 4 GiB pinned buffer each way.
  vramswap: `from vramswap.torch_memory_saver import torch_memory_saver`, the pool sized
    to hold the weights and the KV pool (VRAMSWAP_POOL_SIZE).
  torch_memory_saver: the package from the registry (0.0.10; hook_mode "torch", which needs
    no LD_PRELOAD), its default synchronous copies.
"""
import json
import os
import subprocess
import sys

GiB = 1 << 30
SIZES = [float(s) for s in os.environ.get("SLEEP_SIZES_GIB", "4,16,32").split(",")]
CYCLES = int(os.environ.get("SLEEP_CYCLES", "3"))

JOB = r"""
import json, os, sys, time
impl, size_gib, cycles = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
if impl == "vramswap":
    from vramswap.torch_memory_saver import torch_memory_saver as tms
else:
    from torch_memory_saver import torch_memory_saver as tms
    tms.hook_mode = "torch"
import torch
GiB = 1 << 30
chunk = 512 << 20
n = max(1, int(size_gib * GiB) // chunk)
kv_bytes = max(GiB, n * chunk // 4)
g = torch.Generator(device="cuda").manual_seed(1234)
with tms.region(tag="weights", enable_cpu_backup=True):
    weights = [torch.empty(chunk // 2, dtype=torch.bfloat16, device="cuda") for _ in range(n)]
with tms.region(tag="kv_cache"):
    kv = torch.empty(kv_bytes // 2, dtype=torch.bfloat16, device="cuda")
for w in weights:
    w.copy_(torch.randn(w.numel(), generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16))
kv.fill_(1.0)
def fingerprint():
    return [int(w.view(torch.int16).to(torch.int64).sum().item()) for w in weights]
before = fingerprint()
addresses = [w.data_ptr() for w in weights]
torch.cuda.synchronize()
free_awake = torch.cuda.mem_get_info()[0]
rows = []
for c in range(cycles):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tms.pause()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    tms.resume()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    intact = fingerprint() == before and [w.data_ptr() for w in weights] == addresses
    rows.append({"cycle": c, "pause_s": t1 - t0, "resume_s": t2 - t1, "intact": intact})
    kv.fill_(1.0)  # dropped on pause: the engine refills it
print(json.dumps({"impl": impl, "weights_bytes": n * chunk, "kv_bytes": kv_bytes, "rows": rows}), flush=True)
"""

PINNED = r"""
import json, time, torch
n = 4 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
d = torch.empty(n, dtype=torch.uint8, device="cuda")
h.fill_(3)
for _ in range(2):
    torch.cuda.synchronize(); t0 = time.perf_counter(); d.copy_(h, non_blocking=True); torch.cuda.synchronize(); h2d = n / (time.perf_counter() - t0)
    torch.cuda.synchronize(); t0 = time.perf_counter(); h.copy_(d, non_blocking=True); torch.cuda.synchronize(); d2h = n / (time.perf_counter() - t0)
print(json.dumps({"h2d": h2d, "d2h": d2h}))
"""


def run(args, env):
    p = subprocess.run([sys.executable, "-c", *args], env=env, capture_output=True, text=True, timeout=900)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, (p.stderr or p.stdout)[-1500:]
    return json.loads(lines[-1]), p.stderr[-600:]


def main():
    env = dict(os.environ)
    pinned, err = run([PINNED], env)
    if pinned is None:
        print("pinned copy measurement failed:\n```\n" + err + "\n```")
        return 1
    import torch

    name = torch.cuda.get_device_name(0)
    print(f"# Sleep and wake: vramswap.torch_memory_saver beside torch_memory_saver ({name})\n")
    print(f"Pinned copy rate in this run: {pinned['h2d'] / 1e9:.1f} GB/s host to device, {pinned['d2h'] / 1e9:.1f} GB/s device to host. "
          f"{CYCLES} pause/resume cycles per process; weights bf16 in 512 MiB tensors with a CPU backup, a KV pool without.\n")
    print("| weights | implementation | cycle | pause GB/s | pause / pinned d2h | resume GB/s | resume / pinned h2d | weights intact |")
    print("|---|---|---|---|---|---|---|---|")
    notes = []
    status = 0
    results = {}
    for size in SIZES:
        for impl in ("vramswap", "torch_memory_saver"):
            e = dict(env)
            e.pop("VRAMSWAP_TORCH", None)
            if impl == "vramswap":
                e["VRAMSWAP_POOL_SIZE"] = f"{int(size * 1.25 + 4)}GiB"
                e["VRAMSWAP_SHM_PREFIX"] = f"vssw{os.getpid()}-{int(size)}-"
                e["VRAMSWAP_POOL_IDLE_EXIT"] = "2"
            r, err = run([JOB, impl, str(size), str(CYCLES)], e)
            if r is None:
                notes.append(f"- {impl}, {size:g} GiB: failed:\n```\n{err}\n```")
                status = 1 if impl == "vramswap" else status
                continue
            results[(size, impl)] = r
            for row in r["rows"]:
                out = r["weights_bytes"] / row["pause_s"]
                back = r["weights_bytes"] / row["resume_s"]
                print(f"| {r['weights_bytes'] / GiB:.0f} GiB | {impl} | {row['cycle'] + 1} | {out / 1e9:.1f} | {out / pinned['d2h']:.2f} | "
                      f"{back / 1e9:.1f} | {back / pinned['h2d']:.2f} | {'yes' if row['intact'] else 'NO'} |")
                if impl == "vramswap" and not row["intact"]:
                    status = 1
            if err.strip():
                notes.append(f"- {impl}, {size:g} GiB, stderr tail: `{err.strip().splitlines()[-1][:300]}`")
    print()
    for size in SIZES:
        a, b = results.get((size, "vramswap")), results.get((size, "torch_memory_saver"))
        if a and b:
            pa = sum(r["pause_s"] for r in a["rows"]) / len(a["rows"])
            pb = sum(r["pause_s"] for r in b["rows"]) / len(b["rows"])
            ra = sum(r["resume_s"] for r in a["rows"]) / len(a["rows"])
            rb = sum(r["resume_s"] for r in b["rows"]) / len(b["rows"])
            print(f"- {size:g} GiB: vramswap's pause {pb / pa:.1f}x as fast as torch_memory_saver's, resume {rb / ra:.1f}x (mean of the cycles)")
    print()
    print("\n".join(notes))
    return status


if __name__ == "__main__":
    sys.exit(main())
