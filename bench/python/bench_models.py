"""bench_models: real models' training steps through vramswap.torch against PyTorch's allocator.

    python3 bench/python/bench_models.py [--models llama,vision,compiled] [--steps 2000] [--warmup 50]
                                         [--pool 24GiB] [--rows plain,capped,vramswap] [--json FILE]
    python3 bench/python/bench_models.py --report FILE [FILE ...]   (the tables again, no GPU)

For each model, up to three processes (--rows), one after the other, on one GPU, each
training the same model from the same seed for --steps steps after --warmup steps:
  1. PyTorch's caching allocator, uncapped;
  2. PyTorch's caching allocator capped to the pool's size
     (torch.cuda.set_per_process_memory_fraction), so that it faces the pressure vramswap's
     pool puts on vramswap;
  3. vramswap.torch with a pool of --pool and gpu_lock() around every step, alone on the
     device (nothing has to move: what is measured is the allocator and the lock).
Reports step time p50 and p99 of each as a ratio to row 1 of the same run (so --rows must
name `plain` whenever it names another row: a ratio is measured side by side), and for row 3
where its time goes: per step, the time inside vramswap's allocator (malloc/free/trim, from
vramswap.stats()), taking and letting go of the lock, and the allocator's cache hits, misses
and trims. Then the tail: every row's slowest 1% of steps against its median steps (the
middle 10%), with what those steps had more of: for vramswap, the allocator's time, the
lock's, misses, trims, bytes newly taken from the pager and bytes moved in; for PyTorch's
rows, cudaMalloc calls and allocation retries. If PyTorch's own slowest steps are as much
slower than its median as vramswap's, the tail is the GPU's and PyTorch's, not vramswap's.

--interleave K runs a model's rows at once instead, taking turns of K steps on the GPU: on a
machine whose speed drifts over minutes (clocks, other tenants' load on the host), rows run
one after the other can differ by more than the allocator does, while turns spread the drift
over every row alike.

Rows of 2,000 Llama steps take about 4 minutes each: --rows plain,vramswap fits in one
10-minute call, --rows plain,capped in another; --json FILE keeps every step's numbers, and
--report prints the tables of several such files (each file's ratios are its own run's).

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
import tempfile
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


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


class Turns:
    """A worker's side of --interleave: it says when its model is built, then runs `every` steps
    each time the coordinator gives it the turn, and gives the turn back. Without turn pipes
    (rows one after the other) every call returns at once."""

    def __init__(self, fds, every):
        self.fds = tuple(int(x) for x in fds.split(",")) if fds else None
        self.every = every

    def _say(self):
        os.write(self.fds[1], b".")

    def ready(self):
        if self.fds:
            self._say()

    def before_step(self, i):
        if self.fds and i % self.every == 0:
            if os.read(self.fds[0], 1) != b".":
                raise SystemExit("bench_models: the coordinator went away")

    def after_step(self, i, total):
        if self.fds and ((i + 1) % self.every == 0 or i + 1 == total):
            self._say()


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

    # What a step did, from counters read between steps (outside the timed part).
    if mode == "vramswap":
        fields = ("allocator_seconds", "cache_hits", "cache_misses", "cache_trims", "cache_miss_bytes", "bytes_in",
                  "bytes_out", "lock_wait_seconds")

        def counters():
            s = vramswap.stats(0)
            return [s.get(f, 0) for f in fields]
    else:
        fields = ("num_device_alloc", "num_alloc_retries", "num_device_free")

        def counters():
            s = torch.cuda.memory_stats(0)
            return [s.get(f, 0) for f in fields]

    per_step = {k: [] for k in ("time", "enter", "body", "leave") + fields}
    turns = Turns(args.turn_fds, args.interleave)
    turns.ready()
    last = None
    for i in range(args.warmup + args.steps):
        turns.before_step(i)
        if i == args.warmup:
            last = counters()
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
            now = counters()
            per_step["time"].append(t3 - t0)
            per_step["enter"].append(t1 - t0)
            per_step["body"].append(t2 - t1)
            per_step["leave"].append(t3 - t2)
            for f, a, b in zip(fields, last, now):
                per_step[f].append(b - a)
            last = now
        turns.after_step(i, args.warmup + args.steps)
    times = sorted(per_step["time"])
    n = len(times)
    out = {
        "model": args.model,
        "mode": mode,
        "p50": percentile(times, 0.5),
        "p99": percentile(times, 0.99),
        "min": times[0],
        "steps": n,
        "enter": sum(per_step["enter"]) / n,
        "leave": sum(per_step["leave"]) / n,
        "params": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "per_step": per_step,
        "interleave": args.interleave,
    }
    if mode == "vramswap":
        after = vramswap.stats(0)
        out.update(
            allocator_s=sum(per_step["allocator_seconds"]) / n,
            hits=sum(per_step["cache_hits"]) / n,
            misses=sum(per_step["cache_misses"]) / n,
            trims=sum(per_step["cache_trims"]) / n,
            bytes_in=sum(per_step["bytes_in"]) / n,
            allocated=after["allocated_bytes"],
            cached=after["cached_bytes"],
        )
    else:
        out["peak"] = torch.cuda.max_memory_reserved(0)
    print(json.dumps(out), flush=True)


NAMES = {"plain": "PyTorch's allocator", "capped": "PyTorch's allocator, capped to the pool",
         "vramswap": "vramswap.torch + gpu_lock per step"}
ROW_ALIASES = {"pytorch": "plain", "plain": "plain", "capped": "capped", "vramswap": "vramswap"}


def parse_rows(text):
    rows = []
    for word in text.split(","):
        word = word.strip()
        if word not in ROW_ALIASES:
            raise SystemExit(f"bench_models: unknown row {word!r} in --rows: use plain (or pytorch), capped, vramswap")
        if ROW_ALIASES[word] not in rows:
            rows.append(ROW_ALIASES[word])
    if not rows:
        raise SystemExit("bench_models: --rows names no row")
    if "plain" not in rows and len(rows) > 0:
        raise SystemExit("bench_models: --rows must include plain (PyTorch's allocator, uncapped): every ratio is to "
                         "the plain row of the same run, measured side by side")
    # The baseline first, so that a run cut short still has it.
    return ["plain"] + [r for r in ("capped", "vramswap") if r in rows]


def tail_split(per_step):
    """Indices of the median steps (the middle 10% by step time) and of the slowest 1%."""
    order = sorted(range(len(per_step["time"])), key=lambda i: per_step["time"][i])
    n = len(order)
    mid = order[int(n * 0.45): max(int(n * 0.45) + 1, int(n * 0.55))]
    slow = order[min(n - 1, int(n * 0.99)):]
    return mid, slow


def mean_of(values, idx):
    return sum(values[i] for i in idx) / len(idx) if idx else 0.0


def report(runs):
    """The tables for a list of runs (each a list of row dicts, ratios within its run)."""
    first = next((r for rows in runs for r in rows if "device" in r), None)
    if first:
        print(f"# bench_models: {first['device']}, PyTorch {first['torch']}")
        print()
    for k, rows in enumerate(runs):
        done = [r for r in rows if "failed" not in r]
        if done:
            r0 = done[0]
            how = (f"all rows at once, taking turns of {r0['interleave']} steps on the GPU" if r0.get("interleave")
                   else "one after the other")
            print(f"Run {k + 1}: {r0['steps']} steps per row after the warm-up; each row in its own process, {how}; "
                  f"rows: {', '.join(r['mode'] for r in rows)}.")
    print()
    print("| run | model | configuration | steps | step p50 | p99 | fastest | p50 / PyTorch | p99 / PyTorch | memory |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, rows in enumerate(runs):
        base = {}
        for r in rows:
            if "failed" in r:
                print(f"| {k + 1} | {r['model']} | {NAMES[r['mode']]} | | failed: {' '.join(r['failed'])[:120]} | | | | | |")
                continue
            if r["mode"] == "plain":
                base[r["model"]] = r
            b = base.get(r["model"])
            mem = r.get("peak", r.get("allocated", 0)) / 2**30
            ratio50 = f"{r['p50'] / b['p50']:.3f}" if b else "-"
            ratio99 = f"{r['p99'] / b['p99']:.3f}" if b else "-"
            print(f"| {k + 1} | {r['model']} ({r['params'] / 1e9:.2f} B params) | {NAMES[r['mode']]} | {r['steps']} | "
                  f"{r['p50'] * 1e3:.2f} ms | {r['p99'] * 1e3:.2f} ms | {r['min'] * 1e3:.2f} ms | {ratio50} | {ratio99} | "
                  f"{mem:.1f} GiB |")
    print()
    print("Memory: PyTorch's peak reserved bytes; vramswap's allocated bytes at the end (freed blocks kept for reuse "
          "included).")
    print()
    print("Where vramswap's step time goes, per step (means):")
    print()
    print("| run | model | p50 - PyTorch p50 | in the allocator | allocations | taking the lock | letting it go | misses | "
          "trims | moved in |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, rows in enumerate(runs):
        base = {r["model"]: r for r in rows if r.get("mode") == "plain" and "failed" not in r}
        for r in rows:
            if r.get("mode") != "vramswap" or "failed" in r or r["model"] not in base:
                continue
            b = base[r["model"]]
            allocs = r["hits"] + r["misses"]
            print(f"| {k + 1} | {r['model']} | {(r['p50'] - b['p50']) * 1e3:.2f} ms | {r['allocator_s'] * 1e3:.2f} ms | "
                  f"{allocs:.0f} | {r['enter'] * 1e3:.3f} ms | {r['leave'] * 1e3:.3f} ms | {r['misses']:.2f} | "
                  f"{r['trims']:.2f} | {r['bytes_in'] / 2**20:.0f} MiB |")
    print()
    print("The tail: each row's slowest 1% of steps against its median steps (the middle 10% by step time), means "
          "per step. `excess` is the slow steps' time over the median's; `of which vramswap` the part of it the "
          "allocator and the lock account for; the rest is the GPU's and PyTorch's own (compare PyTorch's rows).")
    print()
    print("| run | model | configuration | steps (slow) | median step | slow step | excess | of which vramswap | "
          "step body | allocator | lock in + out | misses | trims | new segments | moved in | cudaMalloc | retries |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
    for k, rows in enumerate(runs):
        for r in rows:
            ps = r.get("per_step")
            if "failed" in r or not ps or not ps.get("time"):
                continue
            mid, slow = tail_split(ps)
            t_mid, t_slow = mean_of(ps["time"], mid), mean_of(ps["time"], slow)
            pair = lambda key, f=ms: f"{f(mean_of(ps[key], mid))} / {f(mean_of(ps[key], slow))}"  # noqa: E731
            cells = [pair("body")]
            if r["mode"] == "vramswap":
                lock_mid = mean_of(ps["enter"], mid) + mean_of(ps["leave"], mid)
                lock_slow = mean_of(ps["enter"], slow) + mean_of(ps["leave"], slow)
                alloc_mid, alloc_slow = mean_of(ps["allocator_seconds"], mid), mean_of(ps["allocator_seconds"], slow)
                ours = (alloc_slow - alloc_mid) + (lock_slow - lock_mid)
                count = lambda v: f"{v:.2f}"  # noqa: E731
                mib = lambda v: f"{v / 2**20:.0f} MiB"  # noqa: E731
                cells += [pair("allocator_seconds"), f"{ms(lock_mid)} / {ms(lock_slow)}", pair("cache_misses", count),
                          pair("cache_trims", count), pair("cache_miss_bytes", mib), pair("bytes_in", mib), "", ""]
                ours_cell = f"{ms(ours)} ms"
            else:
                count = lambda v: f"{v:.2f}"  # noqa: E731
                cells += ["", "", "", "", "", "", pair("num_device_alloc", count), pair("num_alloc_retries", count)]
                ours_cell = ""
            print(f"| {k + 1} | {r['model']} | {NAMES[r['mode']]} | {len(ps['time'])} ({len(slow)}) | {ms(t_mid)} ms | "
                  f"{ms(t_slow)} ms | {ms(t_slow - t_mid)} ms | {ours_cell} | " + " | ".join(cells) + " |")
    print()
    print("Cells `a / b`: the median steps' mean, then the slow steps' (ms unless said).")


def run_interleaved(model, modes, command, env, args):
    """--interleave K: one process per row, all at once; each builds its model, then they take
    turns of K steps (warm-up included) on the GPU, one at a time, so that a drift of the
    machine's speed over the run (clocks, the host's other load) falls on every row alike
    instead of on whichever row ran during it. Yields (mode, exit status, stdout, stderr, wall)."""
    procs = []
    for mode in modes:
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        p = subprocess.Popen(command(model, mode) + ["--turn-fds", f"{go_r},{done_w}"], env=env, stdout=out, stderr=err,
                             text=True, pass_fds=(go_r, done_w))
        os.close(go_r)
        os.close(done_w)
        procs.append({"mode": mode, "proc": p, "go": go_w, "done": done_r, "out": out, "err": err, "alive": True})
    t0 = time.time()

    def wait_for(w):
        if w["alive"] and os.read(w["done"], 1) != b".":
            w["alive"] = False  # it failed (its exit status and stderr say why); the others go on

    for w in procs:
        wait_for(w)  # its model built
    turns = -(-(args.warmup + args.steps) // args.interleave)
    for _ in range(turns):
        for w in procs:
            if not w["alive"]:
                continue
            try:
                os.write(w["go"], b".")
            except BrokenPipeError:
                w["alive"] = False
                continue
            wait_for(w)
    for w in procs:
        os.close(w["go"])
        w["proc"].wait()
        os.close(w["done"])
        w["out"].seek(0)
        w["err"].seek(0)
        yield w["mode"], w["proc"].returncode, w["out"].read(), w["err"].read(), time.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama,vision,compiled")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--pool", default="24GiB")
    p.add_argument("--rows", default="plain,capped,vramswap",
                   help="which configurations to run, in one process each: plain (or pytorch), capped, vramswap; "
                        "plain is always run, as the baseline of the ratios")
    p.add_argument("--json", help="also write every row, its per-step numbers included, to this file")
    p.add_argument("--report", nargs="+", metavar="FILE", help="print the tables of --json files (one run each); no GPU")
    p.add_argument("--interleave", type=int, default=0, metavar="K",
                   help="run a model's rows at once, taking turns of K steps on the GPU (0: one row after the other)")
    p.add_argument("--turn-fds", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        return worker(args)
    if args.report:
        runs = []
        for path in args.report:
            with open(path) as f:
                runs.append(json.load(f)["rows"])
        return report(runs)
    modes = parse_rows(args.rows)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in ("llama", "vision", "compiled"):
            raise SystemExit(f"bench_models: unknown model {m!r}: use llama, vision or compiled")
    if args.steps < 1 or args.warmup < 1:
        raise SystemExit("bench_models: --steps and --warmup must be at least 1")
    if args.interleave < 0:
        raise SystemExit("bench_models: --interleave must be 0 (rows one after the other) or a number of steps per turn")

    env = dict(os.environ, VRAMSWAP_BACKEND="cuda", VRAMSWAP_POOL_SIZE=args.pool)
    env.setdefault("VRAMSWAP_POOL_IDLE_EXIT", "3")
    env.pop("VRAMSWAP_TORCH", None)
    rows = []

    def command(model, mode):
        return [sys.executable, os.path.abspath(__file__), "--mode", mode, "--model", model, "--steps", str(args.steps),
                "--warmup", str(args.warmup), "--pool", args.pool, "--interleave", str(args.interleave)]

    def keep(model, mode, rc, stdout, stderr, wall):
        if rc != 0:
            print(f"bench_models: {model} / {mode} failed (exit {rc}):\n{stderr[-4000:]}", file=sys.stderr)
            rows.append({"model": model, "mode": mode, "failed": stderr.strip().splitlines()[-1:]})
            return
        row = json.loads(stdout.strip().splitlines()[-1])
        row["wall"] = wall
        rows.append(row)
        print(f"bench_models: {model} / {mode}: p50 {row['p50'] * 1e3:.2f} ms in {row['wall']:.0f} s", file=sys.stderr,
              flush=True)
        if args.json:  # after every row, so that a run cut short keeps what it did
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "rows": rows}, f)

    for model in models:
        if args.interleave:
            for mode, rc, out, err, wall in run_interleaved(model, modes, command, env, args):
                keep(model, mode, rc, out, err, wall)
            continue
        for mode in modes:
            t0 = time.time()
            r = subprocess.run(command(model, mode), env=env, capture_output=True, text=True)
            keep(model, mode, r.returncode, r.stdout, r.stderr, time.time() - t0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f)
    report([rows])


if __name__ == "__main__":
    main()
