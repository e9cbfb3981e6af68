"""Analytic antialiasing kernels (Laine et al. 2020, as nvdiffrast 0.4's antialias).

Each pixel owns two neighbour pairs: with the pixel to its right (d = 0) and below
(d = 1). Where the two triangle ids differ, the nearer triangle (or the only one)
is tested for a silhouette edge that crosses the segment between the two pixel
centres: an edge on the mesh boundary, or one whose neighbour across the edge
(``opposite`` vertex from the topology hash) lies on the same side as the triangle
itself in screen space. The crossing point dc in [0, 1] (from the chosen pixel
centre) gives alpha = ds (0.5 - dc), and the colour of the pixel on the covered
side is blended: out[target] += alpha (c1 - c0), target = pixel 0 if alpha > 0 else
pixel 1. Vertical neighbours swap x and y so that both cases test a horizontal segment.
"""

import functools

import warp as wp

from arc_warp._src.mesh.funcs import float_to_id, same_sign, tile_pixel
from arc_warp._src.mesh.raster_kernels import tri_vertices
from arc_warp._src.arc.reduce_funcs import accumulator

F32_MAX = wp.constant(3.402823466e38)
EPS = wp.constant(0.0625)  # crossings up to 1/16 pixel outside the segment still count


@wp.func
def rational_gt(n0: float, n1: float, d0: float, d1: float) -> bool:
    """n0/d0 > n1/d1 without dividing."""
    return (n0 * d1 > n1 * d0) == same_sign(d0, d1)


@wp.func
def max_idx3(n: wp.vec3, d: wp.vec3) -> int:
    g10 = rational_gt(n[1], n[0], d[1], d[0])
    g20 = rational_gt(n[2], n[0], d[2], d[0])
    g21 = rational_gt(n[2], n[1], d[2], d[1])
    if g20 and g21:
        return 2
    if g10:
        return 1
    return 0


@wp.func
def screen(p: wp.vec4, xh: float, yh: float, fx: float, fy: float) -> wp.vec2:
    """Pixel-space position relative to the reference pixel centre."""
    iw = 1.0 / p[3]
    return wp.vec2(p[0] * iw * xh - fx, p[1] * iw * yh - fy)


@wp.func
def screen_grad(p: wp.vec4, g: wp.vec2, xh: float, yh: float) -> wp.vec4:
    """Clip-space gradient of a pixel-space gradient ``g`` (X = x/w xh - fx, Y = y/w yh - fy)."""
    iw = 1.0 / p[3]
    gx = g[0] * xh * iw
    gy = g[1] * yh * iw
    return wp.vec4(gx, gy, 0.0, -(p[0] * gx + p[1] * gy) * iw)


@wp.func
def area2(a: wp.vec2, b: wp.vec2, c: wp.vec2) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (c[0] - a[0]) * (b[1] - a[1])


@wp.func
def swap_xy(a: wp.vec2, d: int) -> wp.vec2:
    if d == 1:
        return wp.vec2(a[1], a[0])
    return a


@wp.struct
class EdgeHit:
    alpha: float  # 0: no antialiasing for this pair
    edge: int  # edge index (opposite vertex) within ``tri``
    tri: int
    ref_x: int  # pixel whose triangle was chosen (pixel 0 or 1)
    ref_y: int


@wp.func
def analyse_pair(
    rast: wp.array3d(dtype=wp.vec4),
    pos: wp.array2d(dtype=wp.vec4),
    tri: wp.array(dtype=wp.vec3i),
    opposite: wp.array(dtype=wp.vec3i),
    instanced: int,
    b: int,
    x: int,
    y: int,
    d: int,
) -> EdgeHit:
    hit = EdgeHit()
    hit.alpha = 0.0
    hit.edge = 0
    hit.tri = -1
    height = rast.shape[1]
    width = rast.shape[2]
    x1 = x + 1 - d
    y1 = y + d
    if x1 >= width or y1 >= height:
        return hit
    r0 = rast[b, y, x]
    r1 = rast[b, y1, x1]
    t0 = float_to_id(r0[3]) - 1
    t1 = float_to_id(r1[3]) - 1
    if t0 == t1:
        return hit
    t = t0
    if t0 < 0:
        t = t1
    if t0 >= 0 and t1 >= 0 and not (r0[2] < r1[2]):
        t = t1
    rx = x
    ry = y
    if t == t1:
        rx = x1
        ry = y1
    if t < 0 or t >= tri.shape[0]:
        return hit
    num_v = pos.shape[1]
    f = tri_vertices(tri, t, num_v)
    if f[0] < 0:
        return hit
    op = opposite[t]
    vb = b * instanced
    xh = 0.5 * float(width)
    yh = 0.5 * float(height)
    fx = float(rx) + 0.5 - xh
    fy = float(ry) + 0.5 - yh
    p0 = pos[vb, f[0]]
    p1 = pos[vb, f[1]]
    p2 = pos[vb, f[2]]
    q0 = screen(p0, xh, yh, fx, fy)
    q1 = screen(p1, xh, yh, fx, fy)
    q2 = screen(p2, xh, yh, fx, fy)
    # wing vertices: the vertex itself where the edge has no neighbour (always silhouette)
    o0 = q0
    o1 = q1
    o2 = q2
    if op[0] >= 0:
        o0 = screen(pos[vb, op[0]], xh, yh, fx, fy)
    if op[1] >= 0:
        o1 = screen(pos[vb, op[1]], xh, yh, fx, fy)
    if op[2] >= 0:
        o2 = screen(pos[vb, op[2]], xh, yh, fx, fy)
    bb = area2(q0, q1, q2)
    a0 = area2(o0, q1, q2)
    a1 = area2(o1, q2, q0)
    a2 = area2(o2, q0, q1)
    if not (same_sign(a0, bb) or same_sign(a1, bb) or same_sign(a2, bb)):
        return hit
    q0 = swap_xy(q0, d)
    q1 = swap_xy(q1, d)
    q2 = swap_xy(q2, d)
    ds = float(1.0)
    if t == t1:
        ds = -1.0
    dxs = wp.vec3(q2[0] - q1[0], q0[0] - q2[0], q1[0] - q0[0])
    dys = wp.vec3(q2[1] - q1[1], q0[1] - q2[1], q1[1] - q0[1])
    dn = wp.vec3(ds * (q1[0] * dys[0] - q1[1] * dxs[0]), ds * (q2[0] * dys[1] - q2[1] * dxs[1]),
                 ds * (q0[0] * dys[2] - q0[1] * dxs[2]))
    # edges that do not cross the segment's line never win
    if same_sign(q1[1], q2[1]):
        dn[0] = -F32_MAX
        dys[0] = 1.0
    if same_sign(q2[1], q0[1]):
        dn[1] = -F32_MAX
        dys[1] = 1.0
    if same_sign(q0[1], q1[1]):
        dn[2] = -F32_MAX
        dys[2] = 1.0
    di = max_idx3(dn, dys)
    wing = wp.vec3(a0, a1, a2)
    dc = -F32_MAX
    if same_sign(wing[di], bb) and wp.abs(dys[di]) >= wp.abs(dxs[di]):
        dc = dn[di] / dys[di]
    if dc > -EPS and dc < 1.0 + EPS:
        hit.alpha = ds * (0.5 - wp.clamp(dc, 0.0, 1.0))
        hit.edge = di
        hit.tri = t
        hit.ref_x = rx
        hit.ref_y = ry
    return hit


@wp.func
def blended_pixel(alpha: float, x: int, y: int, x1: int, y1: int) -> wp.vec2i:
    """(y, x) of the pixel of a pair that the edge blends into: (x, y) for alpha > 0,
    else its neighbour (x1, y1)."""
    if alpha > 0.0:
        return wp.vec2i(y, x)
    return wp.vec2i(y1, x1)


@wp.kernel(enable_backward=False, module="unique")
def aa_fwd(
    color: wp.array4d(dtype=float),  # (B, H, W, C)
    rast: wp.array3d(dtype=wp.vec4),
    pos: wp.array2d(dtype=wp.vec4),
    tri: wp.array(dtype=wp.vec3i),
    opposite: wp.array(dtype=wp.vec3i),
    instanced: int,
    out: wp.array4d(dtype=float),  # (B, H, W, C), holds color on entry
):
    b, y, x = wp.tid()
    for d in range(2):
        hit = analyse_pair(rast, pos, tri, opposite, instanced, b, x, y, d)
        if hit.alpha != 0.0:
            x1 = x + 1 - d
            y1 = y + d
            t = blended_pixel(hit.alpha, x, y, x1, y1)
            for c in range(color.shape[3]):
                wp.atomic_add(out, b, t[0], t[1], c, hit.alpha * (color[b, y1, x1, c] - color[b, y, x, c]))


@functools.cache
def make_aa_bwd(mode: str):
    """Backward of :func:`aa_fwd`: colour gradients (the pass-through and the blends',
    plain atomics: each blend's goes to one of two pixels) and the edge-vertex position gradients accumulated with ``mode``. One
    thread per pixel, padded launch; every lane makes 4 accumulator calls."""
    add = accumulator(wp.vec4, mode)

    def aa_bwd(
        color: wp.array4d(dtype=float),
        rast: wp.array3d(dtype=wp.vec4),
        pos: wp.array2d(dtype=wp.vec4),
        tri: wp.array(dtype=wp.vec3i),
        opposite: wp.array(dtype=wp.vec3i),
        instanced: int,
        grad_out: wp.array4d(dtype=float),
        boost: float,
        threshold: int,
        grad_color: wp.array4d(dtype=float),  # added into: grad_out, plus the blends' gradients
        grad_pos: wp.array(dtype=wp.vec4),  # (B*V or V,) flat, added into
    ):
        height = rast.shape[1]
        width = rast.shape[2]
        tp = tile_pixel(wp.tid(), width, height)
        b = tp[0]
        y = tp[1]
        x = tp[2]
        inside = tp[3] != 0
        num_v = pos.shape[1]
        vb = b * instanced
        xh = 0.5 * float(width)
        yh = 0.5 * float(height)
        if inside:
            # the colour passes through unchanged except across edges; atomic, as the
            # neighbours' blend gradients land here too
            for c in range(color.shape[3]):
                wp.atomic_add(grad_color, b, y, x, c, grad_out[b, y, x, c])
        for d in range(2):
            hit = analyse_pair(rast, pos, tri, opposite, instanced, b, x, y, d)
            valid = inside and hit.alpha != 0.0
            x1 = x + 1 - d
            y1 = y + d
            dd = float(0.0)
            if valid:
                t = blended_pixel(hit.alpha, x, y, x1, y1)
                for c in range(color.shape[3]):
                    g = grad_out[b, t[0], t[1], c]
                    dd += g * (color[b, y1, x1, c] - color[b, y, x, c])
                    wp.atomic_add(grad_color, b, y, x, c, -hit.alpha * g)
                    wp.atomic_add(grad_color, b, y1, x1, c, hit.alpha * g)
            # alpha saturated at +-0.5: the crossing was clamped, no position gradient
            valid = valid and dd != 0.0 and wp.abs(hit.alpha) < 0.5
            va = int(0)
            vbx = int(0)
            ga = wp.vec4(0.0)
            gb = wp.vec4(0.0)
            if valid:
                f = tri[hit.tri]
                va = f[(hit.edge + 1) % 3]
                vbx = f[(hit.edge + 2) % 3]
                pa = pos[vb, va]
                pb = pos[vb, vbx]
                fx = float(hit.ref_x) + 0.5 - xh
                fy = float(hit.ref_y) + 0.5 - yh
                qa = swap_xy(screen(pa, xh, yh, fx, fy), d)
                qb = swap_xy(screen(pb, xh, yh, fx, fy), d)
                dx = qb[0] - qa[0]
                dy = qb[1] - qa[1]
                # alpha = ds/2 - x_cross, x_cross = xa - ya dx / dy: dL/dx_cross = -dd
                g = -dd * boost
                gqa = swap_xy(wp.vec2(g * qb[1] / dy, -g * (dx / dy) * (qb[1] / dy)), d)
                gqb = swap_xy(wp.vec2(-g * qa[1] / dy, g * qa[1] * dx / (dy * dy)), d)
                ga = screen_grad(pa, gqa, xh, yh)
                gb = screen_grad(pb, gqb, xh, yh)
            base = vb * num_v
            add(grad_pos, base + va, ga, valid, threshold)
            add(grad_pos, base + vbx, gb, valid, threshold)

    return wp.kernel(aa_bwd, enable_backward=False, module="unique")

