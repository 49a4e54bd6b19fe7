"""Engines that allocate with the driver's VMM API, under the preload shim.

Run by scripts/device-run.sh (bench:vmm_engines), which sets VRAMSWAP_BUILD_DIR. Prints a
markdown report on stdout.

For each engine (an unmodified JAX training step: XLA's allocator; a torch.compile'd PyTorch
step with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), a model whose state (weights,
gradients, Adam's two moments) is 1.5x the pool:
  1. plain: the job alone in device memory (no shim): losses, step time, the driver's charge.
  2. shim: the same job under libvramswap_preload.so with VRAMSWAP_OVERSUBSCRIBE=1, while a
     lock user (examples/plain_cuda under the shim, normal priority: 3/4 of the pool, its
     words checked after every pass) comes every few seconds and takes its frames.
Reported per engine: whether every loss is bit-for-bit the plain run's, the driver's charge
to the job's process (nvidia-smi's per-process memory, the largest sample) with and without
the shim, the lock users' exits, the shim's warnings about memory past it, and the step
time against the plain step and against the floor: the plain step plus the state beyond the
pool crossing the link once per step, at the pinned copy rate measured in this run.

VMM_ENGINES=jax,torch picks engines; VMM_POOL_GIB (default 8) the pool; VMM_STEPS (12).
"""
import os
import re
import statistics
import subprocess
import sys
import threading
import time

BUILD = os.environ.get("VRAMSWAP_BUILD_DIR", "build/device")
PLAIN = os.path.join(BUILD, "examples", "vramswap_plain_cuda")
SHIM = os.path.join(BUILD, "libvramswap_preload.so")
GiB = 1 << 30
PREFIX = os.environ.get("VRAMSWAP_SHM_PREFIX", "vsvmm-")
POOL = int(float(os.environ.get("VMM_POOL_GIB", "8")) * GiB)
STEPS = int(os.environ.get("VMM_STEPS", "12"))

# The job: an MLP of `layers` square fp32 layers of `width`, Adam by hand (the same
# arithmetic in both engines' runs), a fixed batch. Prints one line per step:
# "step=<i> loss=<float.hex()> seconds=<s>", then "state_bytes=<n>".
JOB = r"""
import os, sys, time
engine, width, layers, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
batch = 512
if engine == "jax":
    import jax, jax.numpy as jnp
    key = jax.random.PRNGKey(0)
    keys = jax.random.split(key, layers + 2)
    params = [jax.random.normal(k, (width, width), jnp.float32) * (1.0 / width ** 0.5) for k in keys[:layers]]
    x = jax.random.normal(keys[-2], (batch, width), jnp.float32)
    y = jax.random.normal(keys[-1], (batch, width), jnp.float32)
    m = [jnp.zeros_like(p) for p in params]
    v = [jnp.zeros_like(p) for p in params]
    def loss_fn(ps):
        h = x
        for p in ps[:-1]:
            h = jax.nn.relu(h @ p)
        return jnp.mean((h @ ps[-1] - y) ** 2)
    def step(ps, m, v, t):
        loss, g = jax.value_and_grad(loss_fn)(ps)
        m = [0.9 * a + 0.1 * b for a, b in zip(m, g)]
        v = [0.999 * a + 0.001 * b * b for a, b in zip(v, g)]
        ps = [p - 1e-4 * (a / (1 - 0.9 ** t)) / (jnp.sqrt(b / (1 - 0.999 ** t)) + 1e-8) for p, a, b in zip(ps, m, v)]
        return loss, ps, m, v
    step = jax.jit(step, donate_argnums=(0, 1, 2))
    for i in range(steps):
        t0 = time.perf_counter()
        loss, params, m, v = step(params, m, v, float(i + 1))
        loss = float(loss)
        print(f"step={i} loss={loss.hex()} seconds={time.perf_counter() - t0:.4f}", flush=True)
else:
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(*[m for _ in range(layers - 1) for m in (torch.nn.Linear(width, width, bias=False), torch.nn.ReLU())],
                                torch.nn.Linear(width, width, bias=False)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, width, device="cuda")
    @torch.compile
    def forward_loss():
        return torch.nn.functional.mse_loss(model(x), y)
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = forward_loss()
        loss.backward()
        opt.step()
        loss = float(loss.item())
        print(f"step={i} loss={loss.hex()} seconds={time.perf_counter() - t0:.4f}", flush=True)
print(f"state_bytes={4 * 4 * width * width * layers}", flush=True)
"""

PINNED_RATE = r"""
import time, torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
d = torch.empty(n, dtype=torch.uint8, device="cuda")
best = 0.0
for _ in range(5):
    torch.cuda.synchronize(); t = time.perf_counter(); d.copy_(h, non_blocking=True); torch.cuda.synchronize()
    best = max(best, n / (time.perf_counter() - t) / 1e9)
print(f"h2d_gbps={best:.2f}")
"""


def environment(shim, extra):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.update({"VRAMSWAP_LOG": "info", "VRAMSWAP_POOL_IDLE_EXIT": "2", "VRAMSWAP_POOL_SIZE": str(POOL),
              "VRAMSWAP_SHM_PREFIX": PREFIX,
              # The same kernels in both runs: no autotuning by timing, deterministic reductions.
              "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_FLAGS": "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true",
              "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    if shim:
        e["LD_PRELOAD"] = SHIM
    e.update(extra)
    return e


def charged_mib(pid):
    """The driver's charge to `pid` now (nvidia-smi's per-process memory), MiB; 0 if not listed."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return int(parts[1])
    return 0


def run_job(engine, width, layers, shim, users):
    """One job run; returns losses, step times, the largest charge seen, the lock users' exits
    and the job's stderr."""
    env = environment(shim, {"VRAMSWAP_OVERSUBSCRIBE": "1"} if shim else {})
    job = subprocess.Popen([sys.executable, "-c", JOB, engine, str(width), str(layers), str(STEPS)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines, out_lines = [], []
    threads = [threading.Thread(target=lambda: err_lines.extend(job.stderr), daemon=True),
               threading.Thread(target=lambda: out_lines.extend(job.stdout), daemon=True)]
    for t in threads:
        t.start()
    peak, user_exits = 0, []
    last_user = time.monotonic()
    while job.poll() is None:
        peak = max(peak, charged_mib(job.pid))
        started = any(line.startswith("step=") for line in list(out_lines))
        if users and started and time.monotonic() - last_user > 3:
            u = subprocess.run([PLAIN, str(POOL * 3 // 4), "1"], env=environment(True, {}), capture_output=True, text=True, timeout=300)
            user_exits.append(u.returncode)
            if u.returncode != 0:
                sys.stderr.write(f"lock user exit {u.returncode}: {u.stdout}\n{u.stderr[-2000:]}\n")
            last_user = time.monotonic()
        time.sleep(0.5)
    for t in threads:
        t.join(timeout=30)
    out, err = "".join(out_lines), "".join(err_lines)
    if job.returncode != 0:
        said = "".join(line for line in err_lines if " warn: " in line or " error: " in line)
        sys.stderr.write(f"{engine} ({'shim' if shim else 'plain'}) exit {job.returncode}; vramswap's warnings:\n{said[-6000:]}\n"
                         f"the end of its stderr:\n{err[-3000:]}\n")
    losses = re.findall(r"loss=(\S+)", out)
    seconds = [float(s) for s in re.findall(r"seconds=([\d.]+)", out)]
    state = re.search(r"state_bytes=(\d+)", out)
    return {"rc": job.returncode, "losses": losses, "seconds": seconds, "peak_mib": peak, "users": user_exits, "err": err,
            "state": int(state.group(1)) if state else 0}


def main():
    rate = subprocess.run([sys.executable, "-c", PINNED_RATE], capture_output=True, text=True, env=environment(False, {}))
    m = re.search(r"h2d_gbps=([\d.]+)", rate.stdout)
    link = float(m.group(1)) if m else 0.0
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    print(f"# Engines on the VMM API under the shim ({gpu})\n")
    print(f"Pool {POOL / GiB:.0f} GiB; each job's state (weights, gradients, Adam's moments) 1.5x the pool; {STEPS} steps; "
          f"a lock user (plain_cuda, 3/4 of the pool) every ~3 s during the shim's run. Pinned copy rate in this run: "
          f"{link:.1f} GB/s host to device.\n")
    rows = []
    for engine in os.environ.get("VMM_ENGINES", "jax,torch").split(","):
        width = 8192
        layers = max(2, int(1.5 * POOL / (16 * width * width)))
        plain = run_job(engine, width, layers, shim=False, users=False)
        shim = run_job(engine, width, layers, shim=True, users=True)
        same = bool(plain["losses"]) and plain["losses"] == shim["losses"]
        steady = lambda r: statistics.median(r["seconds"][2:]) if len(r["seconds"]) > 3 else float("nan")
        beyond = max(0, plain["state"] - POOL)
        floor = steady(plain) + (beyond / (link * 1e9) if link else 0)
        warned = sorted(set(re.findall(r"device memory through (.+?), which vramswap does not virtualize", shim["err"])))
        exit_line = re.findall(r"preload: device \d+ at exit: [^\n]*", shim["err"])
        rows.append((engine, same, plain, shim, steady(plain), steady(shim), floor, warned, exit_line))
    print("| engine | losses bit-exact | driver charge, plain (MiB) | driver charge, shim (MiB) | step plain (s) | step shim (s) "
          "| shim / plain | shim / floor | lock users ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    for engine, same, plain, shim, sp, ss, floor, warned, _ in rows:
        ok_users = f"{sum(1 for u in shim['users'] if u == 0)}/{len(shim['users'])}"
        print(f"| {engine} | {'yes' if same else 'NO'} ({len(shim['losses'])}/{len(plain['losses'])} steps) | {plain['peak_mib']} "
              f"| {shim['peak_mib']} | {sp:.3f} | {ss:.3f} | {ss / sp:.2f} | {ss / floor:.2f} | {ok_users} |")
    print()
    for engine, same, plain, shim, sp, ss, floor, warned, exit_line in rows:
        print(f"- {engine}: exits plain {plain['rc']}, shim {shim['rc']}; state {plain['state'] / GiB:.1f} GiB; floor {floor:.3f} s; "
              f"shim warnings about memory past it: {', '.join(warned) if warned else 'none'}")
        for line in exit_line:
            print(f"  - `{line}`")
        if not same:
            print(f"  - losses plain {plain['losses'][:4]}, shim {shim['losses'][:4]}")
    sys.stdout.flush()
    return 0 if all(r[1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
