"""Workloads for tests/python/test_torch.py, each run in a process of its own (PyTorch's
allocator can be chosen only before CUDA starts, and these need the cuda backend while the
rest of the suite uses the host one).

    python3 torch_checks.py compile|graph|train [--vramswap]

Prints one JSON line: the losses (as float.hex, for exact comparison) and, with --vramswap,
vramswap.stats(). With --vramswap every CUDA tensor is vramswap memory, every step takes the
lock, and the test sets VRAMSWAP_EAGER_RELEASE=1 so that each release evicts all of it to host
memory and each acquire brings it back: every step runs on memory that went out and back.

    python3 torch_checks.py outside [--vramswap]

The usual script's shape: the model moved to the GPU and the optimizer built before the
training loop, outside the lock; only each step takes it. Same losses as `train`.

    python3 torch_checks.py outside-full

With vramswap, while another process holds the whole pool: a CUDA tensor made outside the
lock must raise RuntimeError saying to allocate inside the lock; prints the message.

    python3 torch_checks.py late-enable

Creates a CUDA tensor, then calls vramswap.torch.enable(): must raise RuntimeError naming
the cause; prints the message.
"""

import contextlib
import json
import sys

import torch


def setup(use_vramswap):
    if use_vramswap:
        import vramswap
        import vramswap.torch

        vramswap.torch.enable()
        return vramswap, lambda: vramswap.gpu_lock(0)
    return None, contextlib.nullcontext


def model_and_data(width=1024):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 1)
    )
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(256, width, generator=g) for _ in range(8)]
    return model, batches


def train(use_vramswap, compiled, outside=False):
    vs, lock = setup(use_vramswap)
    torch.use_deterministic_algorithms(True)
    model_cpu, batches = model_and_data()
    with contextlib.nullcontext() if outside else lock():
        model = model_cpu.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        step_model = torch.compile(model) if compiled else model
    losses = []
    for x in batches * 2:
        with lock():
            xb = x.cuda()
            loss = step_model(xb).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return vs, losses


def graph(use_vramswap):
    """A whole training step (forward, backward, optimizer) captured once into a CUDA graph,
    then replayed on new data copied into its static input."""
    vs, lock = setup(use_vramswap)
    model_cpu, batches = model_and_data()
    losses = []
    with lock():
        model = model_cpu.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        static_x = batches[0].cuda()
        # Warm up on a side stream (PyTorch's recipe), then capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=False)
                model(static_x).square().mean().backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        # Reset to the same start as the reference (the warm-up steps changed the weights).
        with torch.no_grad():
            for p, q in zip(model.parameters(), model_and_data()[0].parameters()):
                p.copy_(q)
        for state in opt.state.values():
            state["momentum_buffer"].zero_()
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=False)
        with torch.cuda.graph(g):
            static_loss = model(static_x).square().mean()
            static_loss.backward()
            opt.step()
    for x in batches * 2:
        with lock():
            static_x.copy_(x)
            g.replay()
            losses.append(static_loss.item())
    return vs, losses


def outside_full():
    setup(True)
    try:
        torch.ones(64 << 20, device="cuda")  # 256 MiB, outside the lock, the pool held by another
    except RuntimeError as e:
        print(json.dumps({"error": str(e)}))
        return
    print(json.dumps({"error": None}))


def late_enable():
    torch.ones(1, device="cuda")
    import vramswap.torch

    try:
        vramswap.torch.enable()
    except RuntimeError as e:
        print(json.dumps({"error": str(e)}))
        return
    print(json.dumps({"error": None}))


def main():
    what = sys.argv[1]
    use_vramswap = "--vramswap" in sys.argv[2:]
    if what == "late-enable":
        return late_enable()
    if what == "outside-full":
        return outside_full()
    if what == "graph":
        vs, losses = graph(use_vramswap)
    else:
        vs, losses = train(use_vramswap, compiled=(what == "compile"), outside=(what == "outside"))
    out = {"losses": [v.hex() for v in losses]}
    if vs is not None:
        out["stats"] = vs.stats(0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
