"""Device time per kernel of the mesh chain's backward, per reduce mode (needs a CUDA GPU).

The chain is bench_mesh.py's (a 100k-triangle sphere at 1024^2: rasterize, interpolate
with derivatives, a 2048^2 RGB mipmapped texture, antialias); its backward runs ``--reps``
times under torch.profiler for each mode, and the kernels are listed by mean device us
per backward. It shows which op a mode wins or loses in, which bench_mesh's chain total
cannot.

Usage::

    python benchmarks/profile_mesh_kernels.py [--modes atomic arc] [--reps 10]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import arc_warp_torch.mesh as ours
import bench_mesh


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="*", default=["atomic", "arc"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_mesh_kernels.py needs a CUDA GPU")
    device = bench_mesh.DEVICE = torch.device("cuda")
    pos, tri, uv = bench_mesh.sphere(100_000, device)
    pos.requires_grad_(True)
    tex = torch.rand(1, 2048, 2048, 3, device=device).requires_grad_(True)
    ctx, topo = ours.RasterizeCudaContext(), ours.antialias_construct_topology_hash(tri)

    for mode in args.modes:
        out = bench_mesh.chain(ours, ctx, topo, pos, tri, uv, tex, 1024, mode)
        g = torch.randn_like(out)
        for _ in range(5):  # warm-up: kernels compiled, plans made
            torch.autograd.grad(out, (pos, tex), g, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.reps):
                torch.autograd.grad(out, (pos, tex), g, retain_graph=True)
            torch.cuda.synchronize()
        rows = sorted(((e.key, e.device_time_total / args.reps) for e in prof.key_averages()
                       if e.device_time_total > 0), key=lambda r: -r[1])
        print(f"reduce={mode}: device us per backward, by kernel ({sum(t for _, t in rows):.1f} in all)")
        for name, us in rows[:args.top]:
            print(f"  {us:9.1f}  {name[:100]}")


if __name__ == "__main__":
    main()
