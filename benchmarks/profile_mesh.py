"""Host cost per call of the mesh chain through the nvdiffrast.torch drop-in, on the CPU.

The chain is bench_mesh.py's (rasterize, interpolate with derivatives, mipmapped texture,
antialias) on a small sphere at a tiny size, so kernel time is small and the fixed
per-call cost a GPU user pays (Python, Warp array construction, allocations, launches)
dominates. Forward and backward are measured separately, after warm-up:

* host ms: median thread CPU time outside Warp's kernel invocations (``invoke`` /
  ``invoke_cpu_blocks`` are wrapped and their time subtracted; ``time.thread_time``, so
  other processes do not count);
* allocations: device memory allocations (the device allocator's ``allocate``);
* launches: kernel invocations; fills: memsets and ``fill_`` calls (each a launch on CUDA),
  Warp's and ``torch.zeros`` / ``torch.zeros_like``'s (the drop-in's gradient buffers);
  copies: ``wp.copy`` calls (a memcpy on CUDA);
* with ``--profile N``: cProfile of N more steps, the top 25 functions by own time
  (``--sort cumulative``: by time including callees, which ranks the ops and Functions).

Usage::

    PYTHONPATH=.:plugins python benchmarks/profile_mesh.py [--size 64] [--tris 500] [--tex 64]
        [--reps 50] [--profile 25 [--sort cumulative]]
"""

from __future__ import annotations

import argparse
import cProfile
import contextlib
import math
import pstats
import time

import numpy as np
import torch
import warp as wp
import warp._src.context as wctx
import warp._src.types as wtypes

import arc_warp.mesh as core
import arc_warp_torch.mesh as dr


@contextlib.contextmanager
def counters(device: str = "cpu"):
    """Counts allocations, kernel invocations (and the thread time inside them), fills and
    copies while active; yields the dict of counts. Measurement only: it wraps Warp internals."""
    counts = {"allocations": 0, "launches": 0, "fills": 0, "copies": 0, "kernel_s": 0.0}
    dev = wp.get_device(device)
    alloc, memset, fill = dev.default_allocator.allocate, dev.memset, wtypes.array.fill_
    zeros, zeros_like, copy = torch.zeros, torch.zeros_like, wp.copy
    invokes = {name: getattr(wctx, name) for name in ("invoke", "invoke_cpu_blocks")}

    def counted_alloc(*a, **k):
        counts["allocations"] += 1
        return alloc(*a, **k)

    def counted_memset(*a, **k):
        counts["fills"] += 1
        return memset(*a, **k)

    def counted(fn, key):
        def run(*a, **k):
            counts[key] += 1
            return fn(*a, **k)
        return run

    def counted_fill(self, value):
        if value != 0 or not self.is_contiguous:  # zero_ of a contiguous array is a memset, counted above
            counts["fills"] += 1
        return fill(self, value)

    def timed(fn):
        def run(*a, **k):
            counts["launches"] += 1
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                counts["kernel_s"] += time.thread_time() - t
        return run

    dev.default_allocator.allocate, dev.memset, wtypes.array.fill_ = counted_alloc, counted_memset, counted_fill
    torch.zeros, torch.zeros_like = counted(zeros, "fills"), counted(zeros_like, "fills")
    wp.copy = counted(copy, "copies")
    for name, fn in invokes.items():
        setattr(wctx, name, timed(fn))
    try:
        yield counts
    finally:
        dev.default_allocator.allocate, dev.memset, wtypes.array.fill_ = alloc, memset, fill
        torch.zeros, torch.zeros_like, wp.copy = zeros, zeros_like, copy
        for name, fn in invokes.items():
            setattr(wctx, name, fn)


def make_chain(size: int, n_tri: int, tex_size: int, reduce: str = "arc"):
    """(forward, backward, inputs): the chain's forward returns the image; backward(image)
    runs autograd into pos and tex (their .grad is reset first)."""
    rings = max(3, int(math.sqrt(n_tri / 4)))
    v, uv, f = core.uv_sphere(rings, 2 * rings)
    v = torch.from_numpy(v)
    pos = torch.cat([v[:, :2] * 2.2, 0.5 * v[:, 2:3], 2.6 + v[:, 2:3]], 1)[None].contiguous().requires_grad_(True)
    tri, uv = torch.from_numpy(f), torch.from_numpy(uv)[None].contiguous()
    tex = torch.rand(1, tex_size, tex_size, 3, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    glctx = dr.RasterizeCudaContext()
    topo = dr.antialias_construct_topology_hash(tri)
    grad = torch.randn(1, size, size, 3, generator=torch.Generator().manual_seed(1))

    def forward():
        rast, db = dr.rasterize(glctx, pos, tri, (size, size), reduce=reduce)
        texc, texd = dr.interpolate(uv, rast, tri, rast_db=db, diff_attrs="all", reduce=reduce)
        color = dr.texture(tex, texc, texd, filter_mode="linear-mipmap-linear", reduce=reduce)
        return dr.antialias(color, rast, pos, tri, topology_hash=topo, reduce=reduce)

    def backward(image):
        pos.grad = tex.grad = None
        image.backward(grad)

    return forward, backward, (pos, tex)


def measure(forward, backward, reps: int) -> dict:
    """Median host ms (outside kernels) and per-call counts of forward and backward."""
    host = {"forward": [], "backward": []}
    per_call = {}
    for _ in range(reps):
        for phase in ("forward", "backward"):
            with counters() as c:
                t = time.thread_time()
                if phase == "forward":
                    image = forward()
                else:
                    backward(image)
                host[phase].append((time.thread_time() - t - c["kernel_s"]) * 1e3)
            per_call[phase] = {k: c[k] for k in ("allocations", "launches", "fills", "copies")}
    return {phase: {"host_ms": float(np.median(host[phase])), **per_call[phase]} for phase in host}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=64, help="image side, pixels")
    ap.add_argument("--tris", type=int, default=500, help="about this many sphere triangles")
    ap.add_argument("--tex", type=int, default=64, help="texture side, texels")
    ap.add_argument("--reduce", default="arc")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N steps, print the top 25")
    ap.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"), help="order of --profile")
    args = ap.parse_args(argv)
    wp.init()
    forward, backward, _ = make_chain(args.size, args.tris, args.tex, args.reduce)
    for _ in range(5):
        backward(forward())
    results = measure(forward, backward, args.reps)
    for phase, r in results.items():
        print(f"{phase:8s} host {r['host_ms']:7.3f} ms  allocations {r['allocations']:3d}  "
              f"launches {r['launches']:3d}  fills {r['fills']:3d}  copies {r['copies']:3d}")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.profile):
            backward(forward())
        prof.disable()
        pstats.Stats(prof).sort_stats(args.sort).print_stats(25)
    return results


if __name__ == "__main__":
    main()
