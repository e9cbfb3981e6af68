"""Tile binning: one (tile, depth) key per Gaussian-tile overlap, and per-tile ranges."""

import warp as wp

from arc_warp._src.splat.geometry_funcs import Splat2D, float_bits, tile_bbox


@wp.kernel(enable_backward=False)
def copy_last(src: wp.array(dtype=wp.int32), dst: wp.array(dtype=wp.int32)):
    """``dst[0] = src[-1]``: the intersection total, next to the input flags for one readback."""
    dst[0] = src[src.shape[0] - 1]


@wp.kernel(enable_backward=False)
def write_keys(
    splats: wp.array(dtype=Splat2D),
    radii: wp.array(dtype=wp.vec2i),
    tiles_per_gauss: wp.array(dtype=wp.int32),
    cum_tiles: wp.array(dtype=wp.int32),
    tiles_x: int,
    tiles_y: int,
    keys: wp.array(dtype=wp.int64),
    gauss_ids: wp.array(dtype=wp.int32),
):
    i = wp.tid()
    count = tiles_per_gauss[i]
    if count == 0:
        return
    geom = splats[i].geom
    box = tile_bbox(wp.vec2(geom[0], geom[1]), radii[i], tiles_x, tiles_y)
    # depth > near > 0, so its float bits sort like the depth (gsplat's key)
    depth_key = wp.int64(float_bits(geom[3]))
    k = cum_tiles[i] - count
    for ty in range(box[1], box[3]):
        for tx in range(box[0], box[2]):
            keys[k] = (wp.int64(ty * tiles_x + tx) << wp.int64(32)) | depth_key
            gauss_ids[k] = i
            k += 1


@wp.kernel(enable_backward=False)
def tile_ranges(keys: wp.array(dtype=wp.int64), n_isects: int, ranges: wp.array(dtype=wp.vec2i)):
    """[start, end) of each tile in the sorted keys; tiles without entries keep (0, 0)."""
    i = wp.tid()
    tile = int(keys[i] >> wp.int64(32))
    if i == 0 or int(keys[i - 1] >> wp.int64(32)) != tile:
        ranges[tile][0] = i
    if i == n_isects - 1 or int(keys[i + 1] >> wp.int64(32)) != tile:
        ranges[tile][1] = i + 1
