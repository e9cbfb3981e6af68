"""Where a training step's time goes: torch.profiler over bench_train_step's step (CUDA).

Prints the top CUDA kernels and CPU-side ops of a few arc_warp steps, and the step time
with ``absgrad`` forced off in the renderer, to size the adapter's overheads.

Usage::

    cd benchmarks && python profile_train_step.py [--n 1000000]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import bench_train_step as bts
from bench_splat import HEIGHT, SH_DEGREE, WIDTH, make_scene


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    args = ap.parse_args()
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    from arc_warp_torch import rasterization

    scene = make_scene(args.n)
    target = torch.rand(1, HEIGHT, WIDTH, 3, device="cuda")

    def render(*a):
        return rasterization(*a, WIDTH, HEIGHT, sh_degree=SH_DEGREE)[0]

    print(f"step: {bts.median_step_ms(render, scene, target, 9):.3f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        bts.median_step_ms(render, scene, target, 3)
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
