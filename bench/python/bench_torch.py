"""bench_torch: what vramswap.torch costs a PyTorch training step when nothing has to move.

    python3 bench/python/bench_torch.py [--steps 60] [--width 4096] [--depth 8] [--batch 1024]

Runs the same training step (an MLP with Adam, forward + backward + optimizer step, fp32) in
three processes, one after the other, on one GPU, and reports the median step time of each
as a ratio to the first:
  1. PyTorch's own caching allocator, no lock;
  2. vramswap.torch.enable() and vramswap.gpu_lock() around every step, alone on the device
     (the stream-ordered allocator and an uncontended lock: the steady-state cost);
  3. the same with VRAMSWAP_EAGER_RELEASE=1: every release evicts all of the process's memory
     to host memory and every acquire brings it back, so the step pays a full swap out and in;
     reported with the bytes moved per step and their rate next to the pinned copy rate
     (torch's own pinned copy, measured in the same process).
Needs PyTorch with CUDA, a GPU, and the vramswap package importable (PYTHONPATH=<build>/python).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def step_worker(args):
    import torch

    mode = args.mode
    if mode != "plain":
        import vramswap
        import vramswap.torch

        vramswap.torch.enable()
        lock = lambda: vramswap.gpu_lock(0)  # noqa: E731
    else:
        import contextlib

        lock = contextlib.nullcontext
    torch.manual_seed(0)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    with lock():
        model = torch.nn.Sequential(*layers).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        x = torch.randn(args.batch, args.width, device="cuda")
    times = []
    for i in range(args.steps + 5):
        t0 = time.perf_counter()
        with lock():
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
        if i >= 5:  # warm-up: allocator caches, cuBLAS plans, first swaps
            times.append(time.perf_counter() - t0)
    out = {"mode": mode, "step_s": statistics.median(times)}
    if mode != "plain":
        s = vramswap.stats(0)
        out.update(bytes_in=s["bytes_in"], acquires=s["acquires"], allocated=s["allocated_bytes"], cached=s["cached_bytes"])
    if mode == "plain":
        # The pinned one-way copy rate, for the swapping row's transfer rate.
        n = 4 << 30
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        dev.copy_(host)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        out["pinned_gbps"] = 3 * n / (time.perf_counter() - t0) / 1e9
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        return step_worker(args)

    base = [sys.executable, os.path.abspath(__file__), "--steps", str(args.steps), "--width", str(args.width), "--depth",
            str(args.depth), "--batch", str(args.batch)]
    env = dict(os.environ, VRAMSWAP_BACKEND="cuda")
    env.setdefault("VRAMSWAP_POOL_SIZE", "32GiB")
    env.setdefault("VRAMSWAP_POOL_IDLE_EXIT", "3")
    env.pop("VRAMSWAP_TORCH", None)
    results = {}
    for mode, extra in (("plain", {}), ("vramswap", {}), ("swapping", {"VRAMSWAP_EAGER_RELEASE": "1"})):
        r = subprocess.run(base + ["--mode", mode], env=dict(env, **extra), capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"bench_torch: the {mode} run failed:\n{r.stderr[-3000:]}")
        results[mode] = json.loads(r.stdout.strip().splitlines()[-1])

    plain = results["plain"]["step_s"]
    import torch  # only for the device's name

    print(f"# bench_torch: {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}")
    print()
    print(f"MLP {args.depth} x {args.width}, batch {args.batch}, Adam, fp32; median of {args.steps} steps after 5 warm-up "
          f"steps; each configuration in its own process, one after the other.")
    print()
    print("| configuration | step p50 | ratio to PyTorch's allocator | moved in per step | its rate |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| PyTorch caching allocator, no lock | {plain * 1e3:.2f} ms | 1.00 | - | - |")
    v = results["vramswap"]
    print(f"| vramswap.torch + gpu_lock per step, alone | {v['step_s'] * 1e3:.2f} ms | {v['step_s'] / plain:.3f} | "
          f"{v['bytes_in'] / max(1, v['acquires']) / 2**20:.0f} MiB | - |")
    s = results["swapping"]
    per_step = s["bytes_in"] / max(1, s["acquires"])
    extra = s["step_s"] - plain
    rate = 2 * per_step / extra / 1e9 if extra > 0 else float("inf")
    print(f"| same, every release evicts all (VRAMSWAP_EAGER_RELEASE=1) | {s['step_s'] * 1e3:.2f} ms | "
          f"{s['step_s'] / plain:.2f} | {per_step / 2**30:.2f} GiB | {rate:.1f} GB/s out+in |")
    print()
    print(f"vramswap memory of the process: {v['allocated'] / 2**30:.2f} GiB allocated, of which "
          f"{v['cached'] / 2**30:.2f} GiB freed blocks kept for reuse; pinned one-way copy rate in the same run "
          f"(torch, 4 GiB): {results['plain']['pinned_gbps']:.1f} GB/s. The swapping row's rate is (bytes out + in) / "
          f"(its extra time per step over the first row).")


if __name__ == "__main__":
    main()
