"""Attribute interpolation kernels: forward (with pixel derivatives) and the ARC backward.

out = u a0 + v a1 + (1 - u - v) a2 for the triangle in ``rast`` (id 0 or an id/vertex out
of range: zeros, no gradient). Attribute derivatives use the chain rule through
``rast_db``: dA/dX = (a0 - a2) du/dX + (a1 - a2) dv/dX, and likewise for Y.
"""

import functools

import warp as wp

from arc_warp._src.mesh.funcs import float_to_id, tile_pixel
from arc_warp._src.mesh.raster_kernels import tri_vertices
from arc_warp._src.arc.reduce_funcs import keyed_plan, planned_accumulator


@wp.func
def pixel_triangle(r: wp.vec4, tri: wp.array(dtype=wp.vec3i), num_vertices: int) -> wp.vec3i:
    """Vertex indices of the pixel's triangle, or (-1, -1, -1) if none (or corrupt)."""
    t = float_to_id(r[3]) - 1
    if t < 0 or t >= tri.shape[0]:
        return wp.vec3i(-1, -1, -1)
    return tri_vertices(tri, t, num_vertices)


@wp.kernel(enable_backward=False, module="unique")
def interp_fwd(
    attr: wp.array3d(dtype=float),  # (Ba, V, A), Ba = 1 broadcasts
    rast: wp.array3d(dtype=wp.vec4),  # (B, H, W)
    rast_db: wp.array3d(dtype=wp.vec4),  # (B, H, W) or (0, 0, 0) without derivatives
    tri: wp.array(dtype=wp.vec3i),
    diff: wp.array(dtype=wp.int32),  # (D,) attribute indices
    out: wp.array4d(dtype=float),  # (B, H, W, A)
    out_da: wp.array4d(dtype=float),  # (B, H, W, 2D)
):
    b, y, x = wp.tid()
    r = rast[b, y, x]
    f = pixel_triangle(r, tri, attr.shape[1])
    ab = wp.min(b, attr.shape[0] - 1)
    if f[0] < 0:
        for j in range(attr.shape[2]):
            out[b, y, x, j] = 0.0
        for k in range(out_da.shape[3]):
            out_da[b, y, x, k] = 0.0
        return
    w2 = 1.0 - r[0] - r[1]
    for j in range(attr.shape[2]):
        out[b, y, x, j] = r[0] * attr[ab, f[0], j] + r[1] * attr[ab, f[1], j] + w2 * attr[ab, f[2], j]
    if diff.shape[0] > 0:
        db = rast_db[b, y, x]
        for k in range(diff.shape[0]):
            j = diff[k]
            d0 = attr[ab, f[0], j] - attr[ab, f[2], j]
            d1 = attr[ab, f[1], j] - attr[ab, f[2], j]
            out_da[b, y, x, 2 * k] = d0 * db[0] + d1 * db[2]
            out_da[b, y, x, 2 * k + 1] = d0 * db[1] + d1 * db[3]


@functools.cache
def make_interp_bwd(mode: str, k: int):
    """Backward of :func:`interp_fwd` with ``k``-component attribute chunks, accumulated with ``mode``.

    One thread per pixel (tiled launch, see ``tile_pixel``); every lane makes 3 accumulator
    calls per chunk, planned once per warp by the triangle's first vertex (`keyed_plan`)."""
    vec_k = wp.types.vector(k, wp.float32)
    plan = keyed_plan(mode)
    add = planned_accumulator(vec_k, mode)

    def interp_bwd(
        attr: wp.array3d(dtype=float),  # (Ba, V, A)
        rast: wp.array(dtype=wp.vec4),  # (B*H*W,)
        rast_db: wp.array(dtype=wp.vec4),  # (B*H*W,) or empty
        tri: wp.array(dtype=wp.vec3i),
        diff: wp.array(dtype=wp.int32),  # (D,)
        grad_out: wp.array2d(dtype=float),  # (B*H*W, A)
        grad_da: wp.array2d(dtype=float),  # (B*H*W, 2D) or (0, 0)
        width: int,
        height: int,
        threshold: int,
        grad_attr: wp.array(dtype=vec_k),  # (Ba*V*A/k,) flat, or empty: not wanted
        grad_rast: wp.array(dtype=wp.vec4),  # (B*H*W,) added into (one thread per pixel)
        grad_rast_db: wp.array(dtype=wp.vec4),  # (B*H*W,) added into, or empty
    ):
        tp = tile_pixel(wp.tid(), width, height)
        ii = (tp[0] * height + tp[1]) * width + tp[2]
        num_a = attr.shape[2]
        r = rast[ii]
        f = pixel_triangle(r, tri, attr.shape[1])
        valid = tp[3] != 0 and f[0] >= 0
        if not valid:
            f = wp.vec3i(0, 0, 0)
        ab = wp.min(tp[0], attr.shape[0] - 1)
        db = wp.vec4(0.0)
        if valid and rast_db.shape[0] > 0:
            db = rast_db[ii]
        # dL/d(u, v) and dL/d(rast_db)
        gu = float(0.0)
        gv = float(0.0)
        gdb = wp.vec4(0.0)
        if valid:
            for j in range(num_a):
                d = grad_out[ii, j]
                a2 = attr[ab, f[2], j]
                gu += d * (attr[ab, f[0], j] - a2)
                gv += d * (attr[ab, f[1], j] - a2)
            for q in range(diff.shape[0]):
                j = diff[q]
                a2 = attr[ab, f[2], j]
                d0 = attr[ab, f[0], j] - a2
                d1 = attr[ab, f[1], j] - a2
                gx = grad_da[ii, 2 * q]
                gy = grad_da[ii, 2 * q + 1]
                gdb += wp.vec4(gx * d0, gy * d0, gx * d1, gy * d1)
        if valid:
            grad_rast[ii] = grad_rast[ii] + wp.vec4(gu, gv, 0.0, 0.0)
            if grad_rast_db.shape[0] > 0:
                grad_rast_db[ii] = grad_rast_db[ii] + gdb
        w2 = 1.0 - r[0] - r[1]
        chunks = num_a // wp.static(k)
        base = (ab * attr.shape[1]) * chunks
        if grad_attr.shape[0] == 0:
            chunks = 0  # the same for every lane, so the accumulator's warps stay converged
        planned = plan(f[0], valid, threshold)
        for c in range(chunks):
            g0 = vec_k()
            g1 = vec_k()
            g2 = vec_k()
            if valid:
                for m in range(wp.static(k)):
                    j = c * wp.static(k) + m
                    d = grad_out[ii, j]
                    e0 = float(0.0)
                    e1 = float(0.0)
                    for q in range(diff.shape[0]):
                        if diff[q] == j:
                            gx = grad_da[ii, 2 * q]
                            gy = grad_da[ii, 2 * q + 1]
                            e0 += gx * db[0] + gy * db[1]
                            e1 += gx * db[2] + gy * db[3]
                    g0[m] = r[0] * d + e0
                    g1[m] = r[1] * d + e1
                    g2[m] = w2 * d - e0 - e1
            add(grad_attr, base + f[0] * chunks + c, g0, valid, threshold, planned)
            add(grad_attr, base + f[1] * chunks + c, g1, valid, threshold, planned)
            add(grad_attr, base + f[2] * chunks + c, g2, valid, threshold, planned)

    return wp.kernel(interp_bwd, enable_backward=False, module="unique")
