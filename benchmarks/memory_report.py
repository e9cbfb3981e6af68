"""Device memory that arc_warp holds for a torch training step: a table of every buffer.

Renders and backpropagates a ``bench_train_step.make_scene`` scene (SH degree 3) through
``arc_warp_torch.rasterization`` for a few steps, as a training loop does (each step's
image is still referenced while the next one renders), then prints:

- every Warp buffer of the context's workspace (``Workspace.memory_report``): frame
  (0 = shared scratch, 1.. = render frames), name, dtype, shape, bytes, and bytes per
  Gaussian, per intersection or per pixel, whichever the buffer scales with;
- the tensors the torch bridge allocates per step (outputs, gradient buffers), from
  their shapes;
- totals per Gaussian at this scene, and an estimate for ``--extrapolate`` Gaussians
  (per-Gaussian and per-intersection bytes scaled, per-pixel bytes kept).

The torch parameters, their gradients, Adam's states and the activations are common to
every renderer and not listed. Works on any device; on the CPU a 1080p frame of 100k-300k
Gaussians takes seconds per step.

Usage::

    python benchmarks/memory_report.py --device cpu --n 100000 --extrapolate 1000000
    python benchmarks/memory_report.py --n 1000000 --cameras 1 4
    python benchmarks/memory_report.py --n 1000000 --peaks   # plus a torch-Adam step's peaks
"""

import argparse
import sys

import torch
import warp as wp
from arc_warp._src.splat.workspace import BACKWARD_ARENA, SCRATCH_ARENA

from bench_train_step import SH_DEGREE, _activated, _params, make_scene

PER_INTERSECTION = ("sort_ids", "entry_grads")  # buffers sized by the sort (its keys are in the scratch arena)
ARENAS = (SCRATCH_ARENA, BACKWARD_ARENA)  # the forward's and, with release_workspace, the backward's scratch


def _kind(name, shape, n, pixels):
    """What a buffer's size scales with: "gaussian", "isect", "pixel" or "other"."""
    if name in PER_INTERSECTION:
        return "isect"
    if len(shape) == 2 and shape[0] * shape[1] == pixels:
        return "pixel"
    if name in ARENAS or (n > 0 and shape[0] % n == 0):
        return "gaussian"
    return "other"


def _setup(n, width, height, cameras, device, regime):
    """(parameters, viewmats, Ks, a fresh RenderContext) of a ``make_scene`` scene on ``device``."""
    from arc_warp_torch import RenderContext

    raw, viewmats, ks = make_scene(n, regime, width, height, cameras)
    return _params(raw, device), viewmats.to(device), ks.to(device), RenderContext(device)


def report(n, width, height, cameras, device, steps=3, regime="small"):
    """Runs ``steps`` render + backward steps and returns (rows, counts): rows of
    (owner, name, dtype, shape, bytes, kind), counts {"gaussian": N, "isect": total over
    cameras, "pixel": C*H*W}."""
    from arc_warp_torch import rasterization

    params, viewmats, ks, context = _setup(n, width, height, cameras, device, regime)
    img = None
    for _ in range(steps):
        img, _, meta = rasterization(*_activated(params), viewmats, ks, width, height, sh_degree=SH_DEGREE,
                                     context=context)
        img.abs().mean().backward()
        for p in params.values():
            p.grad = None
    ws = context.workspace
    tiles = ((width + 15) // 16, (height + 15) // 16)
    counts = {"gaussian": n, "isect": ws.last_total(tiles) * cameras, "pixel": cameras * width * height}
    rows = [(f"warp frame {b.frame}", b.name, b.dtype.__name__, b.shape, b.nbytes,
             _kind(b.name, b.shape, n, width * height)) for b in ws.memory_report()]
    c = cameras
    rows += [("torch bridge", "images (color, depth, expected_depth)", "float32", (c, height, width, 5),
              20 * c * width * height, "pixel"),
             ("torch bridge", "alpha (with radii and means2d)", "float32", (c, height, width), 4 * c * width * height,
              "pixel"),
             ("torch bridge", "radii", "int32", (c, n, 2), 8 * c * n, "gaussian"),
             ("torch bridge", "means2d (+ its grad, in the leaf-gradient buffer)", "float32", (c, n, 2),
              16 * c * n, "gaussian"),
             ("torch bridge", "leaf gradients (means, SH colours)", "float32", (n, 3 + 3 * (SH_DEGREE + 1) ** 2),
              4 * n * (3 + 3 * (SH_DEGREE + 1) ** 2), "gaussian"),
             ("torch bridge", "activation gradients (quats, scales, opacities)", "float32", (n, 8), 32 * n,
              "gaussian")]
    return rows, counts


def peaks(n, width, height, device, steps=12, regime="small"):
    """Peak memory of a training step (render + L1 + backward + ``torch.optim.Adam``, one
    camera) in a fresh context: (torch's peak allocated over the last two steps, Warp's
    pool in use after them, Warp's pool high-water mark since the process started), MiB.
    CUDA only."""
    from arc_warp_torch import rasterization

    params, viewmats, ks, context = _setup(n, width, height, 1, device, regime)
    opt = torch.optim.Adam(list(params.values()), lr=1e-4)
    wdev = wp.device_from_torch(device)
    for step in range(steps):
        if step == steps - 2:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        img = rasterization(*_activated(params), viewmats, ks, width, height, sh_degree=SH_DEGREE,
                            context=context)[0]
        img.abs().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    mib = 2**20
    return (torch.cuda.max_memory_allocated(device) / mib, wp.get_mempool_used_mem_current(wdev) / mib,
            wp.get_mempool_used_mem_high(wdev) / mib)


def print_report(rows, counts, extrapolate=None):
    n, isects, pixels = counts["gaussian"], counts["isect"], counts["pixel"]
    print(f"# N = {n}, intersections = {isects} ({isects / n:.3f} per Gaussian), pixels = {pixels}")
    print("| owner | buffer | dtype | shape | bytes | B/Gaussian | B/intersection | B/pixel |\n|" + "---|" * 8)
    totals = {}
    for owner, name, dtype, shape, nbytes, kind in rows:
        totals[(owner.split()[0], kind)] = totals.get((owner.split()[0], kind), 0) + nbytes
        cells = [f"{nbytes / counts[k]:.2f}" if kind == k else "" for k in ("gaussian", "isect", "pixel")]
        print(f"| {owner} | {name} | {dtype} | {tuple(shape)} | {nbytes} | " + " | ".join(cells) + " |")
    for owner in ("warp", "torch"):
        t = {k: totals.get((owner, k), 0) for k in ("gaussian", "isect", "pixel", "other")}
        per_g = (t["gaussian"] + t["isect"]) / n
        line = (f"# {owner}: {t['gaussian'] / n:.1f} B/Gaussian + {t['isect'] / max(isects, 1):.2f} B/intersection "
                f"= {per_g:.1f} B per Gaussian at this scene; {t['pixel'] / pixels:.1f} B/pixel; "
                f"{sum(t.values()) / 2**20:.1f} MiB in all")
        if extrapolate:
            est = per_g * extrapolate + t["pixel"] + t["other"]
            line += f"; at N = {extrapolate} (same intersections per Gaussian): {est / 2**20:.1f} MiB"
        print(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--cameras", type=int, nargs="+", default=[1])
    ap.add_argument("--regime", choices=("small", "large"), default="small")
    ap.add_argument("--extrapolate", type=int, help="also estimate the totals at this N")
    ap.add_argument("--peaks", action="store_true",
                    help="CUDA: also the peak memory of a torch-Adam training step in a fresh process")
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.peaks and device.type == "cuda":  # first, so no other run's memory counts
        torch_peak, warp_now, warp_high = peaks(args.n, args.width, args.height, device, regime=args.regime)
        print(f"# training step, N = {args.n}, C = 1: torch peak {torch_peak:.0f} MiB (parameters, their "
              f"gradients and Adam's states included), Warp pool {warp_now:.0f} MiB in use, "
              f"{warp_high:.0f} MiB high-water mark")
    for c in args.cameras:
        rows, counts = report(args.n, args.width, args.height, c, device, regime=args.regime)
        print(f"\n# {args.regime} regime, {args.width}x{args.height}, C = {c}, SH {SH_DEGREE}, device {device}")
        print_report(rows, counts, args.extrapolate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
