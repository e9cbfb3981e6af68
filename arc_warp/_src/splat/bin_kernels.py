"""Tile binning: one (tile, depth) key per Gaussian-tile overlap, and per-tile ranges."""

import warp as wp

from arc_warp._src.splat.geometry_funcs import Splat2D, float_bits, footprint, row_span, tile_bbox

INT32_MAX = 2**31 - 1


@wp.kernel(enable_backward=False)
def copy_last(src: wp.array(dtype=wp.int64), dst: wp.array(dtype=wp.int32)):
    """``dst[0] = min(src[-1], 2^31 - 1)``: the intersection total (saturated), next to the
    input flags for one readback."""
    dst[0] = wp.int32(wp.min(src[src.shape[0] - 1], wp.int64(INT32_MAX)))


@wp.kernel(enable_backward=False)
def write_keys(
    splats: wp.array(dtype=Splat2D),
    radii: wp.array(dtype=wp.vec2i),
    tiles_per_gauss: wp.array(dtype=wp.int64),
    cum_tiles: wp.array(dtype=wp.int64),
    tiles_x: int,
    tiles_y: int,
    keys: wp.array(dtype=wp.int64),
    gauss_ids: wp.array(dtype=wp.int32),
):
    """Keys ``tile << 32 | depth bits`` of the tiles ``count_tiles`` counted, in the same
    ``row_span`` walk; writes exactly ``tiles_per_gauss[i]`` entries (a shortfall, which the
    shared walk rules out, would get keys of tile ``tiles_x * tiles_y``, which sort last
    and belong to no range)."""
    i = wp.tid()
    count = tiles_per_gauss[i]
    if count == wp.int64(0):
        return
    splat = splats[i]
    geom = splat.geom
    f = footprint(geom, splat.conic)
    box = tile_bbox(wp.vec2(geom[0], geom[1]), radii[i], tiles_x, tiles_y)
    # depth > near > 0, so its float bits sort like the depth (gsplat's key)
    depth_key = wp.int64(float_bits(geom[3]))
    # the host checked that the total fits an int32 index
    end = int(cum_tiles[i])
    k = int(cum_tiles[i] - count)
    for ty in range(box[1], box[3]):
        span = row_span(f, ty, box)
        for tx in range(span[0], span[1]):
            if k < end:
                keys[k] = (wp.int64(ty * tiles_x + tx) << wp.int64(32)) | depth_key
                gauss_ids[k] = i
            k += 1
    while k < end:
        keys[k] = (wp.int64(tiles_x * tiles_y) << wp.int64(32)) | depth_key
        gauss_ids[k] = i
        k += 1


@wp.kernel(enable_backward=False)
def tile_ranges(keys: wp.array(dtype=wp.int64), n_isects: int, ranges: wp.array(dtype=wp.vec2i)):
    """[start, end) of each tile in the sorted keys; tiles without entries keep (0, 0)."""
    i = wp.tid()
    tile = int(keys[i] >> wp.int64(32))
    if tile >= ranges.shape[0]:
        return
    if i == 0 or int(keys[i - 1] >> wp.int64(32)) != tile:
        ranges[tile][0] = i
    if i == n_isects - 1 or int(keys[i + 1] >> wp.int64(32)) != tile:
        ranges[tile][1] = i + 1
