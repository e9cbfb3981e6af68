"""Which triangle each pixel gets, ours against nvdiffrast's CUDA rasterizer (needs a GPU).

``arc_warp.mesh.rasterize`` follows nvdiffrast 0.4's CUDA rasterizer (frustum clipping,
1/16-pixel snapping, its fill rule and fixed-point depth test, viewport tiles above 2048
pixels). This script renders scenes that stress those rules through both libraries on
the same tensors and prints, per scene, the pixels whose triangle ids differ and the
fraction of covered pixels whose u, v, z/w and ``rast_db`` are bitwise equal (with the
largest difference where not):

* ``grid 1M``, ``grid 200k``: screen-filling grids (bench_mesh.py's), every edge shared;
* ``soup clipped z``, ``soup w<0``: random triangles crossing the near/far planes and
  the w = 0 plane (clipped into fans of sub-triangles);
* ``small tris``, ``small odd size``: many tiny triangles, also at 37x53;
* ``wide`` (2100x4100), ``soup wide`` (2500x2600): images drawn in viewport tiles;
* ``duplicates``: every triangle twice (equal depths go to the later one).

``--smoke`` runs our side alone at tiny sizes on the CPU (checks the script).

Usage::

    python benchmarks/check_mesh_coverage.py [--smoke]
"""

from __future__ import annotations

import argparse
import sys

import torch

import arc_warp_torch.mesh as ours
from bench_mesh import grid_mesh

try:
    import nvdiffrast.torch as nvdr
except ImportError:  # the comparison needs it; --smoke runs without
    nvdr = None


def soup(n: int, z_span: float, w_low: float, seed: int, device):
    """``n`` random triangles: clip-space xy in [-1.5, 1.5] w, z in [-z_span, z_span] w,
    w in [w_low, 2]: pos [1, 3n, 4], tri [n, 3]."""
    g = torch.Generator().manual_seed(seed)
    w = w_low + (2.0 - w_low) * torch.rand(3 * n, 1, generator=g)
    xy = (3.0 * torch.rand(3 * n, 2, generator=g) - 1.5) * w
    z = (2.0 * torch.rand(3 * n, 1, generator=g) - 1.0) * z_span * w
    pos = torch.cat([xy, z, w], 1)[None].to(device).contiguous()
    return pos, torch.arange(3 * n, dtype=torch.int32, device=device).reshape(n, 3)


def small_tris(n: int, seed: int, device):
    """``n`` triangles of a few pixels' size at random depths: pos [1, 3n, 4], tri [n, 3]."""
    g = torch.Generator().manual_seed(seed)
    centre = 2.0 * torch.rand(n, 1, 2, generator=g) - 1.0
    corners = centre + 0.02 * (torch.rand(n, 3, 2, generator=g) - 0.5)
    z = torch.rand(n, 1, 1, generator=g).expand(n, 3, 1)
    pos = torch.cat([corners, z, torch.ones(n, 3, 1)], 2).reshape(1, 3 * n, 4).to(device).contiguous()
    return pos, torch.arange(3 * n, dtype=torch.int32, device=device).reshape(n, 3)


def scenes(device, smoke: bool):
    """(name, pos, tri, (height, width)) of every scene."""
    s = 8 if smoke else 1
    grid_big, grid_small = grid_mesh(1_000_000 // s ** 2, device), grid_mesh(200_000 // s ** 2, device)
    wide_h, wide_w = (2100, 4100) if not smoke else (40, 70)
    pos_d, tri_d = small_tris(150_000 // s ** 2, 5, device)
    return [
        ("grid 1M", *grid_big, (2048 // s, 2048 // s)),
        ("grid 200k", *grid_small, (1000 // s, 1200 // s)),
        ("soup clipped z", *soup(3000 // s, 1.5, 0.3, 1, device), (384 // s, 512 // s)),
        ("soup w<0", *soup(2000 // s, 0.8, -1.0, 2, device), (256 // s, 320 // s)),
        ("small tris", *small_tris(200_000 // s ** 2, 3, device), (1024 // s, 1024 // s)),
        ("small odd size", *small_tris(20_000 // s ** 2, 4, device), (37, 53)),
        ("wide", *small_tris(100_000 // s ** 2, 6, device), (wide_h, wide_w)),
        ("soup wide", *soup(400, 0.5, 0.5, 7, device), (2500 // s, 2600 // s)),
        ("duplicates", pos_d, torch.cat([tri_d, tri_d]), (512 // s, 512 // s)),
    ]


def compare(name, pos, tri, size, with_peer: bool):
    """Prints the triangle-id mismatches and bitwise agreement of one scene against
    nvdiffrast (``with_peer``; else our coverage alone); returns the mismatch count."""
    rast, db = ours.rasterize(ours.RasterizeCudaContext(), pos, tri, size, grad_db=True)
    if not with_peer:
        print(f"{name:16s} {size[1]}x{size[0]}: {int((rast[..., 3] > 0).sum())} pixels covered (ours only)")
        return 0
    ref, ref_db = nvdr.rasterize(nvdr.RasterizeCudaContext(), pos, tri, size, grad_db=True)
    covered = ref[..., 3] > 0
    mismatches = int((rast[..., 3] != ref[..., 3]).sum())
    same = covered & (rast[..., 3] == ref[..., 3])
    cells = [f"{name:16s} {size[1]}x{size[0]} triangles {tri.shape[0]:8d} covered {float(covered.float().mean()):.3f} "
             f"id mismatches {mismatches:7d}"]
    for label, a, b in (("u", rast[..., 0], ref[..., 0]), ("v", rast[..., 1], ref[..., 1]),
                        ("z/w", rast[..., 2], ref[..., 2]), ("db", db, ref_db)):
        a, b = a[same], b[same]
        equal = float((a.view(torch.int32) == b.view(torch.int32)).float().mean()) if a.numel() else 1.0
        worst = float((a - b).abs().max()) if a.numel() else 0.0
        cells.append(f"{label} bitwise {equal:.4f} max {worst:.1e}")
    print(" | ".join(cells), flush=True)
    return mismatches


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="our side only, tiny sizes, on the CPU")
    args = ap.parse_args(argv)
    if args.smoke:
        device = torch.device("cpu")
    elif not torch.cuda.is_available() or nvdr is None:
        sys.exit("check_mesh_coverage.py needs a CUDA GPU and nvdiffrast (or --smoke)")
    else:
        device = torch.device("cuda")
    total = sum(compare(name, pos, tri, size, not args.smoke)
                for name, pos, tri, size in scenes(device, args.smoke))
    print(f"total id mismatches {total}")
    return total


if __name__ == "__main__":
    main()
