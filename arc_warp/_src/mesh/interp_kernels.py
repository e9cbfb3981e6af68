"""Attribute interpolation kernels: forward (with pixel derivatives) and the ARC backward.

out = u a0 + v a1 + (1 - u - v) a2 for the triangle in ``rast`` (id 0 or an id/vertex out
of range: zeros, no gradient). Attribute derivatives use the chain rule through
``rast_db``: dA/dX = (a0 - a2) du/dX + (a1 - a2) dv/dX, and likewise for Y.

The attributes, the outputs and their cotangents are seen as flat arrays of k-vectors
(A = k * chunks, ``common.chunking``), specialised per (k, chunks, with derivatives): a
vertex's attributes move in one vector load per chunk (``funcs.vector_io``: 128-bit on
CUDA for k = 4 or 8), not one float at a time. The D derivative outputs (2 floats each,
in ``diff_attrs`` order, an index may repeat) are reached from the attributes through a
link table (``links``: A + D int32): ``links[j]`` is the first output slot q of
attribute j (-1: none) and ``links[A + q]`` the next slot of the same attribute, so a
pixel visits each attribute and each slot once (O(A + D), not O(A D)).
"""

import functools

import warp as wp

from arc_warp._src.mesh.funcs import float_to_id, tile_pixel
from arc_warp._src.vector_io import vector_io
from arc_warp._src.mesh.raster_kernels import tri_vertices
from arc_warp._src.arc.reduce_funcs import keyed_plan, planned_accumulator

load4, store4 = vector_io(4)


@wp.func
def pixel_triangle(r: wp.vec4, tri: wp.array(dtype=wp.vec3i), num_vertices: int) -> wp.vec3i:
    """Vertex indices of the pixel's triangle, or (-1, -1, -1) if none (or corrupt)."""
    t = float_to_id(r[3]) - 1
    if t < 0 or t >= tri.shape[0]:
        return wp.vec3i(-1, -1, -1)
    return tri_vertices(tri, t, num_vertices)


@wp.func
def da_cotangent(links: wp.array(dtype=wp.int32), grad_da: wp.array(dtype=float), row: int, num_a: int,
                 j: int) -> wp.vec2:
    """Sum of the (d/dX, d/dY) cotangents of attribute ``j``'s derivative outputs: the
    pixel's cotangents start at ``grad_da[row]``; ``links[j]`` is ``j``'s first output slot
    and ``links[num_a + q]`` the next slot of the same attribute (-1: none)."""
    g = wp.vec2(0.0)
    q = links[j]
    while q >= 0:
        g += wp.vec2(grad_da[row + 2 * q], grad_da[row + 2 * q + 1])
        q = links[num_a + q]
    return g


@functools.cache
def make_interp_fwd(k: int, chunks: int, with_da: bool):
    """Forward for A = ``k * chunks`` attributes moved as ``chunks`` k-vectors (a loop
    unrolled at compile time), with the pixel derivatives of the linked attributes if
    ``with_da``. One thread per pixel."""
    vec_k = wp.types.vector(k, wp.float32)
    load, store = vector_io(k)

    def interp_fwd(
        attr: wp.array(dtype=vec_k),  # (Ba*V*chunks,) flat, Ba = 1 broadcasts
        num_vertices: int,  # V
        attr_batch: int,  # Ba
        pixels_per_image: int,  # H*W
        rast: wp.array(dtype=wp.vec4),  # (B*H*W,)
        rast_db: wp.array(dtype=wp.vec4),  # (B*H*W,) or empty without derivatives
        tri: wp.array(dtype=wp.vec3i),  # (F,)
        links: wp.array(dtype=wp.int32),  # (A + D,) see the module docstring; empty without derivatives
        out: wp.array(dtype=vec_k),  # (B*H*W*chunks,)
        out_da: wp.array(dtype=float),  # (B*H*W*2D,) or empty
    ):
        i = wp.tid()
        r = rast[i]  # Warp's float loads: fewer registers than vector_io's two arms (48 against 55 with derivatives)
        f = pixel_triangle(r, tri, num_vertices)
        if f[0] < 0:
            for c in range(wp.static(chunks)):
                store(out, i * chunks + c, vec_k())
            if wp.static(with_da):
                d2 = links.shape[0] - wp.static(k * chunks)
                for s in range(2 * d2):
                    out_da[i * 2 * d2 + s] = 0.0
            return
        base = wp.min(i // pixels_per_image, attr_batch - 1) * num_vertices
        w2 = 1.0 - r[0] - r[1]
        db = wp.vec4(0.0)
        if wp.static(with_da):
            db = rast_db[i]
        for c in range(wp.static(chunks)):
            a0 = load(attr, (base + f[0]) * chunks + c)
            a1 = load(attr, (base + f[1]) * chunks + c)
            a2 = load(attr, (base + f[2]) * chunks + c)
            store(out, i * chunks + c, r[0] * a0 + r[1] * a1 + w2 * a2)
            if wp.static(with_da):
                d0 = a0 - a2
                d1 = a1 - a2
                row = i * 2 * (links.shape[0] - wp.static(k * chunks))
                for m in range(wp.static(k)):
                    q = links[c * wp.static(k) + m]
                    while q >= 0:
                        out_da[row + 2 * q] = d0[m] * db[0] + d1[m] * db[2]
                        out_da[row + 2 * q + 1] = d0[m] * db[1] + d1[m] * db[3]
                        q = links[wp.static(k * chunks) + q]

    return wp.kernel(interp_fwd, enable_backward=False, module="unique")


@functools.cache
def make_interp_bwd(mode: str, k: int, chunks: int, with_da: bool):
    """Backward of :func:`make_interp_fwd`'s kernel (same k, chunks, derivatives), vertex
    gradients accumulated with ``mode``.

    One thread per pixel (tiled launch, see ``tile_pixel``). First the per-pixel
    gradients of (u, v) and ``rast_db`` (the only part that reads the attributes), then
    the scatter: every lane makes 3 accumulator calls per chunk, planned once per warp by
    the triangle's first vertex (`keyed_plan`); the vertex gradients need only the
    cotangents and the barycentrics."""
    vec_k = wp.types.vector(k, wp.float32)
    plan = keyed_plan(mode)
    add = planned_accumulator(vec_k, mode)
    load, _ = vector_io(k)
    num_a = k * chunks

    def interp_bwd(
        attr: wp.array(dtype=vec_k),  # (Ba*V*chunks,) flat
        num_vertices: int,  # V
        attr_batch: int,  # Ba
        rast: wp.array(dtype=wp.vec4),  # (B*H*W,)
        rast_db: wp.array(dtype=wp.vec4),  # (B*H*W,) or empty
        tri: wp.array(dtype=wp.vec3i),  # (F,)
        links: wp.array(dtype=wp.int32),  # (A + D,) or empty without derivatives
        grad_out: wp.array(dtype=vec_k),  # (B*H*W*chunks,)
        grad_da: wp.array(dtype=float),  # (B*H*W*2D,) or empty
        width: int,
        height: int,
        threshold: int,
        grad_attr: wp.array(dtype=vec_k),  # (Ba*V*chunks,) flat, or empty: not wanted
        grad_rast: wp.array(dtype=wp.vec4),  # (B*H*W,) added into (one thread per pixel)
        grad_rast_db: wp.array(dtype=wp.vec4),  # (B*H*W,) added into, or empty
    ):
        tp = tile_pixel(wp.tid(), width, height)
        ii = (tp[0] * height + tp[1]) * width + tp[2]
        r = load4(rast, ii)
        f = pixel_triangle(r, tri, num_vertices)
        valid = tp[3] != 0 and f[0] >= 0
        if not valid:
            f = wp.vec3i(0, 0, 0)
        base = wp.min(tp[0], attr_batch - 1) * num_vertices
        db = wp.vec4(0.0)
        row = int(0)  # of the pixel's derivative cotangents
        if wp.static(with_da):
            row = ii * 2 * (links.shape[0] - wp.static(num_a))
            if valid:
                db = load4(rast_db, ii)
        # dL/d(u, v) and dL/d(rast_db)
        if valid:
            gu = float(0.0)
            gv = float(0.0)
            gdb = wp.vec4(0.0)
            for c in range(wp.static(chunks)):
                d = load(grad_out, ii * chunks + c)
                a2 = load(attr, (base + f[2]) * chunks + c)
                d0 = load(attr, (base + f[0]) * chunks + c) - a2
                d1 = load(attr, (base + f[1]) * chunks + c) - a2
                gu += wp.dot(d, d0)
                gv += wp.dot(d, d1)
                if wp.static(with_da):
                    for m in range(wp.static(k)):
                        g = da_cotangent(links, grad_da, row, wp.static(num_a), c * wp.static(k) + m)
                        gdb += wp.vec4(g[0] * d0[m], g[1] * d0[m], g[0] * d1[m], g[1] * d1[m])
            store4(grad_rast, ii, grad_rast[ii] + wp.vec4(gu, gv, 0.0, 0.0))
            if wp.static(with_da):
                if grad_rast_db.shape[0] > 0:
                    store4(grad_rast_db, ii, grad_rast_db[ii] + gdb)
        # vertex gradients: the same for every lane, so the accumulator's warps stay converged
        if grad_attr.shape[0] > 0:
            w2 = 1.0 - r[0] - r[1]
            planned = plan(f[0], valid, threshold)
            for c in range(wp.static(chunks)):
                g0 = vec_k()
                g1 = vec_k()
                g2 = vec_k()
                if valid:
                    d = load(grad_out, ii * chunks + c)
                    g0 = r[0] * d
                    g1 = r[1] * d
                    g2 = w2 * d
                    if wp.static(with_da):
                        for m in range(wp.static(k)):
                            g = da_cotangent(links, grad_da, row, wp.static(num_a), c * wp.static(k) + m)
                            e0 = g[0] * db[0] + g[1] * db[1]
                            e1 = g[0] * db[2] + g[1] * db[3]
                            g0[m] += e0
                            g1[m] += e1
                            g2[m] -= e0 + e1
                add(grad_attr, (base + f[0]) * chunks + c, g0, valid, threshold, planned)
                add(grad_attr, (base + f[1]) * chunks + c, g1, valid, threshold, planned)
                add(grad_attr, (base + f[2]) * chunks + c, g2, valid, threshold, planned)

    return wp.kernel(interp_bwd, enable_backward=False, module="unique")
