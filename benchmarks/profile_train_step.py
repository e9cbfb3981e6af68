"""Where a forward + backward's time goes through the torch API: host against device.

On a GPU: torch.profiler (CPU and CUDA activities) over a few steps of bench_train_step's
scene, printing the top CUDA kernels and the top host-side ops. On the CPU (``--device
cpu``): the host time per forward + backward spent outside Warp's kernels, i.e. the Python
overhead of the path (thread CPU time, so other processes on the machine do not count),
the CPU proxy for the per-call cost a GPU user pays.

Usage::

    cd benchmarks && python profile_train_step.py --n 300000
    cd benchmarks && python profile_train_step.py --device cpu --n 200 --width 32 --height 32
    cd benchmarks && python profile_train_step.py --n 300000 --cprofile 100   # host by function
"""

import argparse
import cProfile
import pstats
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import bench_train_step as bts


def _host_overhead_cpu(step, reps):
    """Median thread CPU ms per step, and the part outside Warp's CPU kernel invocations."""
    import warp._src.context as wctx

    inside = [0.0]
    invoke = wctx.invoke

    def timed_invoke(*a, **k):
        t = time.thread_time()
        try:
            return invoke(*a, **k)
        finally:
            inside[0] += time.thread_time() - t

    wctx.invoke = timed_invoke  # measurement only: Warp's CPU launches call this per kernel
    try:
        total, host = [], []
        for _ in range(reps):
            inside[0] = 0.0
            t = time.thread_time()
            step()
            dt = time.thread_time() - t
            total.append(dt * 1e3)
            host.append((dt - inside[0]) * 1e3)
    finally:
        wctx.invoke = invoke
    return float(np.median(total)), float(np.median(host))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cameras", type=int, default=1)
    ap.add_argument("--regime", default="small", choices=sorted(bts.REGIMES))
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="cProfile N steps instead (host Python by function; GPU or CPU)")
    args = ap.parse_args()
    device = torch.device(args.device)
    libs, _ = bts._renderers(["arc"], args.width, args.height)
    raw, viewmats, ks = bts.make_scene(args.n, args.regime, args.width, args.height, args.cameras)
    params = libs["arc"].params(raw, device)
    viewmats, ks = viewmats.to(device), ks.to(device)

    def step():
        img = libs["arc"].render(params, viewmats, ks)
        img.sum().backward()
        for p in params.values():
            p.grad = None

    for _ in range(5):
        step()
    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.cprofile):
            step()
        prof.disable()
        if device.type == "cuda":
            torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        return
    if device.type == "cpu":
        total, host = _host_overhead_cpu(step, args.reps)
        print(f"N={args.n} C={args.cameras} {args.width}x{args.height}: {total:.3f} ms per forward + "
              f"backward, of which {host:.3f} ms outside Warp kernels (host overhead)")
        return
    steps = 5
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    # device-only rows (kernels, copies, fills) have no CPU time; the ops that launched
    # them carry the same device time again, so they are left out
    busy = sum(e.self_device_time_total for e in prof.key_averages() if e.self_cpu_time_total == 0) / steps / 1e3
    print(f"N={args.n} C={args.cameras} {args.regime}: GPU busy {busy:.3f} ms per forward + backward "
          "(kernels, copies and fills, summed; torch's activations and loss included)")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
