"""Tile rasteriser: front-to-back compositing and its hand-written backward.

Both kernels run one 256-thread block per 16x16 tile (``tile_pixel``); every thread of
a block walks the same depth-sorted range of its tile, so the Gaussian loads are
broadcasts and, in the backward, all lanes of a warp reach the accumulator together.
"""

import functools

import warp as wp

from arc_warp._src.splat.math import (
    ALPHA_MAX,
    ALPHA_MIN,
    G_ABS,
    G_CONIC,
    G_DEPTH,
    G_OPACITY,
    G_RGB,
    G_XY,
    T_MIN,
    Splat2D,
    gaussian_power,
    grad_vector,
    tile_pixel,
)


@wp.kernel(enable_backward=False, module_options={"fast_math": True}, module="unique")
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
    if x >= width or y >= height:
        return
    px = float(x) + 0.5
    py = float(y) + 0.5
    r = ranges[tp[0]]
    t = float(1.0)
    rgb = wp.vec3(0.0)
    depth = float(0.0)
    last = int(-1)
    for k in range(r[0], r[1]):
        g = gauss_ids[k]
        s = splats[g]
        pw = gaussian_power(s, px, py)
        alpha = wp.min(ALPHA_MAX, s.opacity * wp.exp(-pw[0]))
        if pw[0] < 0.0 or alpha < ALPHA_MIN:
            continue
        next_t = t * (1.0 - alpha)
        if next_t <= T_MIN:
            break
        w = alpha * t
        rgb += w * colors[g]
        depth += w * s.depth
        last = k
        t = next_t
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

    Launch with ``dim = n_tiles * 256, block_dim = 256``. Threads of pixels outside the
    image run the loop with nothing to add: every lane must reach ``add``.
    """
    from arc_warp._src.reduce_funcs import accumulator

    grad_t = grad_vector(absgrad)
    add = accumulator(grad_t, mode)

    @wp.kernel(enable_backward=False, module_options={"fast_math": True}, module="unique")
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

        # entries behind every pixel's last contributor are skipped block-wide
        block_last = wp.tile_max(wp.tile(last))[0]
        r = ranges[tp[0]]
        k = wp.min(r[1] - 1, block_last)
        t = t_final
        rgb_behind = wp.vec3(0.0)
        depth_behind = float(0.0)
        while k >= r[0]:
            g = gauss_ids[k]
            valid = k <= last
            v = grad_t()
            if valid:
                s = splats[g]
                pw = gaussian_power(s, px, py)
                vis = wp.exp(-pw[0])
                alpha = wp.min(ALPHA_MAX, s.opacity * vis)
                if pw[0] < 0.0 or alpha < ALPHA_MIN:
                    valid = False
                else:
                    ra = 1.0 / (1.0 - alpha)
                    t = t * ra  # transmittance in front of this Gaussian
                    fac = alpha * t
                    c = colors[g]
                    v_alpha = (
                        wp.dot(c * t - rgb_behind * ra, v_rgb_px)
                        + (s.depth * t - depth_behind * ra) * v_depth_px
                        + v_final * ra
                    )
                    v[G_RGB] = fac * v_rgb_px[0]
                    v[G_RGB + 1] = fac * v_rgb_px[1]
                    v[G_RGB + 2] = fac * v_rgb_px[2]
                    v[G_DEPTH] = fac * v_depth_px
                    if s.opacity * vis <= ALPHA_MAX:  # alpha not clamped
                        v_power = -s.opacity * vis * v_alpha
                        dx = pw[1]
                        dy = pw[2]
                        v[G_CONIC] = 0.5 * v_power * dx * dx
                        v[G_CONIC + 1] = v_power * dx * dy
                        v[G_CONIC + 2] = 0.5 * v_power * dy * dy
                        v[G_XY] = v_power * (s.conic[0] * dx + s.conic[1] * dy)
                        v[G_XY + 1] = v_power * (s.conic[1] * dx + s.conic[2] * dy)
                        if wp.static(absgrad):
                            v[G_ABS] = wp.abs(v[G_XY])
                            v[G_ABS + 1] = wp.abs(v[G_XY + 1])
                        v[G_OPACITY] = vis * v_alpha
                    rgb_behind += fac * c
                    depth_behind += fac * s.depth
            add(out_grads, g, v, valid, threshold)
            k -= 1

    return raster_bwd
