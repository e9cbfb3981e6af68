"""Rasteriser kernels: per-triangle coverage and depth test, per-pixel resolve, ARC backward
into positions.

Which triangle a pixel gets follows nvdiffrast's CUDA rasteriser (cudaraster) exactly:

- Viewports: an image is drawn in nvdiffrast's viewport tiles (one up to 2048 pixels a
  side, more above), each with its own affine change of clip-space x and y.
- Clipping: a triangle wholly outside one frustum plane (|x|, |y|, |z| <= w) is dropped;
  one not wholly inside is clipped against the planes in float32 (on barycentrics, as
  nvdiffrast) and drawn as a fan of sub-triangles.
- Snapping: vertices go to a grid of 1/16 pixel: round-half-even of (x (1/w)) 8 W, origin
  at the viewport centre, so pixel centres lie on it.
- Coverage: exact integer edge functions of the snapped triangle, ordered
  counter-clockwise; a pixel centre on an edge is covered when the edge runs down (-y) or
  along +x, so two triangles sharing an edge never both cover it. Triangles of zero
  snapped area are not drawn; both faces are.
- Depth: nvdiffrast's 32-bit fixed-point plane of z/w, evaluated per pixel in wrapping
  integer arithmetic; a value above DEPTH_MAX is discarded, the smallest wins, and ties go
  to the later triangle (sub-triangles of one triangle share its id).

The resolve then computes (u, v, z/w) and their derivatives as nvdiffrast's pixel shader
does: perspective-correct, from the unsnapped float32 positions of the winning triangle,
u, v clamped to it. The backward differentiates that, clamp included (nvdiffrast's
differentiates the unclamped u, v): a centre that snapping puts inside a thin triangle
can be far outside it in exact barycentrics. It recomputes u, v as the resolve does, to
the bit (``pixel_lines``, relative to the pixel centre), so it takes the clamp's
derivative exactly where the forward clamped.
"""

import functools

import numpy as np
import warp as wp

from arc_warp._src.mesh.funcs import (
    fma32,
    float_bits,
    float_to_id,
    id_to_float,
    tile_pixel,
)
from arc_warp._src.arc.reduce_funcs import keyed_plan, planned_accumulator

EMPTY_KEY = wp.constant(wp.int64(9223372036854775807))
VIEWPORT_MAX = 2048
"""Largest viewport side; nvdiffrast draws larger images in several (see ``viewport_tile``)."""
DEPTH_MAX = wp.constant(wp.uint32(4294949695))
"""Cleared depth, 2^32 - 1 - 17600; fragments above it are discarded."""
Z_SCALE = wp.constant(float(np.float32(4294932095) * np.float32(0.5)))
"""z/w -> depth: z/w * Z_SCALE + 2^31, float32 as nvdiffrast rounds (DEPTH_MAX - 17600) / 2."""
U32_MAX = wp.constant(wp.uint32(4294967295))
KEY_DEPTH = wp.constant(wp.int64(4294967296))
KEY_HALF = wp.constant(wp.int64(2147483648))
KEY_ID = wp.constant(wp.int64(2147483647))
vec3u = wp.types.vector(length=3, dtype=wp.uint32)
vec18 = wp.types.vector(length=18, dtype=wp.float32)


def viewport_tile(size: int) -> int:
    """Side of nvdiffrast's viewport tiles along an image axis of ``size`` pixels (all but
    the last are this long): the axis, padded to 8, split evenly into tiles of at most
    VIEWPORT_MAX, each padded to 8."""
    padded = (size + 7) // 8 * 8
    count = -(-padded // VIEWPORT_MAX)
    return (-(-padded // count) + 7) // 8 * 8


@wp.struct
class Viewport:
    """One viewport tile: pixels origin .. origin + size - 1, whose clip space is the
    image's with x' = x scale + w shift (and y likewise)."""

    origin: wp.vec2i
    size: wp.vec2i
    scale: wp.vec2
    shift: wp.vec2


@wp.func
def viewport(tx: int, ty: int, width: int, height: int, tile: wp.vec2i) -> Viewport:
    """Viewport tile (tx, ty) of a width x height image cut in tiles of ``tile`` pixels."""
    vp = Viewport()
    vp.origin = wp.vec2i(tx * tile[0], ty * tile[1])
    vp.size = wp.vec2i(wp.min(width - vp.origin[0], tile[0]), wp.min(height - vp.origin[1], tile[1]))
    w = float(vp.size[0])
    h = float(vp.size[1])
    vp.scale = wp.vec2(float(width) / w, float(height) / h)
    vp.shift = wp.vec2(float(width - vp.size[0] - 2 * vp.origin[0]) / w,
                       float(height - vp.size[1] - 2 * vp.origin[1]) / h)
    return vp


@wp.func
def to_viewport(p: wp.vec4, vp: Viewport) -> wp.vec4:
    """Clip-space position in the viewport's clip space (unchanged for a single viewport)."""
    x = fma32(p[0], vp.scale[0], p[3] * vp.shift[0])
    return wp.vec4(x, fma32(p[1], vp.scale[1], p[3] * vp.shift[1]), p[2], p[3])


@wp.func
def tri_vertices(tri: wp.array(dtype=wp.vec3i), t: int, num_vertices: int) -> wp.vec3i:
    """Vertex indices of triangle ``t``, or (-1, -1, -1) if any is out of range."""
    f = tri[t]
    if f[0] < 0 or f[1] < 0 or f[2] < 0 or f[0] >= num_vertices or f[1] >= num_vertices or f[2] >= num_vertices:
        return wp.vec3i(-1, -1, -1)
    return f


@wp.func
def finite4(p: wp.vec4) -> bool:
    return wp.isfinite(p[0]) and wp.isfinite(p[1]) and wp.isfinite(p[2]) and wp.isfinite(p[3])


@wp.func
def outside_plane(q0: wp.vec4, q1: wp.vec4, q2: wp.vec4) -> bool:
    """All three vertices strictly beyond one frustum plane (|coord| <= w): not drawn."""
    for axis in range(3):
        if q0[3] < q0[axis] and q1[3] < q1[axis] and q2[3] < q2[axis]:
            return True
        if q0[3] < -q0[axis] and q1[3] < -q1[axis] and q2[3] < -q2[axis]:
            return True
    return False


@wp.func
def in_frustum(q: wp.vec4) -> bool:
    return q[3] >= wp.max(wp.max(wp.abs(q[0]), wp.abs(q[1])), wp.abs(q[2]))


@wp.func
def crosses(q0: wp.vec4, q1: wp.vec4, q2: wp.vec4, axis: int) -> bool:
    """Some vertex beyond the frustum plane x = w or x = -w (of this axis)."""
    return q0[3] < wp.abs(q0[axis]) or q1[3] < wp.abs(q1[axis]) or q2[3] < wp.abs(q2[axis])


@wp.func
def clip_plane(bary: vec18, n: int, h0: float, h1: float, h2: float):
    """(corners, count): one Sutherland-Hodgman pass over the polygon of ``n`` corners, each
    barycentrics (b1, b2) of the triangle, keeping where h0 + h1 b1 + h2 b2 >= 0. Order and
    roundings are nvdiffrast's; at most 9 corners are kept (a triangle clipped by six
    planes has no more)."""
    out = vec18()
    m = int(0)
    if n >= 3:
        a1 = bary[2 * n - 2]
        a2 = bary[2 * n - 1]
        ha = fma32(h2, a2, fma32(h1, a1, h0))
        for k in range(n):
            c1 = bary[2 * k]
            c2 = bary[2 * k + 1]
            hc = fma32(h2, c2, fma32(h1, c1, h0))
            if ha * hc < 0.0 and m < 9:
                tc = ha / (ha - hc)
                ta = 1.0 - tc
                out[2 * m] = fma32(a1, ta, c1 * tc)
                out[2 * m + 1] = fma32(a2, ta, c2 * tc)
                m += 1
            if hc >= 0.0 and m < 9:
                out[2 * m] = c1
                out[2 * m + 1] = c2
                m += 1
            a1 = c1
            a2 = c2
            ha = hc
    return out, m


@wp.func
def clip(q0: wp.vec4, d1: wp.vec4, d2: wp.vec4, q1: wp.vec4, q2: wp.vec4):
    """(corners, count): the triangle q0 + b1 d1 + b2 d2 clipped to the frustum, as
    barycentrics; an axis is clipped only where some vertex is beyond its planes."""
    bary = vec18()
    bary[2] = 1.0
    bary[5] = 1.0
    n = int(3)
    for axis in range(3):
        if crosses(q0, q1, q2, axis):
            bary, n = clip_plane(bary, n, q0[3] + q0[axis], d1[3] + d1[axis], d2[3] + d2[axis])
            bary, n = clip_plane(bary, n, q0[3] - q0[axis], d1[3] - d1[axis], d2[3] - d2[axis])
    return bary, n


@wp.func
def corner(q0: wp.vec4, d1: wp.vec4, d2: wp.vec4, bary: vec18, i: int) -> wp.vec4:
    """Clip-space position of corner ``i`` of a clipped polygon (rounded as nvdiffrast)."""
    b1 = bary[2 * i]
    b2 = bary[2 * i + 1]
    return wp.vec4(
        fma32(d2[0], b2, fma32(d1[0], b1, q0[0])),
        fma32(d2[1], b2, fma32(d1[1], b1, q0[1])),
        fma32(d2[2], b2, fma32(d1[2], b1, q0[2])),
        fma32(d2[3], b2, fma32(d1[3], b1, q0[3])),
    )


@wp.func
def snap_coord(c: float, rcp_w: float, scale: float) -> int:
    """Fixed-point c / w: round-half-even, NaN -> 0 (the GPU's cvt.rni.sat; clamped into int32,
    which in-frustum vertices are far inside)."""
    s = (c * rcp_w) * scale
    if s != s:
        return 0
    return int(wp.rint(wp.clamp(s, -2147483648.0, 2147483520.0)))


@wp.struct
class Snapped:
    """A (sub-)triangle on the viewport's 1/16-pixel grid, counter-clockwise (area > 0;
    area = 0: not drawn). ``bias`` 1 marks edges that do not cover centres on them;
    ``lo``..``hi`` the viewport pixels of its box; ``zvert`` the vertices' depths."""

    p0: wp.vec2i
    p1: wp.vec2i
    p2: wp.vec2i
    bias: wp.vec3i
    lo: wp.vec2i
    hi: wp.vec2i
    zvert: wp.vec3
    area: int


@wp.func
def exclusive(d: wp.vec2i) -> int:
    """1 for an edge along ``d`` that does not cover centres on it: it runs up (+y), or
    along -x (the fill rule)."""
    if d[1] > 0 or (d[1] == 0 and d[0] <= 0):
        return 1
    return 0


@wp.func
def snap(q0: wp.vec4, q1: wp.vec4, q2: wp.vec4, vp: Viewport) -> Snapped:
    """Snapped triangle of viewport clip-space vertices."""
    sx = float(vp.size[0] * 8)
    sy = float(vp.size[1] * 8)
    r = wp.vec3(1.0 / q0[3], 1.0 / q1[3], 1.0 / q2[3])
    z = wp.vec3(q0[2], q1[2], q2[2])
    s = Snapped()
    s.p0 = wp.vec2i(snap_coord(q0[0], r[0], sx), snap_coord(q0[1], r[0], sy))
    p1 = wp.vec2i(snap_coord(q1[0], r[1], sx), snap_coord(q1[1], r[1], sy))
    p2 = wp.vec2i(snap_coord(q2[0], r[2], sx), snap_coord(q2[1], r[2], sy))
    d1 = p1 - s.p0
    d2 = p2 - s.p0
    s.area = d1[0] * d2[1] - d1[1] * d2[0]
    if s.area < 0:
        s.area = -s.area
        p1, p2 = p2, p1
        r = wp.vec3(r[0], r[2], r[1])
        z = wp.vec3(z[0], z[2], z[1])
    s.p1 = p1
    s.p2 = p2
    s.bias = wp.vec3i(exclusive(p1 - s.p0), exclusive(p2 - p1), exclusive(s.p0 - p2))
    s.zvert = wp.vec3(
        fma32(z[0] * Z_SCALE, r[0], 2147483648.0),
        fma32(z[1] * Z_SCALE, r[1], 2147483648.0),
        fma32(z[2] * Z_SCALE, r[2], 2147483648.0),
    )
    # pixel x has its centre at 16 x + 8 - 8 W on the grid
    half = vp.size * 8
    lo = wp.vec2i(wp.min(wp.min(s.p0[0], p1[0]), p2[0]), wp.min(wp.min(s.p0[1], p1[1]), p2[1]))
    hi = wp.vec2i(wp.max(wp.max(s.p0[0], p1[0]), p2[0]), wp.max(wp.max(s.p0[1], p1[1]), p2[1]))
    s.lo = wp.vec2i(wp.max((lo[0] + half[0] + 7) >> 4, 0), wp.max((lo[1] + half[1] + 7) >> 4, 0))
    s.hi = wp.vec2i(wp.min((hi[0] + half[0] - 8) >> 4, vp.size[0] - 1),
                    wp.min((hi[1] + half[1] - 8) >> 4, vp.size[1] - 1))
    if s.area == 0:
        s.hi = s.lo - wp.vec2i(1, 1)
    return s


@wp.func
def edge_value(a: wp.vec2i, b: wp.vec2i, sx: int, sy: int) -> int:
    """Edge function of a -> b at grid point (sx, sy): > 0 on its left (inside)."""
    return (a[0] - sx) * (b[1] - a[1]) - (a[1] - sy) * (b[0] - a[0])


@wp.func
def covers(s: Snapped, px: int, py: int, vp: Viewport) -> bool:
    """Viewport pixel (px, py) covered: its centre inside every edge, or on one that covers it."""
    sx = px * 16 + 8 - vp.size[0] * 8
    sy = py * 16 + 8 - vp.size[1] * 8
    return (
        edge_value(s.p0, s.p1, sx, sy) >= s.bias[0]
        and edge_value(s.p1, s.p2, sx, sy) >= s.bias[1]
        and edge_value(s.p2, s.p0, sx, sy) >= s.bias[2]
    )


@wp.func
def float_to_u32(f: float) -> wp.uint32:
    """float -> uint32 as a CUDA cast: truncated, saturated, NaN -> 0."""
    if not (f > 0.0):
        return wp.uint32(0)
    if f >= 4294967296.0:
        return U32_MAX
    return wp.uint32(wp.int64(f))


@wp.func
def wrap_mul(a: wp.int64, b: wp.int64) -> wp.int64:
    """a * b modulo 2^64 (signed overflow wraps as on the GPU)."""
    return wp.int64(wp.uint64(a) * wp.uint64(b))


@wp.func
def depth_plane(s: Snapped, vp: Viewport) -> vec3u:
    """(a, b, c): depth at viewport pixel (px, py) is a px + b py + c modulo 2^32.

    nvdiffrast's fixed-point plane through the vertex depths: depth differences scaled
    to at most 24 bits (shift ``sh``), slopes from the float32 mantissa and exponent of
    1/area in 64-bit integers, the constant taken at the box centre."""
    z = s.zvert
    sh = wp.clamp((float_bits(wp.max(wp.max(z[0], z[1]), z[2])) >> 23) - 149, 0, 8)
    ush = wp.uint32(sh)
    t0 = wp.int64(float_to_u32(z[0]) >> ush)
    t1 = wp.int64(float_to_u32(z[1]) >> ush) - t0
    t2 = wp.int64(float_to_u32(z[2]) >> ush) - t0
    d1 = s.p1 - s.p0
    d2 = s.p2 - s.p0
    rcp = float_bits(1.0 / float(s.area))
    mant = wp.int64((rcp & 8388607) | 8388608)
    shift = 150 - (rcp >> 23) - sh
    xc = wrap_mul(t1 * wp.int64(d2[1]) - t2 * wp.int64(d1[1]), mant)
    yc = wrap_mul(t2 * wp.int64(d1[0]) - t1 * wp.int64(d2[0]), mant)
    a = wp.uint32(xc >> wp.int64(shift - 4))
    b = wp.uint32(yc >> wp.int64(shift - 4))
    # p0 relative to pixel (0, 0)'s centre; (cx, cy) the pixel at the box centre
    org = s.p0 + vp.size * 8 - wp.vec2i(8, 8)
    cx = (2 * org[0] + wp.min(wp.min(d1[0], d2[0]), 0) + wp.max(wp.max(d1[0], d2[0]), 0)) >> 5
    cy = (2 * org[1] + wp.min(wp.min(d1[1], d2[1]), 0) + wp.max(wp.max(d1[1], d2[1]), 0)) >> 5
    off = wp.uint64(wrap_mul(xc >> wp.int64(13), wp.int64(org[0] - cx * 16)))
    off = off + wp.uint64(wrap_mul(yc >> wp.int64(13), wp.int64(org[1] - cy * 16)))
    c = (wp.uint32(t0) << ush) - wp.uint32(wp.int64(off) >> wp.int64(shift - 13))
    return vec3u(a, b, c - (a * wp.uint32(cx) + b * wp.uint32(cy)))


@wp.func
def pixel_key(plane: vec3u, px: int, py: int, t: int) -> wp.int64:
    """64-bit key of triangle ``t`` at viewport pixel (px, py), ordered by depth, then by
    later triangle first (an atomic min is nvdiffrast's depth test); EMPTY_KEY if the
    depth is above DEPTH_MAX."""
    depth = plane[0] * wp.uint32(px) + plane[1] * wp.uint32(py) + plane[2]
    if depth > DEPTH_MAX:
        return EMPTY_KEY
    return (wp.int64(depth) - KEY_HALF) * KEY_DEPTH + (KEY_ID - wp.int64(t))


@wp.func
def key_triangle(key: wp.int64) -> int:
    """Triangle id of a depth key (not EMPTY_KEY)."""
    return int(KEY_ID - (key & wp.int64(4294967295)))


@wp.func
def draw(s: Snapped, vp: Viewport, b: int, t: int, keys: wp.array3d(dtype=wp.int64)):
    """Depth-tests every pixel that ``s`` covers (64-bit atomic min of the keys)."""
    if s.area != 0:
        plane = depth_plane(s, vp)
        for py in range(s.lo[1], s.hi[1] + 1):
            for px in range(s.lo[0], s.hi[0] + 1):
                if covers(s, px, py, vp):
                    key = pixel_key(plane, px, py, t)
                    if key != EMPTY_KEY:
                        wp.atomic_min(keys, b, vp.origin[1] + py, vp.origin[0] + px, key)


@wp.struct
class Clipped:
    """A triangle in one viewport's clip space, as nvdiffrast draws it: ``count``
    sub-triangles (0: culled), the triangle itself when ``whole``, else the fan of the
    corners of its clipped polygon (barycentrics ``bary`` along d1 = q1 - q0, d2 = q2 - q0)."""

    q0: wp.vec4
    q1: wp.vec4
    q2: wp.vec4
    d1: wp.vec4
    d2: wp.vec4
    bary: vec18
    count: int
    whole: bool


@wp.func
def clipped(p0: wp.vec4, p1: wp.vec4, p2: wp.vec4, vp: Viewport) -> Clipped:
    """Triangle p0 p1 p2 (image clip space) clipped to viewport ``vp``'s frustum."""
    c = Clipped()
    c.q0 = to_viewport(p0, vp)
    c.q1 = to_viewport(p1, vp)
    c.q2 = to_viewport(p2, vp)
    if outside_plane(c.q0, c.q1, c.q2):
        return c
    c.whole = in_frustum(c.q0) and in_frustum(c.q1) and in_frustum(c.q2)
    c.count = 1
    if not c.whole:
        c.d1 = c.q1 - c.q0
        c.d2 = c.q2 - c.q0
        bary, n = clip(c.q0, c.d1, c.d2, c.q1, c.q2)
        c.bary = bary
        c.count = wp.max(n - 2, 0)
    return c


@wp.func
def piece(c: Clipped, i: int, vp: Viewport) -> Snapped:
    """Sub-triangle ``i`` of ``c``, snapped."""
    if c.whole:
        return snap(c.q0, c.q1, c.q2, vp)
    return snap(corner(c.q0, c.d1, c.d2, c.bary, 0), corner(c.q0, c.d1, c.d2, c.bary, i + 1),
                corner(c.q0, c.d1, c.d2, c.bary, i + 2), vp)


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
def drawn_vertices(pos: wp.array2d(dtype=wp.vec4), tri: wp.array(dtype=wp.vec3i), vb: int, t: int) -> wp.vec3i:
    """Vertex indices of triangle ``t``, or ``f[0] < 0`` when it is not drawn (an index out
    of range, a non-finite coordinate, or every w <= 0)."""
    f = tri_vertices(tri, t, pos.shape[1])
    if f[0] < 0:
        return f
    p0 = pos[vb, f[0]]
    p1 = pos[vb, f[1]]
    p2 = pos[vb, f[2]]
    if not (finite4(p0) and finite4(p1) and finite4(p2)) or (p0[3] <= 0.0 and p1[3] <= 0.0 and p2[3] <= 0.0):
        return wp.vec3i(-1, -1, -1)
    return f


@wp.kernel(enable_backward=False, module="unique")
def raster_depth(
    pos: wp.array2d(dtype=wp.vec4),  # (B or 1, V) clip space
    tri: wp.array(dtype=wp.vec3i),  # (F,)
    ranges: wp.array(dtype=wp.vec2i),  # (B,) (first triangle, count)
    instanced: int,
    width: int,
    height: int,
    tile: wp.vec2i,  # viewport tile size (viewport_tile of width, height)
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
    f = drawn_vertices(pos, tri, vb, t)
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
    for ty in range(yr[0] // tile[1], yr[1] // tile[1] + 1):
        for tx in range(xr[0] // tile[0], xr[1] // tile[0] + 1):
            vp = viewport(tx, ty, width, height, tile)
            c = clipped(p0, p1, p2, vp)
            for i in range(c.count):
                draw(piece(c, i, vp), vp, b, t, keys)


@wp.kernel(enable_backward=False, module="unique")
def raster_big(
    pos: wp.array2d(dtype=wp.vec4),
    tri: wp.array(dtype=wp.vec3i),
    instanced: int,
    width: int,
    height: int,
    tile: wp.vec2i,
    big: wp.array(dtype=wp.vec4i),
    big_box: wp.array(dtype=wp.vec4i),
    big_count: wp.array(dtype=wp.int32),
    keys: wp.array3d(dtype=wp.int64),
):
    """One thread per pixel: the depth test against every queued big triangle whose box
    holds the pixel (runs after :func:`raster_depth`, so plain min-and-store is safe)."""
    b, y, x = wp.tid()
    best = keys[b, y, x]
    vp = viewport(x // tile[0], y // tile[1], width, height, tile)
    px = x - vp.origin[0]
    py = y - vp.origin[1]
    vb = b * instanced
    for k in range(big_count[0]):
        item = big[k]
        box = big_box[k]
        if item[0] == b and x >= box[0] and x <= box[1] and y >= box[2] and y <= box[3]:
            f = tri[item[1]]
            c = clipped(pos[vb, f[0]], pos[vb, f[1]], pos[vb, f[2]], vp)
            for i in range(c.count):
                s = piece(c, i, vp)
                if s.area != 0 and covers(s, px, py, vp):
                    best = wp.min(best, pixel_key(depth_plane(s, vp), px, py, item[1]))
    keys[b, y, x] = best


@wp.func
def pixel_ndc(x: int, scale: float, offset: float) -> float:
    """NDC coordinate of pixel centre ``x`` + 0.5 (scale = 2/size, offset = 1/size - 1)."""
    return scale * float(x) + offset


@wp.func
def centred(p: wp.vec4, fx: float, fy: float) -> wp.vec3:
    """(x, y, w) of clip-space ``p`` with the pixel centre (fx, fy) (NDC) moved to the
    origin: (x - fx w, y - fy w, w)."""
    return wp.vec3(p[0] - fx * p[3], p[1] - fy * p[3], p[3])


@wp.func
def pixel_lines(r0: wp.vec3, r1: wp.vec3, r2: wp.vec3) -> wp.mat33:
    """Rows L_i = r_j x r_k ((i, j, k) cyclic) of the vertices :func:`centred` at a pixel
    centre: the edge functions E_i = a_i X + b_i Y + c_i, L_i = (a_i, b_i, c_i), of NDC
    (X, Y) relative to the centre, so the centre's are the c_i (nvdiffrast's pixel
    shader's a0, a1, a2, to the bit). Relative to the centre they are far more precise in
    float32 than from absolute coordinates for a triangle small against its distance from
    the NDC origin (there c_i and a_i X + b_i Y nearly cancel)."""
    return wp.matrix_from_rows(wp.cross(r1, r2), wp.cross(r2, r0), wp.cross(r0, r1))


@wp.func
def pixel_barycentrics(lines: wp.mat33) -> wp.vec3:
    """(u, v, 1/S) at the centre of :func:`pixel_lines` ``lines``: (c_0, c_1, 1) / S,
    S = c_0 + c_1 + c_2, as the resolve computes them (before :func:`clamped_uv`)."""
    iw = 1.0 / (lines[0][2] + lines[1][2] + lines[2][2])
    return wp.vec3(lines[0][2] * iw, lines[1][2] * iw, iw)


@wp.func
def clamped_uv(u: float, v: float) -> wp.vec2:
    """(u, v) clamped to the triangle, as nvdiffrast's pixel shader does: u, v >= 0 and
    u + v <= 1 despite round-off and for centres that snapped coverage puts outside the
    exact triangle (:func:`clamp_grads` is its derivative)."""
    cu = wp.clamp(u, 0.0, 1.0)
    cv = wp.clamp(v, 0.0, 1.0)
    scale = 1.0 / wp.max(cu + cv, 1.0)
    return wp.vec2(cu * scale, cv * scale)


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
    big-triangle count cleared for the next call (so they need no fill before it).

    The arithmetic is nvdiffrast's pixel shader's, in its order: edge functions of the
    vertices relative to the pixel's NDC centre (fx, fy), u, v and z/w clamped, the
    derivatives from the clamped u, v."""
    b, y, x = wp.tid()
    key = keys[b, y, x]
    keys[b, y, x] = EMPTY_KEY
    if b == 0 and y == 0 and x == 0:
        big_count[0] = 0
    if key == EMPTY_KEY:
        rast[b, y, x] = wp.vec4(0.0)
        rast_db[b, y, x] = wp.vec4(0.0)
        return
    t = key_triangle(key)
    f = tri[t]
    vb = b * instanced
    p0 = pos[vb, f[0]]
    p1 = pos[vb, f[1]]
    p2 = pos[vb, f[2]]
    fx = pixel_ndc(x, xs, xo)
    fy = pixel_ndc(y, ys, yo)
    lines = pixel_lines(centred(p0, fx, fy), centred(p1, fx, fy), centred(p2, fx, fy))
    a0 = lines[0][2]
    a1 = lines[1][2]
    a2 = lines[2][2]
    bary = pixel_barycentrics(lines)
    iw = bary[2]
    zw = (p0[2] * a0 + p1[2] * a1 + p2[2] * a2) / (p0[3] * a0 + p1[3] * a1 + p2[3] * a2)
    uv = clamped_uv(bary[0], bary[1])
    u = uv[0]
    v = uv[1]
    rast[b, y, x] = wp.vec4(u, v, wp.clamp(zw, -1.0, 1.0), id_to_float(t + 1))
    dx = xs * iw
    dy = ys * iw
    a0x = p2[1] * p1[3] - p1[1] * p2[3]
    a0y = p1[0] * p2[3] - p2[0] * p1[3]
    a1x = p0[1] * p2[3] - p2[1] * p0[3]
    a1y = p2[0] * p0[3] - p0[0] * p2[3]
    ax = a0x + a1x + (p1[1] * p0[3] - p0[1] * p1[3])
    ay = a0y + a1y + (p0[0] * p1[3] - p1[0] * p0[3])
    rast_db[b, y, x] = wp.vec4(dx * (u * ax - a0x), dy * (u * ay - a0y), dx * (v * ax - a1x), dy * (v * ay - a1y))


@wp.func
def clamp_grads(u: float, v: float, g: wp.vec2) -> wp.vec2:
    """dL/d(u, v) of the unclamped barycentrics, given dL/d(u', v') in ``g``, where
    (u', v') = (cu, cv) / max(cu + cv, 1), cu = clamp(u, 0, 1) (float32, (2,)): the
    derivative of :func:`clamped_uv`. It is active where snapped coverage puts a pixel
    centre outside its exact triangle; there the unclamped barycentrics of a thin
    triangle are far off (and their derivatives ~1/area) from what was rendered."""
    cu = wp.clamp(u, 0.0, 1.0)
    cv = wp.clamp(v, 0.0, 1.0)
    gc = g
    total = cu + cv
    if total > 1.0:
        # (cu, cv) / total: d/dcu = (cv, -cv) / total^2, d/dcv = (-cu, cu) / total^2
        k = (g[0] - g[1]) / (total * total)
        gc = wp.vec2(cv * k, -cu * k)
    if u <= 0.0 or u >= 1.0:
        gc[0] = 0.0
    if v <= 0.0 or v >= 1.0:
        gc[1] = 0.0
    return gc


@wp.func
def line_grads(lines: wp.mat33, g: wp.vec4, gdb: wp.vec4, xs: float, ys: float) -> wp.mat33:
    """dL/dL_i (rows, float32 3x3) of one pixel's :func:`pixel_lines`, given dL/d(u', v')
    in ``g[0:2]`` and dL/d(rast_db) in ``gdb``, as :func:`raster_resolve` computes them.

    u = c_0/S, v = c_1/S, S = sum c_i, the resolve's very float32 u, v
    (:func:`pixel_barycentrics`), so the clamp's derivative acts where the forward clamps;
    (u', v') the clamped u, v (:func:`clamped_uv`, :func:`clamp_grads`); the derivatives are
    (a_0 - u' A)/S etc. with A = sum a_i, B = sum b_i."""
    bary = pixel_barycentrics(lines)
    u = bary[0]
    v = bary[1]
    r = bary[2]
    uvc = clamped_uv(u, v)
    uc = uvc[0]
    vc = uvc[1]
    a = lines[0][0] + lines[1][0] + lines[2][0]
    bsum = lines[0][1] + lines[1][1] + lines[2][1]
    g1 = xs * gdb[0]
    g2 = ys * gdb[1]
    g3 = xs * gdb[2]
    g4 = ys * gdb[3]
    dux = (lines[0][0] - uc * a) * r
    duy = (lines[0][1] - uc * bsum) * r
    dvx = (lines[1][0] - vc * a) * r
    dvy = (lines[1][1] - vc * bsum) * r
    guv = clamp_grads(u, v, wp.vec2(g[0] - (g1 * a + g2 * bsum) * r, g[1] - (g3 * a + g4 * bsum) * r))
    gu = guv[0]
    gv = guv[1]
    gs = -(g1 * dux + g2 * duy + g3 * dvx + g4 * dvy + gu * u + gv * v) * r
    ga_sum = -(g1 * uc + g3 * vc) * r
    gb_sum = -(g2 * uc + g4 * vc) * r
    return wp.mat33(g1 * r + ga_sum, g2 * r + gb_sum, gu * r + gs,
                    g3 * r + ga_sum, g4 * r + gb_sum, gv * r + gs,
                    ga_sum, gb_sum, gs)


@wp.func
def xyw_grad(g: wp.vec3, fx: float, fy: float) -> wp.vec4:
    """A gradient in :func:`centred` (x', y', w) as a clip-space (x, y, z, w) gradient: x' =
    x - fx w, y' = y - fy w, so d/dw takes -fx d/dx' - fy d/dy' (z gets none)."""
    return wp.vec4(g[0], g[1], 0.0, g[2] - fx * g[0] - fy * g[1])


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
        fx = pixel_ndc(x, xs, xo)
        fy = pixel_ndc(y, ys, yo)
        h0 = wp.vec3(0.0)
        h1 = wp.vec3(0.0)
        h2 = wp.vec3(0.0)
        if valid:
            # the resolve's lines: u, v as it computes them, and precise derivatives
            h0 = centred(pos[vb, f[0]], fx, fy)
            h1 = centred(pos[vb, f[1]], fx, fy)
            h2 = centred(pos[vb, f[2]], fx, fy)
            gl = line_grads(pixel_lines(h0, h1, h2), g, gdb, xs, ys)
        # L_i = h_j x h_k: d/dh_j = h_k x g_i, d/dh_k = g_i x h_j
        g0 = wp.cross(h1, gl[2]) + wp.cross(gl[1], h2)
        g1 = wp.cross(h2, gl[0]) + wp.cross(gl[2], h0)
        g2 = wp.cross(h0, gl[1]) + wp.cross(gl[0], h1)
        base = vb * num_v
        planned = plan(base + f[0], valid, threshold)
        add(grad_pos, base + f[0], xyw_grad(g0, fx, fy), valid, threshold, planned)
        add(grad_pos, base + f[1], xyw_grad(g1, fx, fy), valid, threshold, planned)
        add(grad_pos, base + f[2], xyw_grad(g2, fx, fy), valid, threshold, planned)

    return wp.kernel(raster_bwd, enable_backward=False, module="unique")
