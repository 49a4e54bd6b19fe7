"""An ordinary PyTorch training script that knows nothing of vramswap, for the preload test.

usage: python torch_unmodified.py <GiB of weights> <steps> [foreach|fused]
Trains a stack of linear layers holding about <GiB> of fp32 weights (plus Adam state and
gradients: about 4x that in all) on a fixed random batch, with PyTorch's default Adam
(foreach: each update is several sweeps over every tensor, with temporaries the size of the
weights) or with Adam(fused=True) (one sweep, no temporaries), checks that every step's loss is
finite and that the last is below the first, and prints one line of key=value numbers:
first_step_s (the step that allocates gradients and optimizer state) and step_s (the mean
of the other steps).
Exit 0 on success, 1 otherwise.
"""
import sys
import time

import torch


def main() -> int:
    gib = float(sys.argv[1])
    steps = int(sys.argv[2])
    optimizer = sys.argv[3] if len(sys.argv) > 3 else "foreach"
    if optimizer not in ("foreach", "fused"):
        sys.exit(f"torch_unmodified.py: the optimizer is foreach or fused, not {optimizer!r}")
    if steps < 2:
        sys.exit("torch_unmodified.py: <steps> must be at least 2 (the first one allocates; step_s is the mean of the rest)")
    torch.manual_seed(0)
    width = 8192
    layers = max(1, int(gib * (1 << 30) / (width * width * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).cuda()
    for layer in model:
        torch.nn.init.normal_(layer.weight, std=1.0 / width**0.5)
    # fused=None, not False, for the default: an explicit False would also turn foreach off.
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True if optimizer == "fused" else None)
    x = torch.randn(256, width, device="cuda")
    target = torch.randn(256, width, device="cuda") * 0.1
    losses = []
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # waits for the step's kernels
        times.append(time.perf_counter() - t0)
    # The first step allocates the gradients and Adam's state; the rest reuse PyTorch's cache.
    first_step_s = times[0]
    step_s = sum(times[1:]) / (steps - 1)
    last = times[-min(5, steps - 1):]  # after placement by use has had the run's time to move pages
    last_steps_s = sum(last) / len(last)
    free, total = torch.cuda.mem_get_info()
    good = all(l == l and l != float("inf") for l in losses) and losses[-1] < losses[0]
    print(f"layers={layers} steps={steps} first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f} "
          f"first_step_s={first_step_s:.6f} step_s={step_s:.6f} last_steps_s={last_steps_s:.6f} "
          f"allocated={torch.cuda.memory_allocated()} meminfo_free={free} meminfo_total={total} ok={int(good)}", flush=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
