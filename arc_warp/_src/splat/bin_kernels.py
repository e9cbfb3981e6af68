"""Tile binning: Gaussians in depth order, one tile key per Gaussian-tile overlap written in
that order, and per-tile ranges of the (stably) tile-sorted keys. The depth keys are
written by the projection (``project_kernels.project_one``)."""

import warp as wp

from arc_warp._src.splat.geometry_funcs import Splat2D, footprint, row_span, tile_bbox

# depth key of a Gaussian without tiles (sorts after every depth's float bits)
INT32_MAX = 2**31 - 1


@wp.kernel(enable_backward=False)
def gather_counts(
    order: wp.array(dtype=wp.int32), tiles_per_gauss: wp.array(dtype=wp.int32), counts: wp.array(dtype=wp.int64)
):
    """Tile counts in depth order, widened to int64 for the scan (their sum may pass 2^31)."""
    j = wp.tid()
    counts[j] = wp.int64(tiles_per_gauss[order[j]])


@wp.kernel(enable_backward=False)
def copy_last(src: wp.array(dtype=wp.int64), dst: wp.array(dtype=wp.int32)):
    """``dst[0] = min(src[-1], 2^31 - 1)``: the intersection total (saturated), next to the
    input flags for one readback."""
    dst[0] = wp.int32(wp.min(src[src.shape[0] - 1], wp.int64(INT32_MAX)))


@wp.kernel(enable_backward=False)
def write_keys(
    order: wp.array(dtype=wp.int32),
    splats: wp.array(dtype=Splat2D),
    radii: wp.array(dtype=wp.vec2i),
    tiles_per_gauss: wp.array(dtype=wp.int32),
    cum_tiles: wp.array(dtype=wp.int64),
    tiles_x: int,
    tiles_y: int,
    capacity: int,
    keys: wp.array(dtype=wp.int32),
    gauss_ids: wp.array(dtype=wp.int32),
):
    """Tile keys of the ``j``-th Gaussian in depth order, for the tiles ``count_tiles``
    counted, in the same ``row_span`` walk; writes exactly ``tiles_per_gauss[i]`` entries
    (a shortfall, which the shared walk rules out, would get the filler tile
    ``tiles_x * tiles_y``, which sorts last and belongs to no range). Entries from
    ``capacity`` on are dropped: the sort was sized before the total was known, and the
    host re-renders when the total it reads back exceeds ``capacity``. The entries from
    the total up to ``capacity`` get the filler tile, so the sort puts only real keys
    ahead of them; the N threads share them in a grid-stride loop (one launch less)."""
    j = wp.tid()
    filler = tiles_x * tiles_y
    n = cum_tiles.shape[0]
    pad = cum_tiles[n - 1] + wp.int64(j)
    while pad < wp.int64(capacity):
        keys[int(pad)] = filler
        pad += wp.int64(n)
    i = order[j]
    count = wp.int64(tiles_per_gauss[i])
    start = cum_tiles[j] - count
    if count == wp.int64(0) or start >= wp.int64(capacity):
        return
    splat = splats[i]
    geom = splat.geom
    f = footprint(geom, splat.conic)
    box = tile_bbox(wp.vec2(geom[0], geom[1]), radii[i], tiles_x, tiles_y)
    # both fit an int32 index now: start < capacity and end is clamped to it
    end = int(wp.min(cum_tiles[j], wp.int64(capacity)))
    k = int(start)
    for ty in range(box[1], box[3]):
        span = row_span(f, ty, box)
        for tx in range(span[0], span[1]):
            if k < end:
                keys[k] = ty * tiles_x + tx
                gauss_ids[k] = i
            k += 1
    while k < end:
        keys[k] = filler
        gauss_ids[k] = i
        k += 1


@wp.kernel(enable_backward=False)
def tile_ranges(keys: wp.array(dtype=wp.int32), n_isects: int, ranges: wp.array(dtype=wp.vec2i)):
    """[start, end) of each tile in the sorted keys; tiles without entries keep (0, 0)."""
    i = wp.tid()
    tile = keys[i]
    if tile >= ranges.shape[0]:
        return
    if i == 0 or keys[i - 1] != tile:
        ranges[tile][0] = i
    if i == n_isects - 1 or keys[i + 1] != tile:
        ranges[tile][1] = i + 1
