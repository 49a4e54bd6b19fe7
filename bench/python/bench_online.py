"""bench_online: many training jobs per GPU in the online-training pattern.

    python3 bench/python/bench_online.py [--jobs 3,5,8] [--state 16] [--period 15] [--periods 10]
                                         [--duty 0.15] [--pool-jobs 2]

Each job is its own process (vramswap.torch) holding --state GiB of model state: an MLP
with Adam (parameters, gradients and two moments: 16 bytes per parameter). Its batch
arrives every --period seconds (the jobs staggered evenly over the period); it then trains a
burst of steps under one gpu_lock() hold. The number of steps is chosen so that a burst's
compute takes --duty of the period (measured once, alone, before the run). The pool holds
--pool-jobs jobs' state, so the others' memory is in host memory and every turn moves it.

Per number of jobs, from the bursts of all jobs:
  latency   batch arrival to burst done, over the exclusive burst (its compute alone): p50
            and p95, in the first period and in the later ones (steady state);
  switch    from the lock's grant to the job's memory being back (restore, and the
            evictions it waits for), against the ideal: bytes brought in / the pinned
            copy rate measured in the same run;
  useful    the fraction of the wall time the GPU computed bursts, against the offered
            load (jobs x burst compute / period).
Needs PyTorch with CUDA, a GPU, and the vramswap package importable.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import switch_trace


def mlp(torch, state_gib, width):
    # 16 bytes of state per parameter (fp32 weights, gradients, Adam's two moments). Made on
    # the GPU: initialising a billion parameters on the CPU takes seconds per job, all of
    # them inside the first hold, which would serialize the jobs' start for a minute.
    params = int(state_gib * 2**30 / 16)
    depth = max(1, params // (width * width))
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width, device="cuda"), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def job(args):
    import torch
    import vramswap
    import vramswap.torch

    vramswap.torch.enable()
    torch.manual_seed(args.seed)
    with vramswap.gpu_lock(0):
        model = mlp(torch, args.state, args.width)
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        x = torch.randn(args.batch, args.width, device="cuda")

        def steps(n):
            for _ in range(n):
                loss = model(x).square().mean()
                opt.zero_grad(set_to_none=False)  # gradients stay: they are part of the state
                loss.backward()
                opt.step()
            return loss.item()

        steps(2)  # Adam's moments made, kernels loaded
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        steps(3)
        step_s = (time.perf_counter() - t0) / 3
    print(json.dumps({"ready": True, "step_s": step_s}), flush=True)
    start, count = (float(v) for v in sys.stdin.readline().split())
    count = int(count)
    bursts = []
    last = vramswap.stats(0)
    for k in range(args.periods):
        arrival = start + args.offset + k * args.period
        time.sleep(max(0.0, arrival - time.time()))
        before = vramswap.stats(0)
        with vramswap.gpu_lock(0):
            c0 = time.time()
            granted_ns = time.monotonic_ns()  # the trace's clock: its bring-in began before this
            steps(count)
            c1 = time.time()
        after = vramswap.stats(0)
        wait = after["lock_wait_seconds"] - before["lock_wait_seconds"]
        bursts.append({
            "job": args.seed, "period": k, "arrival": arrival, "compute_s": c1 - c0,
            "done": c1, "wait_s": wait, "granted_ns": granted_ns,
            "switch_s": (after["acquire_seconds"] - before["acquire_seconds"]) - wait,
            "bytes_in": after["bytes_in"] - before["bytes_in"], "bytes_out": after["bytes_out"] - before["bytes_out"],
            # Frames other jobs were asked to evict for this burst: ahead of it (since the last
            # burst ended, VRAMSWAP_EVICT_AHEAD) and at its acquire.
            "ahead": after.get("frames_asked_ahead", 0) - last.get("frames_asked_ahead", 0),
            "at_acquire": after.get("frames_asked_at_acquire", 0) - before.get("frames_asked_at_acquire", 0),
        })
        last = after
    print(json.dumps({"bursts": bursts}), flush=True)


def pinned_rate():
    import torch

    n = 4 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev.copy_(host)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    rate = 3 * n / (time.perf_counter() - t0) / 1e9
    del host, dev
    torch.cuda.empty_cache()
    return rate


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def run(args, n, rate):
    env = dict(os.environ, VRAMSWAP_BACKEND="cuda",
               VRAMSWAP_POOL_SIZE=f"{int(args.pool_jobs * args.state * 1024 + 2048)}MiB")
    env.setdefault("VRAMSWAP_POOL_IDLE_EXIT", "3")
    env.pop("VRAMSWAP_TORCH", None)
    procs = []
    for i in range(n):
        cmd = [sys.executable, os.path.abspath(__file__), "--job", "--seed", str(i), "--state", str(args.state), "--width",
               str(args.width), "--batch", str(args.batch), "--period", str(args.period), "--periods", str(args.periods),
               "--offset", str(i * args.period / n)]
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    steps = []
    for p in procs:
        line = p.stdout.readline()
        if not line:
            sys.exit(f"bench_online: a job of {n} exited before it was ready (exit {p.wait()})")
        steps.append(json.loads(line)["step_s"])
    # The burst: --duty of the period of compute, from the slowest job's step time alone.
    count = max(1, round(args.duty * args.period / max(steps)))
    start = time.time() + 2.0
    for p in procs:
        p.stdin.write(f"{start} {count}\n")
        p.stdin.flush()
    bursts = []
    with switch_trace.recording(env) as trace:
        for p in procs:
            out, _ = p.communicate()
            if p.returncode != 0:
                sys.exit(f"bench_online: a job of {n} failed (exit {p.returncode})")
            bursts += json.loads(out.strip().splitlines()[-1])["bursts"]
    exclusive = statistics.median(b["compute_s"] for b in bursts)
    wall = max(b["done"] for b in bursts) - start
    useful = sum(b["compute_s"] for b in bursts) / wall
    offered = n * exclusive / args.period
    rows = {}
    for name, sel in (("first period", [b for b in bursts if b["period"] == 0]),
                      ("later periods", [b for b in bursts if b["period"] > 0])):
        lat = [(b["done"] - b["arrival"]) / exclusive for b in sel]
        moved = [b for b in sel if b["bytes_in"] > 0]
        ideal = [b["bytes_in"] / (rate * 1e9) for b in moved]
        timed = [(b["switch_s"] / i, b) for b, i in zip(moved, ideal) if i > 0]
        ratio = [r for r, _ in timed]
        slowest = max(timed, key=lambda t: t[0], default=None)
        goal = [(exclusive + 1.5 * i) / exclusive for i in ideal] or [1.0]
        rows[name] = {
            "p50": pct(lat, 0.5), "p95": pct(lat, 0.95), "goal95": statistics.median(goal),
            "switch50": pct(ratio, 0.5), "switchmax": max(ratio) if ratio else float("nan"),
            "gib": statistics.mean(b["bytes_in"] for b in moved) / 2**30 if moved else 0.0,
            "switches": len(moved), "bursts": len(sel),
            "ahead": statistics.mean(b["ahead"] for b in moved) if moved else 0.0,
            "at_acquire": statistics.mean(b["at_acquire"] for b in moved) if moved else 0.0,
            "slowest": None if slowest is None else dict(slowest[1], ratio=slowest[0]),
        }
        if slowest is not None:
            b = slowest[1]
            rows[name]["slowest"]["trace"] = trace.breakdown(procs[b["job"]].pid, b["granted_ns"])
    jobs = {p.pid: f"job {i}" for i, p in enumerate(procs)}
    return {"n": n, "count": count, "exclusive": exclusive, "useful": useful, "offered": offered, "rows": rows,
            "wait_mean": statistics.mean(b["wait_s"] for b in bursts), "jobs": jobs, "trace_error": trace.error}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default="3,5,8")
    p.add_argument("--state", type=float, default=16.0, help="GiB of model state per job")
    p.add_argument("--period", type=float, default=15.0)
    p.add_argument("--periods", type=int, default=10)
    p.add_argument("--duty", type=float, default=0.15)
    p.add_argument("--pool-jobs", type=float, default=2.0, help="jobs' state the pool holds")
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--offset", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        return job(args)

    import torch

    rate = pinned_rate()
    results = [run(args, int(n), rate) for n in args.jobs.split(",")]
    print(f"# bench_online: {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}")
    print()
    print(f"Jobs of {args.state:g} GiB of state (MLP width {args.width}, Adam), a batch every {args.period:g} s "
          f"(staggered), a burst of compute of {args.duty:g} of the period under one lock hold, {args.periods} periods; "
          f"the pool holds {args.pool_jobs:g} jobs' state. Pinned host-to-device copy in the same run: {rate:.1f} GB/s. "
          f"Latency in units of the exclusive burst; switch = grant to memory back, over bytes in / the pinned rate.")
    print()
    print("| jobs | offered load | GPU useful | exclusive burst | periods | latency p50 | p95 | goal for p95 | "
          "GiB in per switch | switch / ideal p50 | max | frames asked ahead / at acquire per switch |")
    print("| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        for name, row in r["rows"].items():
            print(f"| {r['n']} | {r['offered']:.2f} | {r['useful']:.2f} | {r['exclusive']:.2f} s ({r['count']} steps) | "
                  f"{name} | {row['p50']:.2f} | {row['p95']:.2f} | {row['goal95']:.2f} | {row['gib']:.1f} | "
                  f"{row['switch50']:.2f} | {row['switchmax']:.2f} | {row['ahead']:.0f} / {row['at_acquire']:.0f} |")
    # Which switch was the slowest, for telling its cause: whether the job found the lock free
    # (waited 0) and how much of what it needed had been asked ahead.
    print()
    for r in results:
        for name, row in r["rows"].items():
            b = row["slowest"]
            if b is None:
                continue
            print(f"- {r['n']} jobs, {name}: the slowest switch, {b['ratio']:.2f} of its ideal, was job {b['job']}'s in "
                  f"period {b['period']}: {b['bytes_in'] / 2**30:.1f} GiB in, {b['switch_s'] * 1e3:.0f} ms from the grant, "
                  f"after {b['wait_s'] * 1e3:.0f} ms waiting for the lock; frames asked ahead {b['ahead']}, at the acquire "
                  f"{b['at_acquire']}")
            if b.get("trace"):
                print(f"  - from the trace: {switch_trace.describe(b['trace'], lambda pid: r['jobs'].get(pid, f'pid {pid}'))}")
            else:
                print(f"  - no breakdown: {r['trace_error'] or 'the trace holds no bring-in of that switch'}")


if __name__ == "__main__":
    main()
