"""vramswap.torch on a real GPU: PyTorch's CUDA memory routed through vramswap survives being
swapped out and back at every step, for a plain model, a torch.compile'd one and a CUDA-graph-
captured training step, with losses bit-identical to PyTorch's own allocator; and the time-
sharing example with several processes. Skipped, saying why, where PyTorch or a GPU is missing
(CI has neither).

Each workload runs in a process of its own (tests/python/torch_checks.py): PyTorch's allocator
can be chosen only before CUDA starts, and these use the cuda backend while the rest of the
suite uses the host one.
"""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the vramswap.torch tests need it and a GPU")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no CUDA GPU: the vramswap.torch tests need one", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKS = os.path.join(HERE, "torch_checks.py")
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torch_time_sharing.py")


def gpu_env(deployment, **extra):
    """The test's private deployment (prefix, runtime dir) on the cuda backend."""
    env = dict(os.environ)
    env.update(deployment)
    env.update(
        VRAMSWAP_BACKEND="cuda",
        VRAMSWAP_FRAME_SIZE="2MiB",
        VRAMSWAP_POOL_SIZE="2GiB",
        CUBLAS_WORKSPACE_CONFIG=":4096:8",
    )
    env.pop("VRAMSWAP_TORCH", None)
    env.update(extra)
    return env


def run_checks(what, env, use_vramswap):
    cmd = [sys.executable, CHECKS, what] + (["--vramswap"] if use_vramswap else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("what", ["train", "compile", "graph"])
def test_losses_equal_pytorch_allocator_with_every_step_swapped(deployment, what):
    reference = run_checks(what, gpu_env(deployment), use_vramswap=False)
    swapped = run_checks(what, gpu_env(deployment, VRAMSWAP_EAGER_RELEASE="1"), use_vramswap=True)
    assert swapped["losses"] == reference["losses"], f"{what}: losses differ from PyTorch's own allocator"
    s = swapped["stats"]
    steps = len(swapped["losses"])
    # Each step's acquire brought the memory back from host memory: it really went out.
    assert s["acquires"] >= steps
    assert s["bytes_out"] >= steps * (4 << 20), f"{what}: too few bytes evicted for {steps} swapped steps: {s}"
    assert s["bytes_in"] >= (steps - 1) * (4 << 20), s
    if what == "graph":
        assert s["graph_bytes"] > 0, "the captured step's memory should be held for the graph"


def test_model_moved_to_the_gpu_outside_the_lock_trains_bit_exact(deployment):
    """model.cuda() and the optimizer before the loop, outside the lock (the usual script),
    every step under it and swapped out at its release: the same losses as PyTorch's own
    allocator."""
    reference = run_checks("train", gpu_env(deployment), use_vramswap=False)
    swapped = run_checks("outside", gpu_env(deployment, VRAMSWAP_EAGER_RELEASE="1"), use_vramswap=True)
    assert swapped["losses"] == reference["losses"], "losses differ from PyTorch's own allocator"
    s = swapped["stats"]
    assert s["bytes_out"] >= len(swapped["losses"]) * (4 << 20), f"the memory made outside the lock did not swap: {s}"


POOL_HOLDER = r"""
import sys, vramswap
with vramswap.gpu_lock(0):
    p = vramswap.malloc(int(sys.argv[1]))
    print("holding", flush=True)
    sys.stdin.read()
"""


def test_tensor_made_outside_the_lock_with_the_pool_taken_says_to_lock(deployment):
    """Another process holds the whole pool: a CUDA tensor made outside the lock raises a
    RuntimeError that says to allocate inside vramswap.gpu_lock(), instead of a CUDA error."""
    env = gpu_env(deployment)
    holder = subprocess.Popen(
        [sys.executable, "-c", POOL_HOLDER, str(2 << 30)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().strip() == "holding", f"the holder did not take the pool (exit {holder.poll()})"
        out = run_checks("outside-full", env, use_vramswap=False)
    finally:
        holder.stdin.close()
        holder.wait(timeout=120)
    assert out["error"] is not None, "a tensor outside the lock with no free frame must raise"
    assert "does not hold the device lock" in out["error"] and "Allocate inside the lock" in out["error"], out["error"]


def test_enable_after_cuda_started_is_refused_clearly(deployment):
    out = run_checks("late-enable", gpu_env(deployment), use_vramswap=False)
    assert out["error"] is not None, "enable() after a CUDA tensor existed must raise"
    assert "already in use" in out["error"] and "VRAMSWAP_TORCH=1" in out["error"], out["error"]


def test_time_sharing_example_is_bit_exact_with_three_processes(deployment):
    # Small sizes here (the GPU run in scripts/device-run.sh uses the example's defaults):
    # 3 x ~0.75 GiB against a 1.1 GiB pool, so every turn swaps.
    env = gpu_env(deployment)
    env.pop("VRAMSWAP_POOL_SIZE")
    r = subprocess.run(
        [sys.executable, EXAMPLE, "--processes", "3", "--gib", "0.75", "--steps", "6", "--pool-gib", "1.1"],
        env=env, capture_output=True, text=True, timeout=900,
    )
    print(r.stdout)
    assert r.returncode == 0, f"example failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    assert "PASS (bit-exact)" in r.stdout
