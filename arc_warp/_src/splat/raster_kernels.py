"""Tile rasteriser: front-to-back compositing and its hand-written backward.

Both kernels run one 256-thread block per 16x16 tile (``tile_pixel``). A block walks
its tile's depth-sorted range in batches of ``block_dim`` entries staged in shared
memory (``batch_funcs``): each thread loads one entry, then every thread reads the
batch with broadcast shared loads. All threads reach every barrier, pixels outside the
image included. In the backward all lanes of a warp read the same entry at a time, so
they reach the accumulator together and with one index.
"""

import functools

import warp as wp

from arc_warp._src.splat.raster_batch_funcs import (
    CONIC,
    GEOM,
    RGB,
    batch_buffer,
    batch_get,
    batch_rank,
    batch_stage,
    block_count,
    block_sync,
    lockstep_any,
    lockstep_max,
    splat_quad,
)
from arc_warp._src.splat.geometry_funcs import (
    ALPHA_MAX,
    ALPHA_MIN,
    BLOCK_PIXELS,
    G_ABS,
    G_CONIC,
    G_DEPTH,
    G_OPACITY,
    G_RGB,
    G_XY,
    T_MIN,
    Splat2D,
    float_bits,
    gaussian_power,
    grad_vector,
    tile_pixel,
)


@wp.func
def stage_entry(
    buf: wp.uint64,
    slot: int,
    gauss_ids: wp.array(dtype=wp.int32),
    splats: wp.array(dtype=Splat2D),
    colors: wp.array(dtype=wp.vec3),
    k: int,
    valid: bool,
):
    """Stages sorted entry ``k`` in batch ``slot`` (nothing if not ``valid``)."""
    if valid:
        g = gauss_ids[k]
        batch_stage(buf, slot, splat_quad(splats, g, 0), splat_quad(splats, g, 1), colors[g], g)


# 8 blocks per SM caps registers at 32: full occupancy (the one spill is outside the loops)
@wp.kernel(
    enable_backward=False,
    module_options={"fast_math": True},
    module="unique",
    launch_bounds=(BLOCK_PIXELS, 8),
)
def raster_fwd(
    gauss_ids: wp.array(dtype=wp.int32),
    ranges: wp.array(dtype=wp.vec2i),
    splats: wp.array(dtype=Splat2D),
    colors: wp.array(dtype=wp.vec3),
    width: int,
    height: int,
    tiles_x: int,
    background: wp.vec3,
    out_color: wp.array2d(dtype=wp.vec3),
    out_alpha: wp.array2d(dtype=float),
    out_depth: wp.array2d(dtype=float),
    out_expected_depth: wp.array2d(dtype=float),
    out_final_t: wp.array2d(dtype=float),
    out_last: wp.array2d(dtype=wp.int32),
):
    tp = tile_pixel(wp.tid(), tiles_x)
    x = tp[1]
    y = tp[2]
    inside = x < width and y < height
    px = float(x) + 0.5
    py = float(y) + 0.5
    r = ranges[tp[0]]
    buf = batch_buffer()
    rank = batch_rank()
    size = wp.block_dim()
    t = float(1.0)
    rgb = wp.vec3(0.0)
    depth = float(0.0)
    last = int(-1)
    done = not inside
    start = r[0]
    while start < r[1]:
        # the barrier also tells the block that the previous batch is no longer read
        if block_count(done) == size:
            break
        stage_entry(buf, rank, gauss_ids, splats, colors, start + rank, start + rank < r[1])
        block_sync()
        if not done:
            for j in range(wp.min(size, r[1] - start)):
                geom = batch_get(buf, GEOM, j)
                pw = gaussian_power(geom, batch_get(buf, CONIC, j), px, py)
                alpha = wp.min(ALPHA_MAX, geom[2] * wp.exp(-pw[0]))
                if pw[0] < 0.0 or alpha < ALPHA_MIN:
                    continue
                next_t = t * (1.0 - alpha)
                if next_t <= T_MIN:
                    done = True
                    break
                w = alpha * t
                c = batch_get(buf, RGB, j)
                rgb += w * wp.vec3(c[0], c[1], c[2])
                depth += w * geom[3]
                last = start + j
                t = next_t
        start += size
    if inside:
        alpha_out = 1.0 - t
        out_color[y, x] = rgb + t * background
        out_alpha[y, x] = alpha_out
        out_depth[y, x] = depth
        expected = float(0.0)
        if alpha_out > 0.0:
            expected = depth / alpha_out
        out_expected_depth[y, x] = expected
        out_final_t[y, x] = t
        out_last[y, x] = last


@functools.cache
def make_raster_bwd(mode: str, absgrad: bool):
    """Backward of ``raster_fwd``; ``mode`` picks the accumulator (a compile-time choice).

    Launch with ``dim = n_tiles * 256, block_dim = 256``. Batches run back to front from
    the block's last contributor; a warp starts each batch at its own last contributor.
    Threads of pixels outside the image run the loop with nothing to add: every lane
    must reach the plan and, in a reducing warp, the reducer.
    """
    from arc_warp._src.arc.reduce_funcs import lane_adder, warp_plan, warp_reducer

    grad_t = grad_vector(absgrad)
    # Plan first, then compute inside the branch that adds (see warp_plan). All lanes of
    # a warp read the same batch entry, hence reduce with one index.
    plan = warp_plan(mode)  # never True for atomic and floor
    reduce = warp_reducer(grad_t, mode, uniform_index=True)
    lane_add = lane_adder(grad_t, mode)

    def entry_gradient(
        geom: wp.vec4,
        conic: wp.vec4,
        pw: wp.vec3,
        vis: float,
        alpha: float,
        ra: float,
        t: float,
        c: wp.vec3,
        rgb_behind: wp.vec3,
        depth_behind: float,
        v_rgb_px: wp.vec3,
        v_depth_px: float,
        v_final: float,
    ):
        # Gradient of one pixel's outputs with respect to one entry; t is the
        # transmittance in front of it and ra = 1 / (1 - alpha).
        opacity = geom[2]
        fac = alpha * t
        v = grad_t()
        v_alpha = (
            wp.dot(c * t - rgb_behind * ra, v_rgb_px)
            + (geom[3] * t - depth_behind * ra) * v_depth_px
            + v_final * ra
        )
        v[G_RGB] = fac * v_rgb_px[0]
        v[G_RGB + 1] = fac * v_rgb_px[1]
        v[G_RGB + 2] = fac * v_rgb_px[2]
        v[G_DEPTH] = fac * v_depth_px
        if opacity * vis <= ALPHA_MAX:  # alpha not clamped
            v_power = -opacity * vis * v_alpha
            dx = pw[1]
            dy = pw[2]
            v[G_CONIC] = 0.5 * v_power * dx * dx
            v[G_CONIC + 1] = v_power * dx * dy
            v[G_CONIC + 2] = 0.5 * v_power * dy * dy
            v[G_XY] = v_power * (conic[0] * dx + conic[1] * dy)
            v[G_XY + 1] = v_power * (conic[1] * dx + conic[2] * dy)
            if wp.static(absgrad):
                v[G_ABS] = wp.abs(v[G_XY])
                v[G_ABS + 1] = wp.abs(v[G_XY + 1])
            v[G_OPACITY] = vis * v_alpha
        return v

    entry_gradient = wp.func(entry_gradient, name=f"raster_entry_gradient_{int(absgrad)}", module="unique")

    # 4 blocks per SM caps registers at 64; the reducing modes keep 48 bytes on the stack
    # there (sm_90), and still ran faster than the accumulate-after-compute kernel (BENCHMARKS)
    @wp.kernel(
        enable_backward=False,
        module_options={"fast_math": True},
        module="unique",
        launch_bounds=(BLOCK_PIXELS, 4),
    )
    def raster_bwd(
        gauss_ids: wp.array(dtype=wp.int32),
        ranges: wp.array(dtype=wp.vec2i),
        splats: wp.array(dtype=Splat2D),
        colors: wp.array(dtype=wp.vec3),
        width: int,
        height: int,
        tiles_x: int,
        background: wp.vec3,
        final_t: wp.array2d(dtype=float),
        last_ids: wp.array2d(dtype=wp.int32),
        depth_img: wp.array2d(dtype=float),
        v_color: wp.array2d(dtype=wp.vec3),
        v_alpha_img: wp.array2d(dtype=float),
        v_depth_img: wp.array2d(dtype=float),
        v_expected_img: wp.array2d(dtype=float),
        threshold: int,
        out_grads: wp.array(dtype=grad_t),
    ):
        tp = tile_pixel(wp.tid(), tiles_x)
        x = tp[1]
        y = tp[2]
        px = float(x) + 0.5
        py = float(y) + 0.5
        t_final = float(1.0)
        last = int(-1)  # outside pixels: no entry is valid
        v_rgb_px = wp.vec3(0.0)
        v_alpha_px = float(0.0)
        v_depth_px = float(0.0)
        if x < width and y < height:
            t_final = final_t[y, x]
            last = last_ids[y, x]
            v_rgb_px = v_color[y, x]
            v_alpha_px = v_alpha_img[y, x]
            v_depth_px = v_depth_img[y, x]
            # expected depth = depth / alpha, folded into the depth and alpha gradients
            alpha_out = 1.0 - t_final
            if alpha_out > 0.0:
                v_ed = v_expected_img[y, x]
                v_depth_px += v_ed / alpha_out
                v_alpha_px -= v_ed * depth_img[y, x] / (alpha_out * alpha_out)
        # d(output)/d(alpha_i) terms that do not depend on i: alpha and background
        v_final = t_final * (v_alpha_px - wp.dot(background, v_rgb_px))

        # entries behind every pixel's last contributor are skipped block-wide, and
        # behind the warp's last contributor warp-wide
        block_last = wp.tile_max(wp.tile(last))[0]
        warp_last = lockstep_max(last)
        r = ranges[tp[0]]
        buf = batch_buffer()
        rank = batch_rank()
        size = wp.block_dim()
        t = t_final
        rgb_behind = wp.vec3(0.0)
        depth_behind = float(0.0)
        hi = wp.min(r[1], block_last + 1)  # batch [lo, hi), slot s holds entry hi - 1 - s
        while hi > r[0]:
            lo = wp.max(r[0], hi - size)
            block_sync()  # the previous batch is no longer read
            stage_entry(buf, rank, gauss_ids, splats, colors, hi - 1 - rank, hi - 1 - rank >= lo)
            block_sync()
            for s in range(wp.max(0, hi - 1 - warp_last), hi - lo):
                geom = batch_get(buf, GEOM, s)
                conic = batch_get(buf, CONIC, s)
                pw = gaussian_power(geom, conic, px, py)
                vis = wp.exp(-pw[0])
                opacity = geom[2]
                alpha = wp.min(ALPHA_MAX, opacity * vis)
                valid = hi - 1 - s <= last and not (pw[0] < 0.0 or alpha < ALPHA_MIN)
                # most entries reach no pixel of a warp: skip them before planning
                if lockstep_any(valid):
                    ra = 1.0 / (1.0 - alpha)
                    t_in_front = t * ra
                    c4 = batch_get(buf, RGB, s)
                    c = wp.vec3(c4[0], c4[1], c4[2])
                    index = float_bits(conic[3])
                    if plan(valid, threshold):
                        # every lane computes (invalid lanes' values are ignored)
                        grad = entry_gradient(geom, conic, pw, vis, alpha, ra, t_in_front, c, rgb_behind,
                                              depth_behind, v_rgb_px, v_depth_px, v_final)
                        reduce(out_grads, index, grad, valid, threshold)
                    elif valid:
                        grad = entry_gradient(geom, conic, pw, vis, alpha, ra, t_in_front, c, rgb_behind,
                                              depth_behind, v_rgb_px, v_depth_px, v_final)
                        lane_add(out_grads, index, grad, True, threshold)
                    if valid:
                        fac = alpha * t_in_front
                        t = t_in_front
                        rgb_behind += fac * c
                        depth_behind += fac * geom[3]
            hi = lo

    return raster_bwd
