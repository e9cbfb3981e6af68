"""Tile binning: count overlaps, read the total back once, sort (tile, depth) keys."""

import numpy as np
import warp as wp
import warp.utils

from arc_warp._src.splat.bin_kernels import copy_last, tile_ranges, write_keys
from arc_warp._src.splat.geometry_funcs import TILE_SIZE
from arc_warp._src.splat.records import BinResult, ProjectResult
from arc_warp._src.splat.validate import check_intersections

# tile ids and the sentinel tile n_tiles must fit the 31 bits above the depth in a key
MAX_TILES = 2**31 - 2


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """Number of 16x16 tiles along x and y; ValueError if the tile ids cannot fit a key."""
    tiles_x, tiles_y = (width + TILE_SIZE - 1) // TILE_SIZE, (height + TILE_SIZE - 1) // TILE_SIZE
    if tiles_x * tiles_y > MAX_TILES:
        raise ValueError(
            f"render_gaussians: a {width}x{height} image has {tiles_x * tiles_y} tiles of {TILE_SIZE}x{TILE_SIZE}, "
            f"more than the {MAX_TILES} a sort key can hold; render it in crops"
        )
    return tiles_x, tiles_y


def count_intersections(proj: ProjectResult, flags: wp.array) -> tuple[wp.array, np.ndarray]:
    """Inclusive int64 scan of the per-Gaussian tile counts, and ``flags`` read back to the host.

    ``flags[0]`` receives the intersection total (saturated at 2^31 - 1), so this single
    readback (the one host sync of the forward) returns the sort size together with the
    input-check flags.
    """
    device = proj.radii.device
    cum_tiles = wp.empty_like(proj.tiles_per_gauss)
    wp.utils.array_scan(proj.tiles_per_gauss, cum_tiles, inclusive=True)
    wp.launch(copy_last, dim=1, inputs=[cum_tiles], outputs=[flags], device=device, record_tape=False)
    return cum_tiles, flags.numpy()


def sort_intersections(
    proj: ProjectResult, cum_tiles: wp.array, n_isects: int, tiles_x: int, tiles_y: int
) -> BinResult:
    """Keys ``tile << 32 | depth bits`` sorted stably (equal keys keep Gaussian order).

    ``n_isects`` is ``flags[0]`` from :func:`count_intersections`; a total too large for one
    sort raises ValueError before anything is allocated.
    """
    device = proj.radii.device
    n_tiles = tiles_x * tiles_y
    check_intersections(n_isects, lambda: int(cum_tiles[-1:].numpy()[0]), proj.radii.shape[0], tiles_x, tiles_y)
    # radix_sort_pairs works in place and needs room for 2 * count
    keys = wp.empty(2 * n_isects, dtype=wp.int64, device=device)
    gauss_ids = wp.empty(2 * n_isects, dtype=wp.int32, device=device)
    ranges = wp.zeros(n_tiles, dtype=wp.vec2i, device=device)
    if n_isects > 0:
        wp.launch(
            write_keys,
            dim=proj.radii.shape[0],
            inputs=[proj.splats, proj.radii, proj.tiles_per_gauss, cum_tiles, tiles_x, tiles_y],
            outputs=[keys, gauss_ids],
            device=device,
            record_tape=False,
        )
        wp.utils.radix_sort_pairs(keys, gauss_ids, n_isects, 0, 32 + n_tiles.bit_length())
        wp.launch(
            tile_ranges, dim=n_isects, inputs=[keys, n_isects], outputs=[ranges], device=device, record_tape=False
        )
    return BinResult(tiles_x=tiles_x, tiles_y=tiles_y, n_isects=n_isects, gauss_ids=gauss_ids, tile_ranges=ranges)
