"""bench_first_evict: a process's first eviction against the pinned copy rate.

    python3 bench/python/bench_first_evict.py [--sizes 8,16] [--hold 5 | --hold 0,0.5,1] [--pool 24GiB]

A process's host tier (pinned host memory for its saved pages) is made as it is first
needed unless VRAMSWAP_HOST_PIN_AHEAD pins it in the background as device memory grows.
Each row is a fresh process that, with vramswap.torch and VRAMSWAP_EAGER_RELEASE=1 (every
release evicts everything), allocates SIZE GiB of tensors under the lock, fills them, holds
the lock --hold seconds more (its training, during which pinning ahead runs), and lets go:
that release is its first eviction. It then takes the lock again (restore) and lets go
(second eviction). Rates are bytes copied out / eviction time, against torch's pinned
device-to-host copy of 4 GiB measured in the same process after the evictions. Each row also
says how long allocating and filling took, and how much of what the first eviction saved the
host tier had pinned when it began (vramswap.stats()["host_pinned_bytes"] at the end of
the hold).
Needs PyTorch with CUDA, a GPU, and the vramswap package importable.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def worker(args):
    import torch
    import vramswap
    import vramswap.torch

    vramswap.torch.enable()
    size = int(args.size * 2**30)
    chunk = 1 << 30
    with vramswap.gpu_lock(0):
        t0 = time.perf_counter()
        tensors = [torch.empty(min(chunk, size - off), dtype=torch.uint8, device="cuda") for off in range(0, size, chunk)]
        for t in tensors:
            t.random_()
        torch.cuda.synchronize()
        made_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.hold:
            time.sleep(0.05)
        # What the host tier had pinned when the eviction began (the release right after).
        s0 = vramswap.stats(0)
    s1 = vramswap.stats(0)
    with vramswap.gpu_lock(0):
        torch.cuda.synchronize()
    s2 = vramswap.stats(0)
    n = 4 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    with vramswap.gpu_lock(0):
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        pinned = 3 * n / (time.perf_counter() - t0) / 1e9
        del dev
    print(json.dumps({
        "size": args.size,
        "first_bytes": s1["bytes_out"], "first_s": s1["evict_seconds"],
        "second_bytes": s2["bytes_out"] - s1["bytes_out"], "second_s": s2["evict_seconds"] - s1["evict_seconds"],
        "pinned_gbps": pinned,
        "made_s": made_s, "pinned_at_start": s0["host_pinned_bytes"],
    }), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="8,16")
    p.add_argument("--hold", default="5",
                   help="seconds the lock is held after allocating; a comma list gives a pinning-ahead row per value "
                        "and one without pinning ahead at the first")
    p.add_argument("--pool", default="24GiB")
    p.add_argument("--size", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.size is not None:
        args.hold = float(args.hold)
        return worker(args)
    holds = [float(h) for h in args.hold.split(",")]
    env = dict(os.environ, VRAMSWAP_BACKEND="cuda", VRAMSWAP_POOL_SIZE=args.pool, VRAMSWAP_EAGER_RELEASE="1")
    env.setdefault("VRAMSWAP_POOL_IDLE_EXIT", "3")
    env.pop("VRAMSWAP_TORCH", None)
    rows = []
    for size in [float(s) for s in args.sizes.split(",")]:
        runs = (("1", holds[0]), ("1", 0.0), ("0", holds[0])) if len(holds) == 1 else \
            tuple(("1", h) for h in holds) + (("0", holds[0]),)
        for ahead, hold in runs:
            cmd = [sys.executable, os.path.abspath(__file__), "--size", str(size), "--hold", str(hold)]
            r = subprocess.run(cmd, env=dict(env, VRAMSWAP_HOST_PIN_AHEAD=ahead), capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"bench_first_evict: size {size} GiB, pin ahead {ahead} failed:\n{r.stderr[-3000:]}")
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row.update(ahead=ahead, hold=hold)
            rows.append(row)
    import torch

    print(f"# bench_first_evict: {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}")
    print()
    print("| size | VRAMSWAP_HOST_PIN_AHEAD | allocating and filling | lock held after | host tier pinned when the eviction "
          "began | first eviction | / pinned copy | second eviction | / pinned copy | pinned copy (same process) |")
    print("| ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        first = r["first_bytes"] / r["first_s"] / 1e9 if r["first_s"] > 0 else float("nan")
        second = r["second_bytes"] / r["second_s"] / 1e9 if r["second_s"] > 0 else float("nan")
        ready = r["pinned_at_start"] / r["first_bytes"] if r["first_bytes"] > 0 else float("nan")
        print(f"| {r['size']:g} GiB | {r['ahead']} | {r['made_s']:.2f} s | {r['hold']:g} s | {ready:.0%} | "
              f"{first:.1f} GB/s | {first / r['pinned_gbps']:.2f} | "
              f"{second:.1f} GB/s | {second / r['pinned_gbps']:.2f} | {r['pinned_gbps']:.1f} GB/s |")


if __name__ == "__main__":
    main()
