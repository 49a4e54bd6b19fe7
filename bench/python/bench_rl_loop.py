"""An RL-shaped loop on one GPU: a bf16 generator with a KV pool and an fp32 AdamW trainer,
each more than half the pool, taking turns by sleep and wake (vramswap.torch_memory_saver),
against the same loop with both in device memory.

Run by scripts/device-run.sh (bench:rl_loop). Prints a markdown report on stdout.

Two processes, driven over their stdin by this script, RL_ITERS (default 20) iterations:
  generator: weights (RL_GEN_LAYERS square bf16 layers of 8192, in region("weights",
    enable_cpu_backup=True)) and a KV pool (RL_KV_GIB, region("kv_cache"): discarded on
    pause); each iteration wakes, generates 64 tokens for a batch of 8 (greedy), writing each
    step's hidden state into the KV pool, reports the tokens, and sleeps.
  trainer: an fp32 MLP (RL_TRAIN_LAYERS layers of 8192) with torch.optim.AdamW, parameters
    and optimizer state in region("train", enable_cpu_backup=True); each iteration wakes,
    makes one step on a batch drawn from the iteration's seed, reports the loss (float.hex),
    and sleeps.
The shared run: VRAMSWAP_POOL_SIZE=RL_POOL_GIB (default 30), both under vramswap. The plain run:
the same two processes with PyTorch's own allocator, both resident, no sleep. Reported: the
tokens and losses bit for bit against the plain run's, each iteration's time split into the
compute (generate, train step) and the switching (pause and resume calls), the share of each
iteration spent switching, and the bytes that had to cross.
"""
import json
import os
import statistics
import subprocess
import sys
import time

GiB = 1 << 30
ITERS = int(os.environ.get("RL_ITERS", "20"))
POOL_GIB = int(os.environ.get("RL_POOL_GIB", "30"))
GEN_LAYERS = int(os.environ.get("RL_GEN_LAYERS", "96"))     # 96 x 128 MiB = 12 GiB of bf16
KV_GIB = float(os.environ.get("RL_KV_GIB", "4"))
TRAIN_LAYERS = int(os.environ.get("RL_TRAIN_LAYERS", "17"))  # 17 x 256 MiB params, x4 with grads and moments

WORKER = r"""
import json, os, sys, time
role, shared = sys.argv[1], sys.argv[2] == "shared"
if shared:
    from vramswap.torch_memory_saver import torch_memory_saver as tms
import contextlib
import torch
torch.backends.cuda.matmul.allow_tf32 = False
d = 8192
def region(tag, backup):
    return tms.region(tag=tag, enable_cpu_backup=backup) if shared else contextlib.nullcontext()
def say(**kw):
    print(json.dumps(kw), flush=True)
g = torch.Generator(device="cuda").manual_seed(7 if role == "gen" else 11)
if role == "gen":
    layers, kv_gib = int(sys.argv[3]), float(sys.argv[4])
    with region("weights", True):
        ws = [(torch.randn(d, d, generator=g, device="cuda") / d ** 0.5).to(torch.bfloat16) for _ in range(layers)]
        emb = torch.randn(32000, d, generator=g, device="cuda").to(torch.bfloat16)
    with region("kv_cache", False):
        kv = torch.empty(int(kv_gib * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
    def work(i):
        tok = torch.arange(8, device="cuda") * 1000 + i
        out = []
        per_step = 8 * d
        for t in range(64):
            h = emb[tok]
            for w in ws:
                h = torch.tanh(h @ w)
            kv[(t * per_step) % (kv.numel() - per_step):][:per_step].copy_(h.reshape(-1))
            tok = (h @ emb.T).argmax(dim=-1)
            out.append(tok)
        return {"tokens": torch.stack(out).cpu().tolist()}
else:
    layers = int(sys.argv[3])
    with region("train", True):
        params = [torch.nn.Parameter(torch.randn(d, d, generator=g, device="cuda") / d ** 0.5) for _ in range(layers)]
        opt = torch.optim.AdamW(params, lr=1e-4)
    def work(i):
        gi = torch.Generator(device="cuda").manual_seed(1000 + i)
        x = torch.randn(2048, d, generator=gi, device="cuda")
        y = torch.randn(2048, d, generator=gi, device="cuda")
        with region("train", True):
            h = x
            for p in params[:-1]:
                h = torch.relu(h @ p)
            loss = torch.mean((h @ params[-1] - y) ** 2)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return {"loss": float(loss.item()).hex()}
torch.cuda.synchronize()
if shared:
    tms.pause()
    torch.cuda.synchronize()
say(ready=True)
for line in sys.stdin:
    i = int(line)
    if i < 0:
        break
    t0 = time.perf_counter()
    if shared:
        tms.resume()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    r = work(i)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    if shared:
        tms.pause()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    say(resume_s=t1 - t0, work_s=t2 - t1, pause_s=t3 - t2, **r)
"""


def start(role, shared, env):
    args = [str(GEN_LAYERS), str(KV_GIB)] if role == "gen" else [str(TRAIN_LAYERS)]
    p = subprocess.Popen([sys.executable, "-c", WORKER, role, "shared" if shared else "plain", *args], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("{"):
        p.kill()
        raise RuntimeError(f"{role} did not start: {p.stderr.read()[-2000:]}")
    return p


def ask(p, i):
    p.stdin.write(f"{i}\n")
    p.stdin.flush()
    line = p.stdout.readline()
    if not line.startswith("{"):
        raise RuntimeError(f"worker failed at iteration {i}: {p.stderr.read()[-2000:]}")
    return json.loads(line)


def loop(shared):
    env = dict(os.environ)
    env.pop("VRAMSWAP_TORCH", None)
    if shared:
        env.update(VRAMSWAP_POOL_SIZE=f"{POOL_GIB}GiB", VRAMSWAP_SHM_PREFIX=f"vsrl{os.getpid()}-", VRAMSWAP_POOL_IDLE_EXIT="2",
                   VRAMSWAP_LOG="warn")
    gen = start("gen", shared, env)
    trainer = start("train", shared, env)
    rows = []
    t_loop = time.perf_counter()
    try:
        for i in range(ITERS):
            t0 = time.perf_counter()
            a = ask(gen, i)
            b = ask(trainer, i)
            rows.append({"gen": a, "train": b, "iter_s": time.perf_counter() - t0})
    finally:
        for p in (gen, trainer):
            try:
                p.stdin.write("-1\n")
                p.stdin.flush()
            except BrokenPipeError:
                pass
            p.wait(timeout=120)
    return rows, time.perf_counter() - t_loop


def main():
    import torch

    name = torch.cuda.get_device_name(0)
    plain, plain_total = loop(False)
    shared, shared_total = loop(True)
    tokens_ok = all(p["gen"]["tokens"] == s["gen"]["tokens"] for p, s in zip(plain, shared))
    losses_ok = all(p["train"]["loss"] == s["train"]["loss"] for p, s in zip(plain, shared))
    gen_bytes = GEN_LAYERS * 8192 * 8192 * 2 + 32000 * 8192 * 2
    kv_bytes = int(KV_GIB * GiB)
    train_bytes = TRAIN_LAYERS * 8192 * 8192 * 4 * 4
    print(f"# RL-shaped loop: generator and trainer taking turns by sleep and wake ({name})\n")
    print(f"Pool {POOL_GIB} GiB. Generator: {gen_bytes / GiB:.1f} GiB of bf16 weights (offloaded on pause) + a {KV_GIB:g} GiB KV "
          f"pool (discarded); trainer: {train_bytes / GiB:.1f} GiB of fp32 parameters, gradients and AdamW moments (offloaded). "
          f"{ITERS} iterations; plain: both in device memory with PyTorch's allocator, no sleep.\n")
    print(f"- generated tokens bit-exact vs plain: {'yes' if tokens_ok else 'NO'} ({ITERS} iterations x 64 tokens x 8)")
    print(f"- trainer losses bit-exact vs plain: {'yes' if losses_ok else 'NO'} (first {shared[0]['train']['loss']}, last "
          f"{shared[-1]['train']['loss']})\n")
    print("| iteration | gen resume s | gen work s | gen pause s | train resume s | train work s | train pause s | iteration s | "
          "switching share | plain iteration s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    shares = []
    for i, (s, p) in enumerate(zip(shared, plain)):
        sw = s["gen"]["resume_s"] + s["gen"]["pause_s"] + s["train"]["resume_s"] + s["train"]["pause_s"]
        share = sw / s["iter_s"]
        if i > 0:
            shares.append(share)
        if i < 3 or i == len(shared) - 1:
            print(f"| {i + 1} | {s['gen']['resume_s']:.3f} | {s['gen']['work_s']:.3f} | {s['gen']['pause_s']:.3f} | "
                  f"{s['train']['resume_s']:.3f} | {s['train']['work_s']:.3f} | {s['train']['pause_s']:.3f} | {s['iter_s']:.3f} | "
                  f"{share:.2f} | {p['iter_s']:.3f} |")
    def med(key, part):
        return statistics.median(r[key][part] for r in shared[1:])
    moved = 2 * gen_bytes + 2 * train_bytes
    switch = med("gen", "resume_s") + med("gen", "pause_s") + med("train", "resume_s") + med("train", "pause_s")
    print()
    print(f"- switching share of the iteration (median of iterations 2..{ITERS}): {statistics.median(shares):.2f}; first iteration "
          f"{(shared[0]['gen']['resume_s'] + shared[0]['gen']['pause_s'] + shared[0]['train']['resume_s'] + shared[0]['train']['pause_s']) / shared[0]['iter_s']:.2f}")
    print(f"- bytes crossing the link per iteration: {moved / GiB:.1f} GiB (each side's offloaded state out and in); at the "
          f"median switching time that is {moved / switch / 1e9:.1f} GB/s")
    print(f"- loop time: shared {shared_total:.1f} s, plain {plain_total:.1f} s ({shared_total / plain_total:.2f}x)")
    return 0 if tokens_ok and losses_ok else 1


if __name__ == "__main__":
    sys.exit(main())
