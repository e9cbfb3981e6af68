"""Tile binning: count overlaps, read the total back once, sort (tile, depth) keys."""

import numpy as np
import warp as wp
import warp.utils

from arc_warp._src.splat.bin_kernels import copy_last, tile_ranges, write_keys
from arc_warp._src.splat.geometry_funcs import TILE_SIZE
from arc_warp._src.splat.records import BinResult, ProjectResult
from arc_warp._src.splat.workspace import Frame


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """Number of 16x16 tiles along x and y."""
    return (width + TILE_SIZE - 1) // TILE_SIZE, (height + TILE_SIZE - 1) // TILE_SIZE


def count_intersections(proj: ProjectResult, flags: wp.array, frame: Frame) -> tuple[wp.array, np.ndarray]:
    """Inclusive scan of the per-Gaussian tile counts, and ``flags`` read back to the host.

    ``flags[0]`` receives the intersection total, so this single readback (the one host
    sync of the forward) returns the sort size together with the input-check flags.
    """
    cum_tiles = frame.shared.array("cum_tiles", proj.tiles_per_gauss.shape, wp.int32)
    wp.utils.array_scan(proj.tiles_per_gauss, cum_tiles, inclusive=True)
    frame.launch(copy_last, 1, [cum_tiles, flags])
    return cum_tiles, flags.numpy()


def sort_intersections(
    proj: ProjectResult, cum_tiles: wp.array, n_isects: int, tiles_x: int, tiles_y: int, frame: Frame
) -> BinResult:
    """Keys ``tile << 32 | depth bits`` sorted stably (equal keys keep Gaussian order).

    The sort buffers come from ``frame`` with spare capacity, so a count that varies a
    little between steps reuses them."""
    n_tiles = tiles_x * tiles_y
    # radix_sort_pairs works in place and needs room for 2 * count
    keys = frame.shared.capacity("sort_keys", 2 * n_isects, wp.int64)
    gauss_ids = frame.capacity("sort_ids", 2 * n_isects, wp.int32)
    ranges = frame.array("tile_ranges", n_tiles, wp.vec2i, zero=True)
    if n_isects > 0:
        frame.launch(
            write_keys,
            proj.radii.shape[0],
            [
                proj.splats,
                proj.radii,
                proj.tiles_per_gauss,
                cum_tiles,
                tiles_x,
                tiles_y,
                keys,
                gauss_ids,
            ],
        )
        wp.utils.radix_sort_pairs(keys, gauss_ids, n_isects, 0, 32 + n_tiles.bit_length())
        frame.launch(tile_ranges, n_isects, [keys, n_isects, ranges])
    return BinResult(tiles_x=tiles_x, tiles_y=tiles_y, n_isects=n_isects, gauss_ids=gauss_ids, tile_ranges=ranges)
