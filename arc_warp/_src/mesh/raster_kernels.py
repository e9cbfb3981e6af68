"""Rasteriser kernels: per-triangle depth test, per-pixel resolve, ARC backward into positions.

Coverage uses homogeneous 2D rasterisation (Olano and Greer 1997): for pixel centre
p = (X, Y, 1) in NDC, the edge functions E_i = L_i . p with L_0 = v1 x v2 (v = (x, y, w)
of each vertex), L_1 = v2 x v0, L_2 = v0 x v1, give the perspective-correct
barycentrics b_i = E_i / sum(E). A pixel is covered when every E_i has the sign of
det = L_0 . v0; the point is then in front of the eye (w > 0), so triangles crossing
w = 0 need no geometric clipping. Near/far clipping is the per-pixel test
-1 <= z/w <= 1 on the interpolated depth, which cuts exactly along the clip planes.
"""

import functools

import warp as wp

from arc_warp._src.mesh.funcs import (
    edge_inside,
    edge_line,
    float_bits,
    float_to_id,
    homogeneous,
    id_to_float,
    tile_pixel,
)
from arc_warp._src.arc.reduce_funcs import keyed_plan, planned_accumulator

EMPTY_KEY = wp.constant(wp.int64(9223372036854775807))


@wp.func
def tri_vertices(tri: wp.array(dtype=wp.vec3i), t: int, num_vertices: int) -> wp.vec3i:
    """Vertex indices of triangle ``t``, or (-1, -1, -1) if any is out of range."""
    f = tri[t]
    if f[0] < 0 or f[1] < 0 or f[2] < 0 or f[0] >= num_vertices or f[1] >= num_vertices or f[2] >= num_vertices:
        return wp.vec3i(-1, -1, -1)
    return f


@wp.func
def edge_setup(p0: wp.vec4, p1: wp.vec4, p2: wp.vec4, f: wp.vec3i) -> wp.mat33:
    """Rows L_0, L_1, L_2: the homogeneous lines of the edges opposite each vertex."""
    l0 = edge_line(p1, p2, f[1], f[2])
    l1 = edge_line(p2, p0, f[2], f[0])
    l2 = edge_line(p0, p1, f[0], f[1])
    return wp.matrix_from_rows(l0, l1, l2)


@wp.func
def edge_functions(lines: wp.mat33, fx: float, fy: float) -> wp.vec3:
    """E_i = L_i . (fx, fy, 1)."""
    return lines * wp.vec3(fx, fy, 1.0)


@wp.func
def covers(lines: wp.mat33, e: wp.vec3, sgn: float) -> bool:
    return (
        edge_inside(e[0], lines[0], sgn) and edge_inside(e[1], lines[1], sgn) and edge_inside(e[2], lines[2], sgn)
    )


@wp.func
def depth_of(e: wp.vec3, p0: wp.vec4, p1: wp.vec4, p2: wp.vec4) -> float:
    """Interpolated z/w (linear in screen space)."""
    z = p0[2] * e[0] + p1[2] * e[1] + p2[2] * e[2]
    w = p0[3] * e[0] + p1[3] * e[1] + p2[3] * e[2]
    return z / w


@wp.func
def depth_key(zw: float, t: int) -> wp.int64:
    """64-bit key ordered by depth, then triangle id: an atomic min is a deterministic depth test."""
    bits = float_bits(zw)
    if bits < 0:  # negative floats order backwards: flip the magnitude bits
        bits = bits ^ 2147483647
    return (wp.int64(bits) << wp.int64(32)) | wp.int64(t)


@wp.func
def pixel_ndc(x: int, scale: float, offset: float) -> float:
    """NDC coordinate of pixel centre ``x`` + 0.5 (scale = 2/size, offset = 1/size - 1)."""
    return scale * float(x) + offset


@wp.func
def outside_clip(p0: wp.vec4, p1: wp.vec4, p2: wp.vec4, axis: int) -> bool:
    """All three vertices beyond the same side of one clip plane (|coord| <= w)."""
    return (p0[axis] > p0[3] and p1[axis] > p1[3] and p2[axis] > p2[3]) or (
        p0[axis] < -p0[3] and p1[axis] < -p1[3] and p2[axis] < -p2[3]
    )


@wp.func
def finite4(p: wp.vec4) -> bool:
    return wp.isfinite(p[0]) and wp.isfinite(p[1]) and wp.isfinite(p[2]) and wp.isfinite(p[3])


@wp.func
def pixel_span(a: float, b: float, c: float, size: int) -> wp.vec2i:
    """Pixel index range [lo, hi] whose centres may lie within NDC extent of a, b, c."""
    lo = (wp.min(wp.min(a, b), c) + 1.0) * 0.5 * float(size) - 1.0
    hi = (wp.max(wp.max(a, b), c) + 1.0) * 0.5 * float(size) + 1.0
    lo = wp.clamp(lo, 0.0, float(size - 1))
    hi = wp.clamp(hi, 0.0, float(size - 1))
    return wp.vec2i(int(wp.floor(lo)), int(wp.ceil(hi)))


BIG_TRIANGLE_PIXELS = 1024
"""Triangles whose pixel bounding box is larger than this are rasterised per pixel
(``raster_big``) instead of by one thread looping over the box."""


@wp.func
def triangle_key(
    p0: wp.vec4, p1: wp.vec4, p2: wp.vec4, lines: wp.mat33, sgn: float, t: int, fx: float, fy: float
) -> wp.int64:
    """Depth key of triangle ``t`` at NDC (fx, fy), or EMPTY_KEY if it does not cover it."""
    e = edge_functions(lines, fx, fy)
    if covers(lines, e, sgn):
        zw = depth_of(e, p0, p1, p2)
        if zw >= -1.0 and zw <= 1.0:
            return depth_key(zw, t)
    return EMPTY_KEY


@wp.func
def triangle_setup(pos: wp.array2d(dtype=wp.vec4), tri: wp.array(dtype=wp.vec3i), vb: int, t: int):
    """(f, lines, sign of det): ``f[0] < 0`` when the triangle is not drawn (corrupt, NaN,
    behind the eye, outside one clip plane, or zero homogeneous area)."""
    f = tri_vertices(tri, t, pos.shape[1])
    lines = wp.mat33(0.0)
    sgn = float(0.0)
    if f[0] < 0:
        return f, lines, sgn
    p0 = pos[vb, f[0]]
    p1 = pos[vb, f[1]]
    p2 = pos[vb, f[2]]
    culled = not (finite4(p0) and finite4(p1) and finite4(p2))
    culled = culled or (p0[3] <= 0.0 and p1[3] <= 0.0 and p2[3] <= 0.0)
    if not culled:
        culled = outside_clip(p0, p1, p2, 0) or outside_clip(p0, p1, p2, 1) or outside_clip(p0, p1, p2, 2)
    if not culled:
        lines = edge_setup(p0, p1, p2, f)
        det = wp.dot(lines[0], homogeneous(p0))
        culled = det == 0.0 or not wp.isfinite(det)
        sgn = wp.sign(det)
    if culled:
        f = wp.vec3i(-1, -1, -1)
    return f, lines, sgn


@wp.kernel(enable_backward=False, module="unique")
def raster_depth(
    pos: wp.array2d(dtype=wp.vec4),  # (B or 1, V) clip space
    tri: wp.array(dtype=wp.vec3i),  # (F,)
    ranges: wp.array(dtype=wp.vec2i),  # (B,) (first triangle, count)
    instanced: int,
    width: int,
    height: int,
    xs: float,
    xo: float,
    ys: float,
    yo: float,
    keys: wp.array3d(dtype=wp.int64),  # (B, H, W), EMPTY_KEY where empty
    big: wp.array(dtype=wp.vec4i),  # (B*F,) deferred big triangles: (image, triangle, 0, 0)
    big_box: wp.array(dtype=wp.vec4i),  # (B*F,) their pixel boxes (x0, x1, y0, y1)
    big_count: wp.array(dtype=wp.int32),  # (1,)
):
    """One thread per triangle: small triangles test the pixels of their bounding box
    (64-bit atomic min of the depth key), big ones are queued for :func:`raster_big`."""
    b, k = wp.tid()
    r = ranges[b]
    if k >= r[1]:
        return
    t = r[0] + k
    vb = b * instanced
    f, lines, sgn = triangle_setup(pos, tri, vb, t)
    if f[0] < 0:
        return
    p0 = pos[vb, f[0]]
    p1 = pos[vb, f[1]]
    p2 = pos[vb, f[2]]
    xr = wp.vec2i(0, width - 1)
    yr = wp.vec2i(0, height - 1)
    if p0[3] > 0.0 and p1[3] > 0.0 and p2[3] > 0.0:
        # all in front of the eye: the projected bounding box (else: the whole image)
        xr = pixel_span(p0[0] / p0[3], p1[0] / p1[3], p2[0] / p2[3], width)
        yr = pixel_span(p0[1] / p0[3], p1[1] / p1[3], p2[1] / p2[3], height)
    if (xr[1] - xr[0] + 1) * (yr[1] - yr[0] + 1) > BIG_TRIANGLE_PIXELS:
        slot = wp.atomic_add(big_count, 0, 1)
        big[slot] = wp.vec4i(b, t, 0, 0)
        big_box[slot] = wp.vec4i(xr[0], xr[1], yr[0], yr[1])
        return
    for y in range(yr[0], yr[1] + 1):
        fy = pixel_ndc(y, ys, yo)
        for x in range(xr[0], xr[1] + 1):
            key = triangle_key(p0, p1, p2, lines, sgn, t, pixel_ndc(x, xs, xo), fy)
            if key != EMPTY_KEY:
                wp.atomic_min(keys, b, y, x, key)


@wp.kernel(enable_backward=False, module="unique")
def raster_big(
    pos: wp.array2d(dtype=wp.vec4),
    tri: wp.array(dtype=wp.vec3i),
    instanced: int,
    xs: float,
    xo: float,
    ys: float,
    yo: float,
    big: wp.array(dtype=wp.vec4i),
    big_box: wp.array(dtype=wp.vec4i),
    big_count: wp.array(dtype=wp.int32),
    keys: wp.array3d(dtype=wp.int64),
):
    """One thread per pixel: the depth test against every queued big triangle whose box
    holds the pixel (runs after :func:`raster_depth`, so plain min-and-store is safe)."""
    b, y, x = wp.tid()
    best = keys[b, y, x]
    fx = pixel_ndc(x, xs, xo)
    fy = pixel_ndc(y, ys, yo)
    for k in range(big_count[0]):
        item = big[k]
        box = big_box[k]
        if item[0] == b and x >= box[0] and x <= box[1] and y >= box[2] and y <= box[3]:
            vb = b * instanced
            f, lines, sgn = triangle_setup(pos, tri, vb, item[1])
            key = triangle_key(pos[vb, f[0]], pos[vb, f[1]], pos[vb, f[2]], lines, sgn, item[1], fx, fy)
            best = wp.min(best, key)
    keys[b, y, x] = best


@wp.func
def bary_derivatives(lines: wp.mat33, e: wp.vec3, xs: float, ys: float) -> wp.vec4:
    """(du/dX, du/dY, dv/dX, dv/dY) in pixel units, exact for perspective."""
    s = e[0] + e[1] + e[2]
    u = e[0] / s
    v = e[1] / s
    a = lines[0][0] + lines[1][0] + lines[2][0]
    c = lines[0][1] + lines[1][1] + lines[2][1]
    return wp.vec4(
        xs * (lines[0][0] - u * a) / s,
        ys * (lines[0][1] - u * c) / s,
        xs * (lines[1][0] - v * a) / s,
        ys * (lines[1][1] - v * c) / s,
    )


@wp.kernel(enable_backward=False, module="unique")
def raster_resolve(
    keys: wp.array3d(dtype=wp.int64),
    pos: wp.array2d(dtype=wp.vec4),
    tri: wp.array(dtype=wp.vec3i),
    instanced: int,
    xs: float,
    xo: float,
    ys: float,
    yo: float,
    rast: wp.array3d(dtype=wp.vec4),  # (B, H, W) (u, v, z/w, id + 1)
    rast_db: wp.array3d(dtype=wp.vec4),  # (B, H, W) (du/dX, du/dY, dv/dX, dv/dY)
    big_count: wp.array(dtype=wp.int32),  # (1,) reset to 0, as the keys to EMPTY_KEY
):
    """Writes each pixel's rast/rast_db from its depth key, and leaves the keys and the
    big-triangle count cleared for the next call (so they need no fill before it)."""
    b, y, x = wp.tid()
    key = keys[b, y, x]
    keys[b, y, x] = EMPTY_KEY
    if b == 0 and y == 0 and x == 0:
        big_count[0] = 0
    if key == EMPTY_KEY:
        rast[b, y, x] = wp.vec4(0.0)
        rast_db[b, y, x] = wp.vec4(0.0)
        return
    t = int(key & wp.int64(2147483647))
    f = tri[t]
    vb = b * instanced
    p0 = pos[vb, f[0]]
    p1 = pos[vb, f[1]]
    p2 = pos[vb, f[2]]
    lines = edge_setup(p0, p1, p2, f)
    e = edge_functions(lines, pixel_ndc(x, xs, xo), pixel_ndc(y, ys, yo))
    s = e[0] + e[1] + e[2]
    # clamp as nvdiffrast does: u, v >= 0 and u + v <= 1 despite round-off
    u = wp.clamp(e[0] / s, 0.0, 1.0)
    v = wp.clamp(e[1] / s, 0.0, 1.0)
    uv_sum = wp.max(u + v, 1.0)
    zw = wp.clamp(depth_of(e, p0, p1, p2), -1.0, 1.0)
    rast[b, y, x] = wp.vec4(u / uv_sum, v / uv_sum, zw, id_to_float(t + 1))
    rast_db[b, y, x] = bary_derivatives(lines, e, xs, ys)


@wp.func
def line_grads(lines: wp.mat33, fx: float, fy: float, g: wp.vec4, gdb: wp.vec4, xs: float, ys: float) -> wp.mat33:
    """dL/dL_i (rows) of one pixel, given dL/d(u, v) in ``g[0:2]`` and dL/d(rast_db) in ``gdb``.

    u = E_0/S, v = E_1/S, S = sum E_i, E_i = a_i X + b_i Y + c_i with L_i = (a_i, b_i, c_i);
    the derivatives are (a_0 - u A)/S etc. with A = sum a_i, B = sum b_i (see
    :func:`bary_derivatives`)."""
    e = lines * wp.vec3(fx, fy, 1.0)
    s = e[0] + e[1] + e[2]
    u = e[0] / s
    v = e[1] / s
    a = lines[0][0] + lines[1][0] + lines[2][0]
    bsum = lines[0][1] + lines[1][1] + lines[2][1]
    g1 = xs * gdb[0]
    g2 = ys * gdb[1]
    g3 = xs * gdb[2]
    g4 = ys * gdb[3]
    dux = (lines[0][0] - u * a) / s
    duy = (lines[0][1] - u * bsum) / s
    dvx = (lines[1][0] - v * a) / s
    dvy = (lines[1][1] - v * bsum) / s
    gu = g[0] - (g1 * a + g2 * bsum) / s
    gv = g[1] - (g3 * a + g4 * bsum) / s
    gs = -(g1 * dux + g2 * duy + g3 * dvx + g4 * dvy) / s - (gu * u + gv * v) / s
    ga_sum = -(g1 * u + g3 * v) / s
    gb_sum = -(g2 * u + g4 * v) / s
    ge = wp.vec3(gu / s + gs, gv / s + gs, gs)
    ga = wp.vec3(g1 / s + ga_sum, g3 / s + ga_sum, ga_sum) + ge * fx
    gb = wp.vec3(g2 / s + gb_sum, g4 / s + gb_sum, gb_sum) + ge * fy
    return wp.mat33(ga[0], gb[0], ge[0], ga[1], gb[1], ge[1], ga[2], gb[2], ge[2])


@wp.func
def xyw_grad(g: wp.vec3) -> wp.vec4:
    """A gradient in (x, y, w) as a clip-space (x, y, z, w) gradient (z gets none)."""
    return wp.vec4(g[0], g[1], 0.0, g[2])


@functools.cache
def make_raster_bwd(mode: str):
    """Backward of the rasteriser into clip-space positions, accumulated with ``mode``.

    One thread per pixel (tiled launch, see ``tile_pixel``); every lane makes the three
    accumulator calls, with ``valid=False`` where it has nothing to add, planned once per
    warp by the triangle's first vertex (`keyed_plan`)."""
    plan = keyed_plan(mode)
    add = planned_accumulator(wp.vec4, mode)

    def raster_bwd(
        rast: wp.array(dtype=wp.vec4),  # (B*H*W,)
        grad_rast: wp.array(dtype=wp.vec4),  # (B*H*W,)
        grad_db: wp.array(dtype=wp.vec4),  # (B*H*W,) or empty: no rast_db gradient
        pos: wp.array2d(dtype=wp.vec4),
        tri: wp.array(dtype=wp.vec3i),
        instanced: int,
        width: int,
        height: int,
        xs: float,
        xo: float,
        ys: float,
        yo: float,
        threshold: int,
        grad_pos: wp.array(dtype=wp.vec4),  # (B*V or V,) flat
    ):
        tp = tile_pixel(wp.tid(), width, height)
        b = tp[0]
        y = tp[1]
        x = tp[2]
        ii = (b * height + y) * width + x
        valid = tp[3] != 0
        t = float_to_id(rast[ii][3]) - 1
        valid = valid and t >= 0 and t < tri.shape[0]
        num_v = pos.shape[1]
        f = wp.vec3i(0, 0, 0)
        if valid:
            f = tri_vertices(tri, t, num_v)
            valid = f[0] >= 0
        g = wp.vec4(0.0)
        gdb = wp.vec4(0.0)
        if valid:
            g = grad_rast[ii]
            if grad_db.shape[0] > 0:
                gdb = grad_db[ii]
        gl = wp.mat33(0.0)
        vb = b * instanced
        p0 = wp.vec4(0.0)
        p1 = wp.vec4(0.0)
        p2 = wp.vec4(0.0)
        if valid:
            p0 = pos[vb, f[0]]
            p1 = pos[vb, f[1]]
            p2 = pos[vb, f[2]]
            lines = wp.matrix_from_rows(
                wp.cross(homogeneous(p1), homogeneous(p2)),
                wp.cross(homogeneous(p2), homogeneous(p0)),
                wp.cross(homogeneous(p0), homogeneous(p1)),
            )
            gl = line_grads(lines, pixel_ndc(x, xs, xo), pixel_ndc(y, ys, yo), g, gdb, xs, ys)
        # L_i = v_j x v_k: d/dv_j = v_k x g_i, d/dv_k = g_i x v_j
        h0 = homogeneous(p0)
        h1 = homogeneous(p1)
        h2 = homogeneous(p2)
        g0 = wp.cross(h1, gl[2]) + wp.cross(gl[1], h2)
        g1 = wp.cross(h2, gl[0]) + wp.cross(gl[2], h0)
        g2 = wp.cross(h0, gl[1]) + wp.cross(gl[0], h1)
        base = vb * num_v
        planned = plan(base + f[0], valid, threshold)
        add(grad_pos, base + f[0], xyw_grad(g0), valid, threshold, planned)
        add(grad_pos, base + f[1], xyw_grad(g1), valid, threshold, planned)
        add(grad_pos, base + f[2], xyw_grad(g2), valid, threshold, planned)

    return wp.kernel(raster_bwd, enable_backward=False, module="unique")
