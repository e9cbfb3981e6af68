"""Shared ``@wp.func`` math of the splatting stages (gsplat "classic" conventions).

Matrices are Warp row-major: ``m[i, j]`` is row ``i``, column ``j``.
"""

import functools

import warp as wp

TILE_SIZE = 16
BLOCK_PIXELS = TILE_SIZE * TILE_SIZE
ALPHA_MIN = 1.0 / 255.0  # gsplat ALPHA_THRESHOLD: weaker alphas are skipped
ALPHA_MAX = 0.999  # gsplat MAX_ALPHA
T_MIN = 1e-4  # a Gaussian that would bring T to or below this ends the pixel
EXTEND_MAX = 3.33  # bounding-box half-extent in standard deviations
FOV_SLACK = 0.3  # Jacobian clamps camera x/z, y/z at 1.3x the half field of view

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


@wp.struct
class CameraParams:
    """One camera as kernel argument (float32 copy of :class:`Camera`)."""

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
    """Tiles touched by a Gaussian: (x_min, y_min, x_max, y_max), max exclusive, as gsplat."""
    ts = float(TILE_SIZE)
    cx = xy[0] / ts
    cy = xy[1] / ts
    rx = float(radius[0]) / ts
    ry = float(radius[1]) / ts
    return wp.vec4i(
        wp.clamp(int(wp.floor(cx - rx)), 0, tiles_x),
        wp.clamp(int(wp.floor(cy - ry)), 0, tiles_y),
        wp.clamp(int(wp.ceil(cx + rx)), 0, tiles_x),
        wp.clamp(int(wp.ceil(cy + ry)), 0, tiles_y),
    )
