"""Shared ``@wp.func`` math of the splatting stages (gsplat "classic" conventions).

Matrices are Warp row-major: ``m[i, j]`` is row ``i``, column ``j``.
"""

import functools

import warp as wp

from arc_warp._src.camera import CAMERA_MODELS, FOV_SLACK

TILE_SIZE = 16
BLOCK_PIXELS = TILE_SIZE * TILE_SIZE
ALPHA_MIN = 1.0 / 255.0  # gsplat ALPHA_THRESHOLD: weaker alphas are skipped
ALPHA_MAX = 0.999  # gsplat MAX_ALPHA
T_MIN = 1e-4  # a Gaussian that would bring T to or below this ends the pixel
EXTEND_MAX = 3.33  # bounding-box half-extent in standard deviations
RADIUS_MAX = float(2**30)  # px; screen radii are clamped here before any int cast
# Binning threshold slack: the tile test uses Q <= t * (1 + BIN_SLACK) + BIN_SLACK, which
# covers the raster's float32 (fast-math) evaluation of the power near the 1/255 cut.
BIN_SLACK = 2.0**-10

mat23 = wp.types.matrix(shape=(2, 3), dtype=wp.float32)

# Slots of the packed per-Gaussian rasteriser gradient (one ARC accumulator).
G_XY = 0  # dL/dmean2d (2)
G_CONIC = 2  # dL/dconic (a, b, c)
G_OPACITY = 5
G_RGB = 6  # dL/dcolour (3)
G_DEPTH = 9  # dL/dz
G_ABS = 10  # |dL/dmean2d| per pixel, summed (2); only with absgrad


@functools.cache
def grad_vector(absgrad: bool):
    """The packed gradient type: ``wp.types.vector(10 or 12, wp.float32)``."""
    return wp.types.vector(G_ABS + 2 if absgrad else G_ABS, wp.float32)


@wp.struct
class Splat2D:
    """What the rasteriser reads per Gaussian: two 16-byte quads, each loaded whole."""

    geom: wp.vec4  # x, y (pixel position of the centre), opacity, depth (camera z)
    conic: wp.vec4  # inverse 2D covariance (a, b, c) = [[a, b], [b, c]], and 0


# CameraParams.model: the index in camera.CAMERA_MODELS
MODEL_PINHOLE = CAMERA_MODELS.index("pinhole")
MODEL_ORTHO = CAMERA_MODELS.index("ortho")
MODEL_FISHEYE = CAMERA_MODELS.index("fisheye")


@wp.struct
class CameraParams:
    """One camera as kernel argument (float32 copy of :class:`Camera`). A default-made
    struct is an undistorted pinhole (model 0, distorted 0); see ``camera_funcs``."""

    rot: wp.mat33  # world -> camera rotation
    trans: wp.vec3  # world -> camera translation
    center: wp.vec3  # camera position in world space
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int
    near: float
    far: float
    model: int  # MODEL_PINHOLE / MODEL_ORTHO / MODEL_FISHEYE
    distorted: int  # 1: the lens terms below apply and centres beyond r2_max are culled
    radial: wp.vec4  # rho(s) numerator 1 + a1 s + .. + a4 s^4: pinhole (k1, k2, k3, 0), fisheye (k1..k4)
    radial_den: wp.vec3  # rho(s) denominator 1 + b1 s + b2 s^2 + b3 s^3: pinhole (k4, k5, k6)
    tangential: wp.vec2  # (p1, p2), pinhole
    r2_max: float  # distorted: culls centres whose undistorted |n|^2 exceeds it (camera.radial_limit)


@wp.func_native("union { float f; int i; } u; u.f = x; return u.i;")
def float_bits(x: float) -> int:
    """Bit pattern of ``x``; for ``x >= 0`` it orders like ``x``."""
    ...


@wp.func
def quat_to_rotmat(q: wp.vec4) -> wp.mat33:
    """Rotation of the normalised quaternion ``q`` = (w, x, y, z)."""
    n = q / wp.length(q)
    w = n[0]
    x = n[1]
    y = n[2]
    z = n[3]
    return wp.mat33(
        1.0 - 2.0 * (y * y + z * z),
        2.0 * (x * y - w * z),
        2.0 * (x * z + w * y),
        2.0 * (x * y + w * z),
        1.0 - 2.0 * (x * x + z * z),
        2.0 * (y * z - w * x),
        2.0 * (x * z - w * y),
        2.0 * (y * z + w * x),
        1.0 - 2.0 * (x * x + y * y),
    )


@wp.func
def quat_to_rotmat_vjp(q: wp.vec4, g: wp.mat33) -> wp.vec4:
    """dL/dq of ``quat_to_rotmat(q)`` given ``g`` = dL/dR, through the normalisation."""
    inv_norm = 1.0 / wp.length(q)
    n = q * inv_norm
    w = n[0]
    x = n[1]
    y = n[2]
    z = n[3]
    v_n = 2.0 * wp.vec4(
        x * (g[2, 1] - g[1, 2]) + y * (g[0, 2] - g[2, 0]) + z * (g[1, 0] - g[0, 1]),
        -2.0 * x * (g[1, 1] + g[2, 2]) + y * (g[0, 1] + g[1, 0]) + z * (g[0, 2] + g[2, 0]) + w * (g[2, 1] - g[1, 2]),
        x * (g[0, 1] + g[1, 0]) - 2.0 * y * (g[0, 0] + g[2, 2]) + z * (g[1, 2] + g[2, 1]) + w * (g[0, 2] - g[2, 0]),
        x * (g[0, 2] + g[2, 0]) + y * (g[1, 2] + g[2, 1]) - 2.0 * z * (g[0, 0] + g[1, 1]) + w * (g[1, 0] - g[0, 1]),
    )
    return (v_n - wp.dot(v_n, n) * n) * inv_norm


@wp.func
def scale_columns(m: wp.mat33, s: wp.vec3) -> wp.mat33:
    """``m @ diag(s)``."""
    return wp.mat33(
        m[0, 0] * s[0],
        m[0, 1] * s[1],
        m[0, 2] * s[2],
        m[1, 0] * s[0],
        m[1, 1] * s[1],
        m[1, 2] * s[2],
        m[2, 0] * s[0],
        m[2, 1] * s[1],
        m[2, 2] * s[2],
    )


@wp.func
def fov_limits(fx: float, fy: float, cx: float, cy: float, width: int, height: int) -> wp.vec4:
    """(lim_x_pos, lim_x_neg, lim_y_pos, lim_y_neg) of gsplat's clamped Jacobian."""
    tan_fovx = 0.5 * float(width) / fx
    tan_fovy = 0.5 * float(height) / fy
    return wp.vec4(
        (float(width) - cx) / fx + FOV_SLACK * tan_fovx,
        cx / fx + FOV_SLACK * tan_fovx,
        (float(height) - cy) / fy + FOV_SLACK * tan_fovy,
        cy / fy + FOV_SLACK * tan_fovy,
    )


@wp.func
def persp_jacobian(p: wp.vec3, fx: float, fy: float, lim: wp.vec4) -> mat23:
    """Jacobian of the pinhole projection at camera point ``p``, with x/z and y/z clamped."""
    rz = 1.0 / p[2]
    tx = p[2] * wp.min(lim[0], wp.max(-lim[1], p[0] * rz))
    ty = p[2] * wp.min(lim[2], wp.max(-lim[3], p[1] * rz))
    return mat23(fx * rz, 0.0, -fx * tx * rz * rz, 0.0, fy * rz, -fy * ty * rz * rz)


@wp.func
def persp_jacobian_vjp(p: wp.vec3, fx: float, fy: float, lim: wp.vec4, v_j: mat23) -> wp.vec3:
    """dL/dp of ``persp_jacobian`` given ``v_j`` = dL/dJ; clamped coordinates pass no x/y gradient."""
    rz = 1.0 / p[2]
    rz2 = rz * rz
    rz3 = rz2 * rz
    u = p[0] * rz
    v = p[1] * rz
    tx = p[2] * wp.min(lim[0], wp.max(-lim[1], u))
    ty = p[2] * wp.min(lim[2], wp.max(-lim[3], v))
    g = wp.vec3(0.0, 0.0, -fx * rz2 * v_j[0, 0] - fy * rz2 * v_j[1, 1])
    if u <= lim[0] and u >= -lim[1]:
        # J02 = -fx x / z^2
        g[0] = -fx * rz2 * v_j[0, 2]
        g[2] += 2.0 * fx * tx * rz3 * v_j[0, 2]
    else:
        # J02 = -fx L / z with L the clamp limit
        g[2] += fx * tx * rz3 * v_j[0, 2]
    if v <= lim[2] and v >= -lim[3]:
        g[1] = -fy * rz2 * v_j[1, 2]
        g[2] += 2.0 * fy * ty * rz3 * v_j[1, 2]
    else:
        g[2] += fy * ty * rz3 * v_j[1, 2]
    return g


@wp.func
def tile_bbox(xy: wp.vec2, radius: wp.vec2i, tiles_x: int, tiles_y: int) -> wp.vec4i:
    """Tiles touched by a Gaussian's box: (x_min, y_min, x_max, y_max), max exclusive, as
    gsplat; clamped in float before any int cast, so never inverted and inside the grid
    for any finite ``xy`` and any ``radius`` (projection gives 0..``RADIUS_MAX``)."""
    ts = float(TILE_SIZE)
    cx = xy[0] / ts
    cy = xy[1] / ts
    rx = float(radius[0]) / ts
    ry = float(radius[1]) / ts
    x0 = wp.clamp(int(wp.floor(wp.clamp(cx - rx, 0.0, float(tiles_x)))), 0, tiles_x)
    y0 = wp.clamp(int(wp.floor(wp.clamp(cy - ry, 0.0, float(tiles_y)))), 0, tiles_y)
    return wp.vec4i(
        x0,
        y0,
        wp.clamp(int(wp.ceil(wp.clamp(cx + rx, 0.0, float(tiles_x)))), x0, tiles_x),
        wp.clamp(int(wp.ceil(wp.clamp(cy + ry, 0.0, float(tiles_y)))), y0, tiles_y),
    )


@wp.struct
class Footprint:
    """The ellipse Q(d) = d^T [[A, B], [B, C]] d <= t of one splat (d = pixel - centre,
    pixels) in the form that gives its x-span over a band of rows (see ``row_span``).

    Divided by A: x(dy) = -beta dy +- sqrt(tau - delta dy^2), with delta = (AC - B^2) / A^2
    lowered by its float32 roundoff bound, so every span is a superset of the true one.
    """

    cx: float  # centre, pixels
    cy: float
    beta: float  # B / A
    delta: float  # (AC - B^2) / A^2, lowered (> 0 when exact)
    tau: float  # t / A
    half_w: float  # half-width of the ellipse's box, pixels
    half_h: float  # half-height
    dy_left: float  # dy of the leftmost point (the rightmost is at -dy_left)
    exact: bool  # False: degenerate or out of float range, spans are whole box rows


@wp.func
def footprint(geom: wp.vec4, conic: wp.vec4) -> Footprint:
    """Footprint of the splat with ``Splat2D`` quads ``geom``, ``conic``: where
    ``opacity * exp(-Q / 2) >= 1/255`` (capped at ``EXTEND_MAX`` std-devs, like the box),
    with the ``BIN_SLACK`` margin."""
    t = wp.min(EXTEND_MAX * EXTEND_MAX, 2.0 * wp.log(geom[2] / ALPHA_MIN))
    t = t * (1.0 + BIN_SLACK) + BIN_SLACK
    f = Footprint()
    f.cx = geom[0]
    f.cy = geom[1]
    f.exact = False
    a = conic[0]
    if not (a > 0.0 and t > 0.0):
        return f
    f.beta = conic[1] / a
    gamma = conic[2] / a
    b2 = f.beta * f.beta
    # each of gamma, beta^2 and their difference carries <= 2 roundings (u = 2^-24)
    f.delta = (gamma - b2) - 8.0 * 5.96e-8 * (wp.abs(gamma) + b2)
    f.tau = t / a
    if not (f.delta > 0.0):
        return f
    f.half_w = wp.sqrt(f.tau * (f.delta + b2) / f.delta)
    f.half_h = wp.sqrt(f.tau / f.delta)
    f.dy_left = f.beta * wp.sqrt(f.tau / (f.delta * (f.delta + b2)))
    f.exact = wp.isfinite(f.half_w) and wp.isfinite(f.half_h) and wp.isfinite(f.dy_left) and wp.isfinite(f.beta)
    return f


@wp.func
def span_end(f: Footprint, lo: float, hi: float, dy_extreme: float, side: float) -> float:
    """Extreme x - cx (``side`` -1: min, +1: max) of the ellipse over rows dy in [lo, hi].

    x(dy) is convex (min) or concave (max) with its optimum at ``dy_extreme``: inside the
    band (with a roundoff tolerance) the answer is the box edge, else the nearer end."""
    tol = 1e-4 * (wp.abs(dy_extreme) + 1.0)
    if dy_extreme >= lo - tol and dy_extreme <= hi + tol:
        return side * f.half_w
    d = hi
    if dy_extreme < lo:
        d = lo
    return -f.beta * d + side * wp.sqrt(wp.max(0.0, f.tau - f.delta * d * d))


@wp.func
def row_span(f: Footprint, ty: int, box: wp.vec4i) -> wp.vec2i:
    """[x_min, x_max) of the tiles in tile row ``ty`` of ``box`` (from ``tile_bbox``) that
    the footprint reaches: exact for the tiles' full 16x16 rectangles (which hold every
    pixel centre with a half-pixel margin), plus float32 slack; never inverted."""
    if not f.exact:
        return wp.vec2i(box[0], box[2])
    ts = float(TILE_SIZE)
    lo = wp.max(float(ty) * ts - f.cy, -f.half_h)
    hi = wp.min(float(ty + 1) * ts - f.cy, f.half_h)
    if lo > hi:
        return wp.vec2i(box[0], box[0])
    pad = 1e-4 * f.half_w  # relative roundoff of large footprints
    x0 = (f.cx + span_end(f, lo, hi, f.dy_left, -1.0) - pad) / ts
    x1 = (f.cx + span_end(f, lo, hi, -f.dy_left, 1.0) + pad) / ts
    # clamped in float before the cast; tile tx covers [16 tx, 16 tx + 16]
    tx0 = int(wp.floor(wp.clamp(x0, float(box[0]), float(box[2]))))
    tx1 = int(wp.floor(wp.clamp(x1, float(box[0]) - 1.0, float(box[2]) - 1.0))) + 1
    return wp.vec2i(tx0, wp.max(tx0, tx1))
