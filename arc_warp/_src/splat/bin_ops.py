"""Tile binning: depth-order the Gaussians, count their tile overlaps, write the tile keys
front to back into a sort of a given size and sort them stably by tile.

The projection writes the tile counts and the depth sort's keys and identity order;
:func:`count_intersections` sorts by depth, gathers the counts in that order, scans them
and stores the total (and whether it passed the sort's capacity) in the camera's flags;
:func:`sort_intersections` writes the tile keys, the filler tile past the total, and
sorts them by tile. The sort holds ``capacity`` entries, chosen before the total is known
(``renderer.GaussianRenderer.capacity``)."""

from __future__ import annotations

import warp as wp
import warp.utils

from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.launches import Launches
from arc_warp._src.splat.bin_kernels import (
    STAGED_KEYS_PER_GAUSSIAN, gather_counts, store_total, tile_ranges, write_keys, write_keys_staged,
)
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS, TILE_SIZE
from arc_warp._src.splat.validate_kernels import OVERFLOW_SLOT

# the rasteriser runs one thread per pixel of the tile grid with int32 thread ids (which
# also keeps the tile keys, filler tile n_tiles included, in int32)
MAX_TILES = (2**31 - 1) // BLOCK_PIXELS
# write_keys_staged's block, whose threads stage their keys in shared memory together
WRITE_KEYS_BLOCK = 256


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """Number of 16x16 tiles along x and y; ValueError past ``MAX_TILES`` (about 2^31 pixels)."""
    tiles_x, tiles_y = (width + TILE_SIZE - 1) // TILE_SIZE, (height + TILE_SIZE - 1) // TILE_SIZE
    if tiles_x * tiles_y > MAX_TILES:
        raise ValueError(
            f"render_gaussians: a {width}x{height} image has {tiles_x * tiles_y} tiles of {TILE_SIZE}x{TILE_SIZE}, "
            f"more than the {MAX_TILES} one render can index; render it in crops"
        )
    return tiles_x, tiles_y


def count_intersections(launches: Launches, key, n: int, depth_keys: wp.array, order: wp.array,
                        tiles_per_gauss: wp.array, cum_tiles: wp.array, capacity: int, flags: wp.array) -> None:
    """Sorts the first ``n`` of ``depth_keys`` / ``order`` (2N int32 each: the radix sort
    works in place in twice the room) by depth, and writes ``cum_tiles`` (N,) int64, the
    inclusive scan of the tile counts in that order. ``flags[0]`` receives the total
    (saturated at 2^31 - 1) and the overflow slot whether it exceeds ``capacity``."""
    # stable: equal depths keep index order; the positive keys need 31 bits
    launches.call(wp.utils.radix_sort_pairs, depth_keys, order, n, 0, 31)
    launches.launch(gather_counts, n, [order, tiles_per_gauss, cum_tiles], key=("gather_counts", key))
    # in place (cub and the CPU scan allow it)
    launches.call(wp.utils.array_scan, cum_tiles, cum_tiles, inclusive=True)
    launches.launch(store_total, 1, [cum_tiles, capacity, flags, OVERFLOW_SLOT], key=("store_total", key))


def sort_intersections(launches: Launches, key, order: wp.array, splats: wp.array, radii: wp.array,
                       tiles_per_gauss: wp.array, cum_tiles: wp.array, tiles_x: int, tiles_y: int, capacity: int,
                       tile_keys: wp.array, gauss_ids: wp.array, ranges: wp.array) -> None:
    """Tile keys written front to back, then sorted stably by tile alone, so each tile's
    range is in depth order with equal depths in Gaussian order (as one sort of
    ``tile << 32 | depth`` keys, but radix passes over ~log2(tiles) bits, not 32 more).

    ``capacity`` entries are sorted (``tile_keys`` and ``gauss_ids`` hold 2 x capacity
    int32: the radix sort's room): entries past the total get the filler tile, entries
    past ``capacity`` are dropped (the overflow slot of the flags says so). ``ranges``
    (n_tiles,) vec2i receives each tile's [start, end) in ``gauss_ids``."""
    n_tiles = tiles_x * tiles_y
    if capacity == 0:
        launches.call(ranges.zero_)
        return
    n = order.shape[0] // 2
    args = [order, splats, radii, tiles_per_gauss, cum_tiles, tiles_x, tiles_y, capacity, tile_keys, gauss_ids]
    if capacity > STAGED_KEYS_PER_GAUSSIAN * n:  # large splats: through shared memory
        with cpu_launch_guard(launches.device):  # block barriers: whole blocks, CPU statics
            launches.launch(write_keys_staged, -(-n // WRITE_KEYS_BLOCK) * WRITE_KEYS_BLOCK, args,
                            block_dim=WRITE_KEYS_BLOCK, key=("write_keys_staged", key))
    else:
        launches.launch(write_keys, n, args, key=("write_keys", key))
    # tile ids and the filler tile n_tiles
    launches.call(wp.utils.radix_sort_pairs, tile_keys, gauss_ids, capacity, 0, n_tiles.bit_length())
    launches.launch(tile_ranges, n_tiles + 1, [tile_keys, capacity, ranges], key=("tile_ranges", key))
