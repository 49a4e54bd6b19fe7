"""Where a PyTorch training step's GPU time goes, kernel by kernel: the breakdown behind
bench_oversubscribe's PyTorch rows.

usage: python profile_step.py <GiB of weights> [steps]

The same model and step as tests/gpu/torch_unmodified.py (linear layers of width 8192, Adam,
a fixed batch). Run it plainly for device memory, and under the preload shim with
VRAMSWAP_OVERSUBSCRIBE=1 for an oversubscribed job; compare the two tables. After two warm-up
steps it profiles [steps] steps (default 2) with torch.profiler and prints, per kernel name,
the GPU time per step, the calls per step and the share of the step, sorted by time, as a
markdown table on stdout.
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> int:
    gib = float(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.manual_seed(0)
    width = 8192
    layers = max(1, int(gib * (1 << 30) / (width * width * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(256, width, device="cuda")
    target = torch.randn(256, width, device="cuda") * 0.1

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
    wall = (time.perf_counter() - t0) / steps
    rows = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        r = rows.setdefault(e.name, [0.0, 0])
        r[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        r[1] += 1
    total = sum(r[0] for r in rows.values())
    print(f"{layers} layers of {width}x{width}; step wall time {wall * 1e3:.1f} ms, GPU time in kernels and copies "
          f"{total / steps / 1e3:.1f} ms per step\n")
    print("| kernel | ms per step | calls per step | share |")
    print("| --- | ---: | ---: | ---: |")
    for name, (us, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"| {name[:90]} | {us / steps / 1e3:.2f} | {n / steps:.0f} | {us / total:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
