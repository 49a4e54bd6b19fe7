"""bench_models: real models' training steps through vramswap.torch against PyTorch's allocator.

    python3 bench/python/bench_models.py [--models llama,vision,compiled] [--steps 2000] [--warmup 50]
                                         [--pool 24GiB]

For each model, three processes, one after the other, on one GPU, each training the same
model from the same seed for --steps steps after --warmup steps:
  1. PyTorch's caching allocator, uncapped;
  2. PyTorch's caching allocator capped to the pool's size
     (torch.cuda.set_per_process_memory_fraction), so that it faces the pressure vramswap's
     pool puts on vramswap;
  3. vramswap.torch with a pool of --pool and gpu_lock() around every step, alone on the
     device (nothing has to move: what is measured is the allocator and the lock).
Reports step time p50 and p99 of each as a ratio to row 1, and for row 3 where its time goes:
per step, the time inside vramswap's allocator (malloc/free/trim, from vramswap.stats()),
taking and letting go of the lock, and the allocator's cache hits, misses and trims.

Models (no weights are downloaded; every model is built from a config and a seed):
  llama     a Llama-architecture causal LM from transformers (about 1.1 B parameters:
            hidden 2048, 22 layers, 32 heads, 4 KV heads, MLP 5632, vocab 32000), AdamW,
            fp32 weights and optimizer state, bf16 autocast, batch 2 x sequence 512 (about 20 GiB);
  vision    torchvision's ResNet-50, SGD with momentum, bf16 autocast, batch 128 at 224 px,
            channels-last;
  compiled  the vision model under torch.compile (default mode).
Needs PyTorch with CUDA, transformers and torchvision, a GPU, and the vramswap package
importable (PYTHONPATH=<build>/python).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * scale)
    return int(text)


def build(name, torch):
    """The model, its optimizer and one step's inputs, made on the GPU from seed 0."""
    torch.manual_seed(0)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                             num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        ids = torch.randint(0, config.vocab_size, (2, 512), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return model, step
    if name in ("vision", "compiled"):
        import torchvision

        model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        x = torch.randn(128, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (128,), device="cuda")
        forward = torch.compile(model) if name == "compiled" else model

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(forward(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return model, step
    raise SystemExit(f"bench_models: unknown model {name!r}: use llama, vision or compiled")


def worker(args):
    import torch

    mode = args.mode
    pool = parse_size(args.pool)
    if mode == "vramswap":
        import vramswap
        import vramswap.torch

        vramswap.torch.enable()
        lock = lambda: vramswap.gpu_lock(0)  # noqa: E731
    else:
        lock = contextlib.nullcontext
        if mode == "capped":
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(pool / total, 0)
    with lock():
        model, step = build(args.model, torch)
        torch.cuda.synchronize()
    times, enter, leave = [], [], []
    before = None
    for i in range(args.warmup + args.steps):
        if i == args.warmup and mode == "vramswap":
            before = vramswap.stats(0)
        t0 = time.perf_counter()
        cm = lock()
        cm.__enter__()
        t1 = time.perf_counter()
        loss = step()
        loss.item()  # the step's end: its kernels done
        t2 = time.perf_counter()
        cm.__exit__(None, None, None)
        t3 = time.perf_counter()
        if i >= args.warmup:
            times.append(t3 - t0)
            enter.append(t1 - t0)
            leave.append(t3 - t2)
    times.sort()
    out = {
        "model": args.model,
        "mode": mode,
        "p50": times[len(times) // 2],
        "p99": times[min(len(times) - 1, int(len(times) * 0.99))],
        "min": times[0],
        "steps": len(times),
        "enter": sum(enter) / len(enter),
        "leave": sum(leave) / len(leave),
        "params": sum(p.numel() for p in model.parameters()),
    }
    if mode == "vramswap":
        after = vramswap.stats(0)
        n = len(times)
        out.update(
            allocator_s=(after["allocator_seconds"] - before["allocator_seconds"]) / n,
            hits=(after["cache_hits"] - before["cache_hits"]) / n,
            misses=(after["cache_misses"] - before["cache_misses"]) / n,
            trims=(after["cache_trims"] - before["cache_trims"]) / n,
            bytes_in=(after["bytes_in"] - before["bytes_in"]) / n,
            allocated=after["allocated_bytes"],
            cached=after["cached_bytes"],
        )
    else:
        out["peak"] = torch.cuda.max_memory_reserved(0)
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama,vision,compiled")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--pool", default="24GiB")
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        return worker(args)

    env = dict(os.environ, VRAMSWAP_BACKEND="cuda", VRAMSWAP_POOL_SIZE=args.pool)
    env.setdefault("VRAMSWAP_POOL_IDLE_EXIT", "3")
    env.pop("VRAMSWAP_TORCH", None)
    rows = []
    for model in args.models.split(","):
        for mode in ("plain", "capped", "vramswap"):
            cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--model", model, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--pool", args.pool]
            t0 = time.time()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"bench_models: {model} / {mode} failed (exit {r.returncode}):\n{r.stderr[-4000:]}", file=sys.stderr)
                rows.append({"model": model, "mode": mode, "failed": r.stderr.strip().splitlines()[-1:]})
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row["wall"] = time.time() - t0
            rows.append(row)
            print(f"bench_models: {model} / {mode}: p50 {row['p50'] * 1e3:.2f} ms in {row['wall']:.0f} s", file=sys.stderr)

    import torch

    print(f"# bench_models: {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}")
    print()
    print(f"{args.steps} steps after {args.warmup} warm-up steps per row; each row in its own process, one after the "
          f"other; vramswap's pool {args.pool}, PyTorch capped to the same size in the capped row.")
    print()
    print("| model | configuration | step p50 | p99 | fastest | p50 / PyTorch | p99 / PyTorch | memory |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = {"plain": "PyTorch's allocator", "capped": "PyTorch's allocator, capped to the pool",
             "vramswap": "vramswap.torch + gpu_lock per step"}
    base = {}
    for r in rows:
        if "failed" in r:
            print(f"| {r['model']} | {names[r['mode']]} | failed: {' '.join(r['failed'])[:120]} | | | | | |")
            continue
        if r["mode"] == "plain":
            base[r["model"]] = r
        b = base.get(r["model"])
        mem = r.get("peak", r.get("allocated", 0)) / 2**30
        ratio50 = f"{r['p50'] / b['p50']:.3f}" if b else "-"
        ratio99 = f"{r['p99'] / b['p99']:.3f}" if b else "-"
        print(f"| {r['model']} ({r['params'] / 1e9:.2f} B params) | {names[r['mode']]} | {r['p50'] * 1e3:.2f} ms | "
              f"{r['p99'] * 1e3:.2f} ms | {r['min'] * 1e3:.2f} ms | {ratio50} | {ratio99} | {mem:.1f} GiB |")
    print()
    print("Memory: PyTorch's peak reserved bytes; vramswap's allocated bytes at the end (freed blocks kept for reuse "
          "included).")
    print()
    print("Where vramswap's step time goes, per step (means):")
    print()
    print("| model | p50 - PyTorch p50 | in the allocator | taking the lock | letting it go | cache hits | misses | trims | "
          "moved in |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r.get("mode") != "vramswap" or "failed" in r or r["model"] not in base:
            continue
        b = base[r["model"]]
        print(f"| {r['model']} | {(r['p50'] - b['p50']) * 1e3:.2f} ms | {r['allocator_s'] * 1e3:.2f} ms | "
              f"{r['enter'] * 1e3:.3f} ms | {r['leave'] * 1e3:.3f} ms | {r['hits']:.0f} | {r['misses']:.1f} | "
              f"{r['trims']:.2f} | {r['bytes_in'] / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
