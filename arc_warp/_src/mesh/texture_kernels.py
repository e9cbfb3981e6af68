"""Texture sampling kernels: mip build, forward, ARC backward, mip-gradient fold.

Conventions (nvdiffrast 0.4): uv in [0, 1] spans the texture, u along width; texel
centres sit at (i + 0.5) / size. ``wrap`` takes the fractional part of uv, ``clamp``
clamps to the centres of the edge texels, ``zero`` reads 0 outside. Nearest picks
floor(uv * size). Mip level l has size max(size >> l, 1), each texel the box average of
the 2x2 (or 2x1) texels below it. The level of detail is
0.5 log2(major axis^2 of the uv footprint in texels) + bias, clamped to
[0, levels - 1]; ``linear-mipmap-nearest`` uses floor(lod), ``linear-mipmap-linear``
blends floor(lod) and the next level by its fractional part.

All mip levels of all texture images live in one (texels, C) array; texel t of level l
in image z is row ``offsets[l] + (z * h_l + y) * w_l + x``. The samplers and the fold
see it, the outputs and the cotangents as flat arrays of k-vectors (C = k * chunks,
``common.chunking``), specialised per (k, chunks): a texel's channels move in one
vector load per chunk (``arc_warp._src.vector_io``: 128-bit on CUDA for RGBA), not one float
at a time.
"""

import functools

import warp as wp

from arc_warp._src.mesh.funcs import tile_pixel
from arc_warp._src.vector_io import vector_io
from arc_warp._src.arc.reduce_funcs import keyed_plan, planned_accumulator

NEAREST, LINEAR, MIP_NEAREST, MIP_LINEAR = 0, 1, 2, 3
FILTER_MODES = {"nearest": NEAREST, "linear": LINEAR, "linear-mipmap-nearest": MIP_NEAREST,
                "linear-mipmap-linear": MIP_LINEAR}
WRAP, CLAMP, ZERO = 0, 1, 2
BOUNDARY_MODES = {"wrap": WRAP, "clamp": CLAMP, "zero": ZERO}
load2, store2 = vector_io(2)
load4, store4 = vector_io(4)


@wp.func
def box_down(data: wp.array2d(dtype=float), src_offset: int, src_w: int, src_h: int, z: int, y: int, x: int, c: int):
    """Channel ``c`` of texel (y, x) of the level below (src_w, src_h) in image z: the mean
    of its 2x2 texels (2 along the one axis longer than 1), summed in row order."""
    s = src_offset + (z * src_h + 2 * y) * src_w + 2 * x
    if src_w == 1 or src_h == 1:
        step = src_w  # the next texel along the one axis longer than 1
        if src_h == 1:
            step = 1
        return 0.5 * (data[s, c] + data[s + step, c])
    return 0.25 * (data[s, c] + data[s + 1, c] + data[s + src_w, c] + data[s + src_w + 1, c])


@wp.kernel(enable_backward=False, module="unique")
def mip_build(
    data: wp.array2d(dtype=float),  # (texels, C) all levels
    src_offset: int,
    src_w: int,
    src_h: int,
    dst_offset: int,
    dst_w: int,
    dst_h: int,
):
    """One level from the one below it: a thread per texel."""
    z, y, x = wp.tid()
    d = dst_offset + (z * dst_h + y) * dst_w + x
    for c in range(data.shape[1]):
        data[d, c] = box_down(data, src_offset, src_w, src_h, z, y, x, c)


@wp.kernel(enable_backward=False, module="unique")
def mip_build2(
    data: wp.array2d(dtype=float),  # (texels, C) all levels
    src_offset: int,
    src_w: int,
    src_h: int,
    mid_offset: int,
    mid_w: int,
    mid_h: int,
    dst_offset: int,
    dst_w: int,
    dst_h: int,
):
    """Two levels in one launch (half the launches of a pyramid): a thread per texel of
    the upper level computes and writes the 2x2 (or 2) texels of the middle level under
    it, then averages them in registers in the same order as ``mip_build`` reads them,
    so the stack has the same bits."""
    z, y, x = wp.tid()
    d = dst_offset + (z * dst_h + y) * dst_w + x
    m = mid_offset + (z * mid_h + 2 * y) * mid_w + 2 * x
    for c in range(data.shape[1]):
        a = box_down(data, src_offset, src_w, src_h, z, 2 * y, 2 * x, c)
        data[m, c] = a
        if mid_w == 1 or mid_h == 1:
            # the second texel along the one axis longer than 1
            y1 = 2 * y
            x1 = 2 * x
            step = mid_w
            if mid_h == 1:
                x1 += 1
                step = 1
            else:
                y1 += 1
            b = box_down(data, src_offset, src_w, src_h, z, y1, x1, c)
            data[m + step, c] = b
            data[d, c] = 0.5 * (a + b)
        else:
            b = box_down(data, src_offset, src_w, src_h, z, 2 * y, 2 * x + 1, c)
            e = box_down(data, src_offset, src_w, src_h, z, 2 * y + 1, 2 * x, c)
            f = box_down(data, src_offset, src_w, src_h, z, 2 * y + 1, 2 * x + 1, c)
            data[m + 1, c] = b
            data[m + mid_w, c] = e
            data[m + mid_w + 1, c] = f
            data[d, c] = 0.25 * (a + b + e + f)


@functools.cache
def make_mip_fold(k: int, chunks: int):
    """Adds every level's gradient back into level 0 (the transpose of the box filters),
    C = ``k * chunks`` channels moved as k-vectors. One thread per level-0 texel."""
    vec_k = wp.types.vector(k, wp.float32)
    load, store = vector_io(k)

    def mip_fold(
        gstack: wp.array(dtype=vec_k),  # (texels * chunks,) gradients of every level
        sizes: wp.array(dtype=wp.vec2i),  # (levels,) (w, h)
        offsets: wp.array(dtype=wp.int32),  # (levels,)
        grad_tex: wp.array(dtype=vec_k),  # (Bt*H*W * chunks,) added into
    ):
        z, y, x = wp.tid()
        w0 = sizes[0][0]
        h0 = sizes[0][1]
        texel = (z * h0 + y) * w0 + x
        for c in range(wp.static(chunks)):
            acc = load(gstack, (offsets[0] + texel) * chunks + c)
            weight = float(1.0)
            for level in range(1, sizes.shape[0]):
                prev = sizes[level - 1]
                if prev[0] > 1:
                    weight *= 0.5
                if prev[1] > 1:
                    weight *= 0.5
                s = sizes[level]
                row = offsets[level] + (z * s[1] + (y >> level)) * s[0] + (x >> level)
                acc += weight * load(gstack, row * chunks + c)
            store(grad_tex, texel * chunks + c, grad_tex[texel * chunks + c] + acc)

    return wp.kernel(mip_fold, enable_backward=False, module="unique")


@wp.func
def nearest_texel(uv: wp.vec2, w: int, h: int, boundary: int) -> int:
    """Texel index (within the image) of nearest filtering, or -1 outside in ``zero`` mode."""
    u = uv[0]
    v = uv[1]
    if boundary == WRAP:
        u = u - wp.floor(u)
        v = v - wp.floor(v)
    iu = int(wp.floor(u * float(w)))
    iv = int(wp.floor(v * float(h)))
    if boundary == ZERO and (iu < 0 or iu >= w or iv < 0 or iv >= h):
        return -1
    return wp.clamp(iv, 0, h - 1) * w + wp.clamp(iu, 0, w - 1)


@wp.func
def linear_taps(uv: wp.vec2, w: int, h: int, boundary: int, base: int):
    """Bilinear taps: texel rows (00, 10, 01, 11; -1 = reads zero) offset by ``base``, and
    the fractional position within the quad."""
    u = uv[0]
    v = uv[1]
    if boundary == WRAP:
        u = u - wp.floor(u)
        v = v - wp.floor(v)
    u = u * float(w) - 0.5
    v = v * float(h) - 0.5
    clamp_u = False
    clamp_v = False
    if boundary == CLAMP:
        u = wp.clamp(u, 0.0, float(w) - 1.0)
        v = wp.clamp(v, 0.0, float(h) - 1.0)
        clamp_u = u == 0.0 or u == float(w) - 1.0
        clamp_v = v == 0.0 or v == float(h) - 1.0
    iu0 = int(wp.floor(u))
    iv0 = int(wp.floor(v))
    iu1 = iu0 + 1
    iv1 = iv0 + 1
    if clamp_u:  # both taps on the edge texel: zero u gradient, as nvdiffrast
        iu1 = iu0
    if clamp_v:
        iv1 = iv0
    frac = wp.vec2(u - float(iu0), v - float(iv0))
    if boundary == WRAP:
        if iu0 < 0:
            iu0 += w
        if iv0 < 0:
            iv0 += h
        if iu1 >= w:
            iu1 -= w
        if iv1 >= h:
            iv1 -= h
    out0 = iu0 < 0 or iu0 >= w
    out1 = iu1 < 0 or iu1 >= w
    outv0 = iv0 < 0 or iv0 >= h
    outv1 = iv1 < 0 or iv1 >= h
    taps = wp.vec4i(base + iv0 * w + iu0, base + iv0 * w + iu1, base + iv1 * w + iu0, base + iv1 * w + iu1)
    if out0 or outv0:
        taps[0] = -1
    if out1 or outv0:
        taps[1] = -1
    if out0 or outv1:
        taps[2] = -1
    if out1 or outv1:
        taps[3] = -1
    return taps, frac


@wp.func
def tap_weights(f: wp.vec2) -> wp.vec4:
    return wp.vec4((1.0 - f[0]) * (1.0 - f[1]), f[0] * (1.0 - f[1]), (1.0 - f[0]) * f[1], f[0] * f[1])


@wp.func
def level_taps(sizes: wp.array(dtype=wp.vec2i), offsets: wp.array(dtype=wp.int32), level: int, z: int, uv: wp.vec2,
               boundary: int):
    """:func:`linear_taps` of ``uv`` in image ``z`` of mip level ``level``, and the level's (w, h)."""
    s = sizes[level]
    taps, f = linear_taps(uv, s[0], s[1], boundary, offsets[level] + z * s[0] * s[1])
    return taps, f, wp.vec2(float(s[0]), float(s[1]))


@wp.func
def footprint(uv_da: wp.vec4, w0: int, h0: int):
    """(lod, dlod/duv_da): 0.5 log2 of the major axis^2 of the pixel footprint in level-0
    texels, and its gradient w.r.t. (du/dX, du/dY, dv/dX, dv/dY) (zero where not finite)."""
    uscl = float(w0)
    vscl = float(h0)
    dsdx = uv_da[0] * uscl
    dsdy = uv_da[1] * uscl
    dtdx = uv_da[2] * vscl
    dtdy = uv_da[3] * vscl
    a = dsdx * dsdx + dtdx * dtdx
    b = dsdy * dsdy + dtdy * dtdy
    c = dsdx * dsdy + dtdx * dtdy
    l2b = 0.5 * (a + b)
    l2n = 0.25 * (a - b) * (a - b) + c * c
    l2a = wp.sqrt(l2n)
    lod = 0.5 * wp.log2(l2b + l2a)
    # d lod = (0.5 / ln 2) d(l2b + l2a) / (l2b + l2a); l2a (l2b + l2a) = l2n + l2a l2b
    dw = 0.72134752 / (l2n + l2a * l2b)
    ab = dw * 0.5 * (a - b)
    cw = dw * c
    l2aw = dw * l2a
    g = wp.vec4(uscl * (dsdx * (l2aw + ab) + dsdy * cw), uscl * (dsdy * (l2aw - ab) + dsdx * cw),
                vscl * (dtdx * (l2aw + ab) + dtdy * cw), vscl * (dtdy * (l2aw - ab) + dtdx * cw))
    if not (wp.isfinite(g[0]) and wp.isfinite(g[1]) and wp.isfinite(g[2]) and wp.isfinite(g[3])):
        g = wp.vec4(0.0)
    return lod, g


@wp.func
def mip_levels(lod: float, max_level: int, filter_mode: int):
    """(level0, level1, fraction) of a clamped level of detail."""
    flevel = wp.clamp(lod, 0.0, float(max_level))
    level0 = int(wp.floor(flevel))
    level1 = level0
    frac = float(0.0)
    if filter_mode == MIP_LINEAR and flevel > 0.0:
        level1 = wp.min(level0 + 1, max_level)
        frac = flevel - float(level0)
    return level0, level1, frac


@wp.func
def pixel_lod(
    uv_da: wp.array(dtype=wp.vec4), bias: wp.array(dtype=float), i: int, w0: int, h0: int, filter_mode: int
):
    lod = float(0.0)
    dlod = wp.vec4(0.0)
    if filter_mode >= MIP_NEAREST:
        if uv_da.shape[0] > 0:
            lod, dlod = footprint(load4(uv_da, i), w0, h0)
        if bias.shape[0] > 0:
            lod += bias[i]
    return lod, dlod


@functools.cache
def texel_funcs(k: int):
    """``(texel, bilinear)`` for ``k``-channel texel vectors of a (texels * chunks,) stack:
    ``texel(data, t, chunks, c)`` is chunk ``c`` of row ``t`` (zero for ``t < 0``);
    ``bilinear(data, taps, weights, chunks, c)`` sums four of them in tap order."""
    vec_k = wp.types.vector(k, wp.float32)
    load, _ = vector_io(k)

    def texel(data: wp.array(dtype=vec_k), t: int, chunks: int, c: int) -> vec_k:
        if t < 0:
            return vec_k()
        return load(data, t * chunks + c)

    texel = wp.func(texel, name=f"tex_texel_v{k}", module="unique")

    def bilinear(data: wp.array(dtype=vec_k), taps: wp.vec4i, w: wp.vec4, chunks: int, c: int) -> vec_k:
        return (w[0] * texel(data, taps[0], chunks, c) + w[1] * texel(data, taps[1], chunks, c)
                + w[2] * texel(data, taps[2], chunks, c) + w[3] * texel(data, taps[3], chunks, c))

    return texel, wp.func(bilinear, name=f"tex_bilinear_v{k}", module="unique")


@functools.cache
def make_tex_fwd(filter_mode: int, k: int, chunks: int):
    """Forward sampler for one filter mode (nearest / linear / mip-nearest / mip-linear)
    and C = ``k * chunks`` channels, moved as ``chunks`` k-vectors (a loop unrolled at
    compile time). One thread per pixel."""
    vec_k = wp.types.vector(k, wp.float32)
    _, store = vector_io(k)
    texel, bilinear = texel_funcs(k)

    def tex_fwd(
        data: wp.array(dtype=vec_k),  # (texels * chunks,) mip stack, k channels per vector
        sizes: wp.array(dtype=wp.vec2i),
        offsets: wp.array(dtype=wp.int32),
        uv: wp.array(dtype=wp.vec2),  # (B*H*W,)
        uv_da: wp.array(dtype=wp.vec4),  # (B*H*W,) or empty
        bias: wp.array(dtype=float),  # (B*H*W,) or empty
        pixels_per_image: int,
        tex_images: int,
        boundary: int,
        out: wp.array(dtype=vec_k),  # (B*H*W * chunks,)
    ):
        i = wp.tid()
        z = wp.min(i // pixels_per_image, tex_images - 1)
        size0 = sizes[0]
        if wp.static(filter_mode == NEAREST):
            t = nearest_texel(load2(uv, i), size0[0], size0[1], boundary)
            if t >= 0:
                t += z * size0[0] * size0[1]
            for c in range(wp.static(chunks)):
                store(out, i * chunks + c, texel(data, t, chunks, c))
            return
        lod, dlod = pixel_lod(uv_da, bias, i, size0[0], size0[1], wp.static(filter_mode))
        l0, l1, frac = mip_levels(lod, sizes.shape[0] - 1, wp.static(filter_mode))
        p = load2(uv, i)
        taps0, f0, s0 = level_taps(sizes, offsets, l0, z, p, boundary)
        w0 = tap_weights(f0)
        taps1 = taps0
        w1 = w0
        if frac > 0.0:  # the second level only between levels (never when magnified)
            taps1, f1, s1 = level_taps(sizes, offsets, l1, z, p, boundary)
            w1 = tap_weights(f1)
        for c in range(wp.static(chunks)):
            a = bilinear(data, taps0, w0, chunks, c)
            if frac > 0.0:
                a = a + frac * (bilinear(data, taps1, w1, chunks, c) - a)
            store(out, i * chunks + c, a)

    return wp.kernel(tex_fwd, enable_backward=False, module="unique")


@functools.cache
def make_tex_bwd(mode: str, filter_mode: int, k: int, chunks: int):
    """Backward sampler: texel gradients of every level (ARC, C = ``k * chunks`` channels
    as k-vectors), and per-pixel gradients of uv, uv_da and the bias. One thread per
    pixel (tiled launch); every lane makes (chunks x levels x taps) accumulator calls,
    planned once per warp by the pixel's first texel (`keyed_plan`), and loads its
    cotangent and each texel once per chunk."""
    vec_k = wp.types.vector(k, wp.float32)
    plan = keyed_plan(mode)
    add = planned_accumulator(vec_k, mode)
    load, _ = vector_io(k)
    texel, _ = texel_funcs(k)
    mip_linear = filter_mode == MIP_LINEAR
    taps_used = 1 if filter_mode == NEAREST else 4

    def tex_bwd(
        data: wp.array(dtype=vec_k),  # (texels * chunks,) mip stack
        sizes: wp.array(dtype=wp.vec2i),
        offsets: wp.array(dtype=wp.int32),
        uv: wp.array(dtype=wp.vec2),
        uv_da: wp.array(dtype=wp.vec4),
        bias: wp.array(dtype=float),
        grad_out: wp.array(dtype=vec_k),  # (B*H*W * chunks,)
        width: int,
        height: int,
        tex_images: int,
        boundary: int,
        threshold: int,
        gstack: wp.array(dtype=vec_k),  # (texels * chunks,) added into, or empty: not wanted
        grad_uv: wp.array(dtype=wp.vec2),  # (B*H*W,) added into, or empty
        grad_uv_da: wp.array(dtype=wp.vec4),  # (B*H*W,) added into, or empty
        grad_bias: wp.array(dtype=float),  # (B*H*W,) added into, or empty
    ):
        tp = tile_pixel(wp.tid(), width, height)
        ii = (tp[0] * height + tp[1]) * width + tp[2]
        valid = tp[3] != 0
        z = wp.min(tp[0], tex_images - 1)
        scatter = gstack.shape[0] > 0  # the same for every lane, so the accumulator's warps stay converged
        size0 = sizes[0]
        # taps (-1: no gradient) and weights of both levels; level 1's weights are 0 unless blended
        t0 = wp.vec4i(-1, -1, -1, -1)
        t1 = wp.vec4i(-1, -1, -1, -1)
        w0 = wp.vec4(1.0, 0.0, 0.0, 0.0)
        w1 = wp.vec4(0.0)
        f0 = wp.vec2(0.0)
        f1 = wp.vec2(0.0)
        s0 = wp.vec2(0.0)
        s1 = wp.vec2(0.0)
        frac = float(0.0)
        dlod = wp.vec4(0.0)
        if wp.static(filter_mode == NEAREST):
            tn = nearest_texel(load2(uv, ii), size0[0], size0[1], boundary)
            if tn >= 0:
                tn += z * size0[0] * size0[1]
            t0[0] = tn
        else:
            lod, dlod = pixel_lod(uv_da, bias, ii, size0[0], size0[1], wp.static(filter_mode))
            l0, l1, frac = mip_levels(lod, sizes.shape[0] - 1, wp.static(filter_mode))
            p = load2(uv, ii)
            t0, f0, s0 = level_taps(sizes, offsets, l0, z, p, boundary)
            w0 = tap_weights(f0)
            if frac > 0.0:  # the second level only between levels (never when magnified)
                t1, f1, s1 = level_taps(sizes, offsets, l1, z, p, boundary)
                w1 = tap_weights(f1)
        # per-pixel gradients first (their values are dead before the scatter): uv's per
        # level through the bilinear weights, then d out / d frac for the level of detail
        if valid and wp.static(filter_mode != NEAREST):
            gu0 = wp.vec2(0.0)
            gu1 = wp.vec2(0.0)
            df = float(0.0)
            for c in range(wp.static(chunks)):
                d = load(grad_out, ii * chunks + c)
                a00 = texel(data, t0[0], chunks, c)
                a10 = texel(data, t0[1], chunks, c)
                a01 = texel(data, t0[2], chunks, c)
                a11 = texel(data, t0[3], chunks, c)
                ad = a11 + a00 - a10 - a01
                gu0 += wp.vec2(wp.dot(d, (a10 - a00) + f0[1] * ad), wp.dot(d, (a01 - a00) + f0[0] * ad))
                if frac > 0.0:
                    b00 = texel(data, t1[0], chunks, c)
                    b10 = texel(data, t1[1], chunks, c)
                    b01 = texel(data, t1[2], chunks, c)
                    b11 = texel(data, t1[3], chunks, c)
                    bd = b11 + b00 - b10 - b01
                    gu1 += wp.vec2(wp.dot(d, (b10 - b00) + f1[1] * bd), wp.dot(d, (b01 - b00) + f1[0] * bd))
                    a = w0[0] * a00 + w0[1] * a10 + w0[2] * a01 + w0[3] * a11
                    b = w1[0] * b00 + w1[1] * b10 + w1[2] * b01 + w1[3] * b11
                    df += wp.dot(b - a, d)
            if grad_uv.shape[0] > 0:
                g = (1.0 - frac) * wp.cw_mul(gu0, s0) + frac * wp.cw_mul(gu1, s1)
                store2(grad_uv, ii, grad_uv[ii] + g)
            if grad_uv_da.shape[0] > 0:
                store4(grad_uv_da, ii, grad_uv_da[ii] + dlod * df)
            if grad_bias.shape[0] > 0:
                grad_bias[ii] = grad_bias[ii] + df
        # texel gradients; nothing is added outside the image, for a zero tap or a zero weight
        if scatter:
            planned = plan(t0[0], valid and t0[0] >= 0, threshold)
            sw0 = (1.0 - frac) * w0
            sw1 = frac * w1
            for c in range(wp.static(chunks)):
                d = load(grad_out, ii * chunks + c)  # in bounds past the image too (tile_pixel clamps)
                for q in range(wp.static(taps_used)):
                    ok = valid and t0[q] >= 0 and sw0[q] != 0.0
                    add(gstack, wp.max(t0[q], 0) * chunks + c, sw0[q] * d, ok, threshold, planned)
                if wp.static(mip_linear):
                    for q in range(4):
                        ok = valid and t1[q] >= 0 and sw1[q] != 0.0
                        add(gstack, wp.max(t1[q], 0) * chunks + c, sw1[q] * d, ok, threshold, planned)

    return wp.kernel(tex_bwd, enable_backward=False, module="unique")
