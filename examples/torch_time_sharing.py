"""PyTorch online training, time-shared: several processes each train a real model on one GPU
whose memory cannot hold them all, taking turns under vramswap's lock, and each checks that
its losses equal, bit for bit, those of a solo run of the same seed with PyTorch's own
allocator and nobody else on the GPU.

    python3 examples/torch_time_sharing.py [--processes 3] [--gib 6] [--steps 12] [--pool-gib 9]

The launcher (this file without --worker) first runs one solo reference per seed (plain
PyTorch, no vramswap), then starts the time-sharing workers together, each with
VRAMSWAP_TORCH=1 so that every CUDA tensor lives in vramswap memory, and compares. A worker
takes the lock for each training step (and for building its model), so the others' memory is
swapped out to host memory while it runs and its own is brought back. Exit status 0 only if
every worker matched its reference exactly.

Needs PyTorch with CUDA and a GPU, and the vramswap package importable (pip install ., or
PYTHONPATH=<build>/python). --pool-gib sets VRAMSWAP_POOL_SIZE for a pool server started by
the first worker; pick it so that the processes' memory together exceeds it (the default
3 x 6 GiB against 9 GiB: twice the pool).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time


def build_model(torch, gib, seed):
    """An MLP whose parameters, gradients and Adam state take about `gib` GiB (fp32: 16 bytes
    per parameter), with a fixed-seed initialization."""
    depth = 6
    width = int(math.sqrt(gib * (1 << 30) / (16 * depth)) // 256 * 256)
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers), width


def worker(args):
    import torch

    if args.vramswap:
        import vramswap  # VRAMSWAP_TORCH=1 in the environment: enabled at import

        assert vramswap.torch.enabled(), "the launcher sets VRAMSWAP_TORCH=1"
        lock = lambda: vramswap.gpu_lock(0)  # noqa: E731
    else:
        import contextlib

        lock = contextlib.nullcontext
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model_cpu, width = build_model(torch, args.gib, args.seed)
    data = torch.Generator().manual_seed(args.seed + 1)
    teacher = torch.randn(width, 1, generator=data) / math.sqrt(width)
    # Under the lock: outside it, a tensor gets only free frames of the pool, and while the
    # other workers hold them model.cuda() would fail (saying to do this under the lock).
    # Under it, frames are taken from idle workers, whose memory is saved first.
    with lock():
        model = model_cpu.cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    del model_cpu
    losses, held = [], []
    for step in range(args.steps):
        x = torch.randn(args.batch, width, generator=data)  # online: a fresh batch each step
        y = x @ teacher
        t0 = time.monotonic()
        with lock():
            xb, yb = x.cuda(), y.cuda()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())  # synchronizes: the step is done before the lock goes
            del xb, yb, loss
        held.append(time.monotonic() - t0)
    out = {"seed": args.seed, "losses": [v.hex() for v in losses], "width": width, "lock_seconds": held}
    if args.vramswap:
        out["stats"] = vramswap.stats(0)
    print(json.dumps(out), flush=True)


def launch(args):
    here = os.path.abspath(__file__)
    base = [sys.executable, here, "--worker", "--gib", str(args.gib), "--steps", str(args.steps), "--batch", str(args.batch)]
    env = dict(os.environ)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    env.pop("VRAMSWAP_TORCH", None)

    print(f"{args.processes} processes x ~{args.gib} GiB (parameters, gradients, Adam state), "
          f"pool {args.pool_gib} GiB, {args.steps} steps each")
    refs = {}
    for i in range(args.processes):
        seed = 1000 + i
        t0 = time.monotonic()
        r = subprocess.run(base + ["--seed", str(seed)], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"solo reference for seed {seed} failed:\n{r.stderr}")
        refs[seed] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"  solo reference, seed {seed}: {time.monotonic() - t0:.1f} s")

    shared_env = dict(env, VRAMSWAP_TORCH="1", VRAMSWAP_BACKEND="cuda")
    shared_env.setdefault("VRAMSWAP_POOL_SIZE", f"{int(args.pool_gib * 1024)}MiB")
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(base + ["--vramswap", "--seed", str(1000 + i)], env=shared_env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for i in range(args.processes)
    ]
    results, failed = [], False
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            failed = True
            print(f"worker {p.pid} failed (exit {p.returncode}):\n{err}", file=sys.stderr)
            continue
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.monotonic() - t0

    print(f"time-shared run: {wall:.1f} s")
    print("| seed | model GiB | steps | losses equal to solo | first loss | last loss | acquires | GiB in | GiB out |")
    print("| ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: |")
    for r in sorted(results, key=lambda r: r["seed"]):
        ref = refs[r["seed"]]
        equal = r["losses"] == ref["losses"]
        failed |= not equal
        s = r["stats"]
        print(f"| {r['seed']} | {s['allocated_bytes'] / 2**30:.2f} | {len(r['losses'])} | {'yes' if equal else 'NO'} | "
              f"{float.fromhex(r['losses'][0]):.6g} | {float.fromhex(r['losses'][-1]):.6g} | {s['acquires']} | "
              f"{s['bytes_in'] / 2**30:.1f} | {s['bytes_out'] / 2**30:.1f} |")
        if not equal:
            for k, (a, b) in enumerate(zip(r["losses"], ref["losses"])):
                if a != b:
                    print(f"    seed {r['seed']} step {k}: {float.fromhex(a)!r} (shared) vs {float.fromhex(b)!r} (solo)")
                    break
    total = sum(r["stats"]["allocated_bytes"] for r in results) / 2**30
    print(f"memory of all processes together: {total:.1f} GiB = {total / args.pool_gib:.2f} x the pool")
    print("RESULT:", "FAIL" if failed or len(results) != args.processes else "PASS (bit-exact)")
    sys.exit(1 if failed or len(results) != args.processes else 0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--gib", type=float, default=6.0, help="model memory per process (parameters, gradients, Adam)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--pool-gib", type=float, default=9.0)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--vramswap", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
