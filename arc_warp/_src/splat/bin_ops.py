"""Tile binning: depth-order the Gaussians, count overlaps, read the total back once, write
tile keys front to back and sort them stably by tile."""

import numpy as np
import warp as wp
import warp.utils

from arc_warp._src.splat.bin_kernels import copy_last, depth_keys, gather_counts, tile_ranges, write_keys
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS, TILE_SIZE
from arc_warp._src.splat.records import BinResult, DepthOrder, ProjectResult
from arc_warp._src.splat.validate import check_intersections
from arc_warp._src.splat.workspace import Frame

# the rasteriser runs one thread per pixel of the tile grid with int32 thread ids (which
# also keeps the tile keys, filler tile n_tiles included, in int32)
MAX_TILES = (2**31 - 1) // BLOCK_PIXELS


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """Number of 16x16 tiles along x and y; ValueError past ``MAX_TILES`` (about 2^31 pixels)."""
    tiles_x, tiles_y = (width + TILE_SIZE - 1) // TILE_SIZE, (height + TILE_SIZE - 1) // TILE_SIZE
    if tiles_x * tiles_y > MAX_TILES:
        raise ValueError(
            f"render_gaussians: a {width}x{height} image has {tiles_x * tiles_y} tiles of {TILE_SIZE}x{TILE_SIZE}, "
            f"more than the {MAX_TILES} one render can index; render it in crops"
        )
    return tiles_x, tiles_y


def count_intersections(proj: ProjectResult, flags: wp.array, frame: Frame) -> tuple[DepthOrder, np.ndarray]:
    """Depth order of the Gaussians, the int64 scan of their tile counts in that order, and
    ``flags`` read back to the host.

    ``flags[0]`` receives the intersection total (saturated at 2^31 - 1), so this single
    readback (the one host sync of the forward) returns the sort size together with the
    input-check flags. Scratch comes from ``frame.shared``: it lives for one render call.
    """
    n = proj.radii.shape[0]
    shared = frame.shared
    # radix_sort_pairs works in place and needs room for 2 * count
    keys = shared.array("depth_keys", 2 * n, wp.int32)
    order = shared.array("depth_order", 2 * n, wp.int32)
    counts = shared.array("depth_counts", n, wp.int64)
    cum_tiles = shared.array("cum_tiles", n, wp.int64)
    frame.launch(depth_keys, n, [proj.splats, proj.tiles_per_gauss, keys, order])
    # stable: equal depths keep index order; the positive keys need 31 bits
    wp.utils.radix_sort_pairs(keys, order, n, 0, 31)
    frame.launch(gather_counts, n, [order, proj.tiles_per_gauss, counts])
    wp.utils.array_scan(counts, cum_tiles, inclusive=True)
    frame.launch(copy_last, 1, [cum_tiles, flags])
    return DepthOrder(order=order, cum_tiles=cum_tiles), flags.numpy()


def sort_intersections(
    proj: ProjectResult, depth: DepthOrder, n_isects: int, tiles_x: int, tiles_y: int, frame: Frame
) -> BinResult:
    """Tile keys written front to back, then sorted stably by tile alone, so each tile's
    range is in depth order with equal depths in Gaussian order (as one sort of
    ``tile << 32 | depth`` keys, but radix passes over ~log2(tiles) bits, not 32 more).

    ``n_isects`` is ``flags[0]`` from :func:`count_intersections`; a total too large for one
    sort raises ValueError before anything is allocated. The sort buffers come from
    ``frame`` with spare capacity, so a count that varies a little between steps reuses them.
    """
    n_tiles = tiles_x * tiles_y
    check_intersections(
        n_isects, lambda: int(depth.cum_tiles[-1:].numpy()[0]), proj.radii.shape[0], tiles_x, tiles_y
    )
    keys = frame.shared.capacity("sort_keys", 2 * n_isects, wp.int32)
    gauss_ids = frame.capacity("sort_ids", 2 * n_isects, wp.int32)
    ranges = frame.array("tile_ranges", n_tiles, wp.vec2i, zero=True)
    if n_isects > 0:
        frame.launch(
            write_keys,
            proj.radii.shape[0],
            [depth.order, proj.splats, proj.radii, proj.tiles_per_gauss, depth.cum_tiles, tiles_x, tiles_y,
             keys, gauss_ids],
        )
        # tile ids and the filler tile n_tiles
        wp.utils.radix_sort_pairs(keys, gauss_ids, n_isects, 0, n_tiles.bit_length())
        frame.launch(tile_ranges, n_isects, [keys, n_isects, ranges])
    return BinResult(tiles_x=tiles_x, tiles_y=tiles_y, n_isects=n_isects, gauss_ids=gauss_ids, tile_ranges=ranges)
