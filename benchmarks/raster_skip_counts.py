"""Warp-entry evaluations of the raster backward with and without its subtile skip.

The backward's warp (an 8x4 pixel block of a 16x16 tile) walks its tile's entries back
to front from the warp's last contributor (the largest ``last_ids`` of its pixels), so
without the skip it evaluates every entry in ``[range start, warp's last]``; with it,
only those whose ``subtile_mask`` has the warp's bit. Both are counted from a real
render (projection, binning and forward on any device, the CPU included), per 32-lane
warp as on a GPU, by a kernel that calls ``subtile_mask`` itself.

Scenes: ``small`` is bench_train_step's small regime (std-devs 0.3-1.5 px at the
depth), ``bench_splat`` that benchmark's scene (both SH degree 3, 1920x1080).

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


def make_scene(kind: str, n: int, seed: int = 0):
    """(arrays for render_gaussians, camera) of bench_train_step's small regime or bench_splat's scene."""
    rng = np.random.default_rng(seed)
    f = 0.5 * WIDTH / np.tan(np.radians(30.0))
    z = rng.uniform(2.0, 12.0, n)
    u, v = rng.uniform(0, WIDTH, n), rng.uniform(0, HEIGHT, n)
    means = np.stack([(u - WIDTH / 2) / f * z, (v - HEIGHT / 2) / f * z, z], 1)
    if kind == "small":
        scales = np.exp(rng.uniform(np.log(0.3), np.log(1.5), (n, 3))) * z[:, None] / f
        opacities = rng.uniform(0.05, 0.95, n)
    else:
        scales = np.exp(rng.uniform(np.log(0.004), np.log(0.025), (n, 3))) * (1e6 / n) ** (1 / 3)
        opacities = rng.uniform(0.05, 1.0, n)
    quats = rng.standard_normal((n, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    sh = np.zeros((n, 16, 3))
    sh[:, 0] = rng.uniform(-1.5, 1.5, (n, 3))
    sh[:, 1:] = rng.standard_normal((n, 15, 3)) * 0.15
    cam = arc_warp.Camera(f, f, WIDTH / 2, HEIGHT / 2, WIDTH, HEIGHT)
    return [np.float32(a) for a in (means, quats, scales, opacities, sh)], cam


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
