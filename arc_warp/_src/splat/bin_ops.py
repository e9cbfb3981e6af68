"""Tile binning: depth-order the Gaussians, count overlaps, write tile keys front to back
into a sort of a given size and sort them stably by tile.

The projection (``project``) writes the tile counts and the depth sort's keys and
identity order into scratch carved here (:func:`forward_scratch`); the binning sorts by
depth, gathers the counts in that order and scans them (:func:`count_intersections`),
then writes the tile keys, with the filler tile past the total, and sorts them by tile
(:func:`sort_intersections`).

The sort size comes either from reading the total back (one host sync) or, without any
sync, from the workspace's capacity kept from earlier renders; the caller reads the total
back after everything is queued and re-renders on the rare overflow (``render``)."""

import warp as wp
import warp.utils

from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.splat.bin_kernels import (
    STAGED_KEYS_PER_GAUSSIAN, copy_last, gather_counts, tile_ranges, write_keys, write_keys_staged,
)
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS, TILE_SIZE
from arc_warp._src.splat.records import BinResult, DepthOrder, ProjectResult
from arc_warp._src.splat.validate import check_intersections
from arc_warp._src.splat.workspace import SCRATCH_ALIGN, Frame

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


def forward_scratch_bytes(n: int, sort_size: int = 0) -> int:
    """Bytes of the forward's stage of the scratch arena (``Frame.scratch``) for ``n``
    Gaussians (:func:`forward_scratch`): the int32 tile counts, the int32 depth order,
    the int64 scan, then the int32 depth keys, whose room the tile sort's int32 keys take
    over (:func:`sort_intersections`, for a sort of ``sort_size``); both radix sorts need
    room for twice their count; each part aligned."""
    return (4 + 8 + 8) * n + 8 * max(n, sort_size) + 4 * SCRATCH_ALIGN


def forward_scratch(arena: Frame, n: int, sort_size: int) -> tuple[wp.array, DepthOrder]:
    """The forward's stage of ``arena``'s scratch arena for ``n`` Gaussians, started with
    room for a tile sort of ``sort_size`` too (:func:`forward_scratch_bytes`): the (N,)
    int32 tile counts and the :class:`DepthOrder` parts, all of which ``project`` writes
    first (counts, depth keys, identity order). Valid until the next stage takes the
    arena (the render's backward, or the next render for the shared one)."""
    tiles_per_gauss = arena.scratch(n, wp.int32, room=forward_scratch_bytes(n, sort_size))
    # radix_sort_pairs works in place and needs room for 2 * count; the keys go last, where
    # sort_intersections' keys replace them
    order = arena.scratch(2 * n, wp.int32, after=tiles_per_gauss)
    cum_tiles = arena.scratch(n, wp.int64, after=order)
    keys = arena.scratch(2 * n, wp.int32, after=cum_tiles)
    return tiles_per_gauss, DepthOrder(order=order, cum_tiles=cum_tiles, keys=keys)


def count_intersections(proj: ProjectResult, flags: wp.array, frame: Frame) -> DepthOrder:
    """Depth order of the Gaussians and the int64 scan of their tile counts in that order:
    ``proj.depth``, whose keys and identity order ``project`` wrote, sorted and scanned.

    ``flags[0]`` receives the intersection total (saturated at 2^31 - 1), so one readback
    of ``flags`` returns the sort size together with the input-check flags. The scratch
    is the one ``project`` carved (:func:`forward_scratch`).
    """
    n = proj.radii.shape[0]
    depth = proj.depth
    # stable: equal depths keep index order; the positive keys need 31 bits
    wp.utils.radix_sort_pairs(depth.keys, depth.order, n, 0, 31)
    frame.launch(gather_counts, n, [depth.order, proj.tiles_per_gauss, depth.cum_tiles])
    wp.utils.array_scan(depth.cum_tiles, depth.cum_tiles, inclusive=True)  # in place (cub and the CPU scan allow it)
    frame.launch(copy_last, 1, [depth.cum_tiles, flags])
    return depth


def sort_intersections(
    proj: ProjectResult, depth: DepthOrder, sort_size: int, tiles_x: int, tiles_y: int, frame: Frame,
    reserve: int = 0, arena: Frame | None = None,
) -> BinResult:
    """Tile keys written front to back, then sorted stably by tile alone, so each tile's
    range is in depth order with equal depths in Gaussian order (as one sort of
    ``tile << 32 | depth`` keys, but radix passes over ~log2(tiles) bits, not 32 more).

    ``sort_size`` entries are sorted: the total read back (``flags[0]`` after
    :func:`count_intersections`), or a capacity chosen before the total is known;
    entries past the total are padded with the filler tile, entries past ``sort_size``
    are dropped (the caller re-renders then); ``write_keys`` writes both. A size too
    large for one sort raises ValueError before anything is allocated. The sort's keys
    and Gaussian ids have room for at least ``reserve`` entries, so a size that varies a
    little between steps reuses them: ``reserve`` (the workspace's kept size) already
    has 25% headroom, so they get no more on top. The ids are a buffer of ``frame`` (the
    backward reads them); the keys, read only here, are scratch of ``frame.shared``'s
    arena: in the forward's stage, over the depth keys, when the counts are there too
    (``arena`` as given to ``project``, None or ``frame.shared``), else in a stage of
    their own (a batched camera's counts are in its own frame's arena).
    ``BinResult.n_isects`` is ``sort_size`` until the caller sets the exact total.
    """
    n_tiles = tiles_x * tiles_y
    check_intersections(
        sort_size, lambda: int(depth.cum_tiles[-1:].numpy()[0]), proj.radii.shape[0], tiles_x, tiles_y
    )
    entries = max(sort_size, reserve)
    if arena is None or arena is frame.shared:
        # the room project() asked for; the first sort of an image size outgrows it
        keys = frame.shared.scratch(2 * entries, wp.int32, after=depth.cum_tiles,
                                    room=forward_scratch_bytes(proj.radii.shape[0], entries))
    else:
        keys = frame.shared.scratch(2 * entries, wp.int32, room=8 * entries)
    gauss_ids = frame.capacity("sort_ids", 2 * entries, wp.int32, headroom=False)
    ranges = frame.array("tile_ranges", n_tiles, wp.vec2i, zero=sort_size == 0)
    if sort_size > 0:
        n = proj.radii.shape[0]
        args = [depth.order, proj.splats, proj.radii, proj.tiles_per_gauss, depth.cum_tiles, tiles_x, tiles_y,
                sort_size, keys, gauss_ids]
        if sort_size > STAGED_KEYS_PER_GAUSSIAN * n:  # large splats: through shared memory
            with cpu_launch_guard(frame.device):  # block barriers: whole blocks, CPU statics
                frame.launch(write_keys_staged, -(-n // WRITE_KEYS_BLOCK) * WRITE_KEYS_BLOCK, args,
                             block_dim=WRITE_KEYS_BLOCK)
        else:
            frame.launch(write_keys, n, args)
        # tile ids and the filler tile n_tiles
        wp.utils.radix_sort_pairs(keys, gauss_ids, sort_size, 0, n_tiles.bit_length())
        frame.launch(tile_ranges, n_tiles + 1, [keys, sort_size, ranges])
    return BinResult(tiles_x=tiles_x, tiles_y=tiles_y, n_isects=sort_size, gauss_ids=gauss_ids, tile_ranges=ranges)
