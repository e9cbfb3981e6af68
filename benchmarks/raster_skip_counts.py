"""Warp-entry evaluations of the raster backward with and without its subtile skip.

The backward's warp (an 8x4 pixel block of a 16x16 tile) walks its tile's entries back
to front from the warp's last contributor (the largest ``last_ids`` of its pixels), so
without the skip it evaluates every entry in ``[range start, warp's last]``; with it,
only those whose ``subtile_mask`` has the warp's bit. Both are counted from a real
render (projection, binning and forward on any device, the CPU included), per 32-lane
warp as on a GPU, by a kernel that calls ``subtile_mask`` itself.

Scenes: ``small`` is bench_train_step's small regime (std-devs 0.3-1.5 px at the
depth; needs torch), ``bench_splat`` that benchmark's scene (both SH degree 3,
1920x1080), each drawn by its script.

Usage::

    python benchmarks/raster_skip_counts.py [--n 1000000] [--scene small bench_splat] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import warp as wp

import arc_warp
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS, TILE_SIZE, Splat2D
from arc_warp._src.splat.raster_batch_funcs import splat_quad
from arc_warp._src.splat.raster_kernels import SUB_H, SUB_W, subtile_mask, tile_pixel

WIDTH, HEIGHT = 1920, 1080
WARPS = BLOCK_PIXELS // 32


@wp.kernel(enable_backward=False)
def count_warp_entries(
    gauss_ids: wp.array(dtype=wp.int32),
    ranges: wp.array(dtype=wp.vec2i),
    splats: wp.array(dtype=Splat2D),
    last_ids: wp.array2d(dtype=wp.int32),
    tiles_x: int,
    counts: wp.array2d(dtype=wp.int32),  # (n_tiles * 8, 2): entries walked, entries with the bit
):
    i = wp.tid()
    tp = tile_pixel(i * 32, tiles_x)  # lane 0 of warp i: its block's top-left pixel
    tile, sub, x0, y0 = tp.tile, tp.sub, tp.x, tp.y
    height = last_ids.shape[0]
    width = last_ids.shape[1]
    col0 = (tile % tiles_x) * TILE_SIZE
    row0 = (tile // tiles_x) * TILE_SIZE
    warp_last = int(-1)
    for dy in range(SUB_H):
        for dx in range(SUB_W):
            if x0 + dx < width and y0 + dy < height:
                warp_last = wp.max(warp_last, last_ids[y0 + dy, x0 + dx])
    r = ranges[tile]
    walked = int(0)
    hit = int(0)
    for e in range(r[0], wp.min(r[1], warp_last + 1)):
        g = gauss_ids[e]
        mask = subtile_mask(splat_quad(splats, g, 0), splat_quad(splats, g, 1), col0, row0)
        walked += 1
        hit += (mask >> sub) & 1
    counts[i, 0] = walked
    counts[i, 1] = hit


def make_scene(kind: str, n: int):
    """(arrays for render_gaussians, camera): bench_train_step's small-regime scene (its
    raw parameters activated) or bench_splat's scene, drawn by those scripts."""
    if kind == "bench_splat":
        import bench_splat

        scene = bench_splat.make_scene(n)
        return [scene[k] for k in ("means", "quats", "scales", "opacities", "sh")], scene["camera"]
    import bench_train_step  # needs torch

    raw, _, ks = bench_train_step.make_scene(n, "small", WIDTH, HEIGHT, 1)
    quats = raw["quats"] / raw["quats"].norm(dim=1, keepdim=True)
    arrays = [raw["means"], quats, raw["log_scales"].exp(), raw["logit_opacities"].sigmoid(), raw["sh"]]
    k = ks[0].tolist()
    return [a.numpy() for a in arrays], arc_warp.Camera(k[0][0], k[1][1], k[0][2], k[1][2], WIDTH, HEIGHT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--scene", nargs="+", choices=("small", "bench_splat"), default=["small", "bench_splat"])
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    device = wp.get_device(args.device)
    for kind in args.scene:
        t0 = time.perf_counter()
        host, cam = make_scene(kind, args.n)
        arrays = [wp.array(a, dtype=d, device=device)
                  for a, d in zip(host, (wp.vec3, wp.vec4, wp.vec3, float, wp.vec3))]
        out = arc_warp.render_gaussians(*arrays, cam)
        bins, images = out._bins, out._images
        n_warps = bins.tiles_x * bins.tiles_y * WARPS
        counts = wp.zeros((n_warps, 2), dtype=wp.int32, device=device)
        wp.launch(count_warp_entries, n_warps, [bins.gauss_ids, bins.tile_ranges, out._project.splats,
                                                 images.last_ids, bins.tiles_x, counts], device=device)
        walked, hit = counts.numpy().astype(np.int64).sum(0)
        print(f"{kind} N={args.n} {WIDTH}x{HEIGHT}: {bins.n_isects} tile entries; raster backward "
              f"warp-entry evaluations {walked} -> {hit} ({hit / max(walked, 1):.3f}, "
              f"{walked - hit} skipped) [{time.perf_counter() - t0:.0f} s on {device}]", flush=True)


if __name__ == "__main__":
    main()
