"""Per-model camera math of the projection stage (``@wp.func``): a camera-space point's
pixel, the Jacobian of that map (EWA's J), and the backward of both.

A camera maps p = (x, y, z) to the normalised point n (pinhole (x, y) / z, ortho (x, y),
fisheye theta (x, y) / r), the lens maps n to m (``CameraParams.radial``, ``radial_den``,
``tangential``; the identity when ``distorted`` is 0) and the pixel is (fx m_x + cx,
fy m_y + cy): J = diag(fx, fy) A B with A = dm/dn and B = dn/dp. The undistorted
pinhole keeps gsplat's clamped Jacobian (``persp_jacobian``) and its exact arithmetic;
the other models follow gsplat 1.5.3's ``_ortho_proj`` / ``_fisheye_proj`` (no clamp).
The model is a run-time value of the camera (every thread of a launch takes the same
branch); ``pinhole_project`` / ``pinhole_vjp`` are the undistorted pinhole alone, for
kernels compiled for that camera only (``make_project_fwd(..., pinhole_only=True)``),
which then carry none of the other models' registers.

The backward needs the gradient of <v_J, J(p)>, i.e. the second derivatives of the
camera map; by the chain rule through J = F A B (F = diag(fx, fy), W = F v_J):
dp = B^T (A^T F v_xy + grad_n <W B^T, A(n)>) + grad_p <A^T W, B(p)>.
"""

import math

import warp as wp

from arc_warp._src.splat.geometry_funcs import (
    FOV_SLACK,
    MODEL_FISHEYE,
    MODEL_ORTHO,
    MODEL_PINHOLE,
    CameraParams,
    fov_limits,
    mat23,
    persp_jacobian,
    persp_jacobian_vjp,
)

SERIES_T2 = 0.04  # fisheye: below this (r/z)^2 the Taylor series replace cancelling closed forms
RADIAL_STEPS = 256  # ray angles sampled by radial_limit on the device


@wp.func
def fisheye_terms(p: wp.vec3) -> wp.vec4:
    """(h, c, e, 1 / L^2) of the equidistant map n = h (x, y) at ``p`` (z > 0), with
    r = sqrt(x^2 + y^2), theta = atan2(r, z), L^2 = r^2 + z^2: h = theta / r,
    c = (dh/dr) / r and e = (dc/dr) / r (so grad_(x,y) h = c (x, y), grad_(x,y) c = e (x, y);
    dh/dz = -1 / L^2, dc/dz = 2 / L^4). With t = r / z, z h, z^3 c and z^5 e are even
    series in t; below (r/z)^2 = SERIES_T2 they are summed (error < 1e-7 relative), where
    the closed forms lose digits to cancellation (and are 0 / 0 on the axis)."""
    x = p[0]
    y = p[1]
    z = p[2]
    r2 = x * x + y * y
    inv_l2 = 1.0 / (r2 + z * z)
    rz = 1.0 / z
    t2 = r2 * rz * rz
    if t2 < SERIES_T2:
        # atan(t) / t; phi = z^3 c = (t / (1 + t^2) - atan t) / t^3; psi = z^5 e = phi'(t) / t
        h = (1.0 + t2 * (-1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (-1.0 / 7.0 + t2 * (1.0 / 9.0 - t2 / 11.0))))) * rz
        phi = -2.0 / 3.0 + t2 * (4.0 / 5.0 + t2 * (-6.0 / 7.0 + t2 * (8.0 / 9.0 + t2 * (-10.0 / 11.0
                                                                                       + t2 * (12.0 / 13.0)))))
        psi = 8.0 / 5.0 + t2 * (-24.0 / 7.0 + t2 * (48.0 / 9.0 + t2 * (-80.0 / 11.0 + t2 * (120.0 / 13.0
                                                                                          - t2 * (168.0 / 15.0)))))
        rz3 = rz * rz * rz
        return wp.vec4(h, phi * rz3, psi * rz3 * rz * rz, inv_l2)
    r = wp.sqrt(r2)
    h = wp.atan2(r, z) / r
    c = (z * inv_l2 - h) / r2
    e = (-2.0 * z * inv_l2 * inv_l2 - 3.0 * c) / r2
    return wp.vec4(h, c, e, inv_l2)


@wp.func
def unit_map(p: wp.vec3, model: int):
    """(n, B): the normalised point of camera point ``p`` and B = dn/dp (2x3, unclamped)."""
    if model == MODEL_ORTHO:
        return wp.vec2(p[0], p[1]), mat23(1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
    if model == MODEL_FISHEYE:
        f = fisheye_terms(p)
        h = f[0]
        c = f[1]
        xyc = p[0] * p[1] * c
        return wp.vec2(p[0] * h, p[1] * h), mat23(
            h + p[0] * p[0] * c, xyc, -p[0] * f[3],
            xyc, h + p[1] * p[1] * c, -p[1] * f[3])
    rz = 1.0 / p[2]
    return wp.vec2(p[0] * rz, p[1] * rz), mat23(rz, 0.0, -p[0] * rz * rz, 0.0, rz, -p[1] * rz * rz)


@wp.func
def unit_map_vjp(p: wp.vec3, model: int, g: mat23) -> wp.vec3:
    """grad_p <g, B(p)> for B = dn/dp of ``unit_map`` (the map's second derivatives)."""
    x = p[0]
    y = p[1]
    z = p[2]
    if model == MODEL_ORTHO:
        return wp.vec3(0.0)
    if model == MODEL_FISHEYE:
        # <g, B> = T h + S c - U / L^2 with T = g00 + g11, S = (x, y) g2 (x, y)^T, U = g02 x + g12 y
        f = fisheye_terms(p)
        c = f[1]
        e = f[2]
        il2 = f[3]
        t = g[0, 0] + g[1, 1]
        k = g[0, 1] + g[1, 0]
        s = g[0, 0] * x * x + k * x * y + g[1, 1] * y * y
        u2 = 2.0 * (g[0, 2] * x + g[1, 2] * y) * il2 * il2
        return wp.vec3(
            c * (t * x + 2.0 * g[0, 0] * x + k * y) + s * e * x - g[0, 2] * il2 + u2 * x,
            c * (t * y + k * x + 2.0 * g[1, 1] * y) + s * e * y - g[1, 2] * il2 + u2 * y,
            -t * il2 + 2.0 * s * il2 * il2 + u2 * z,
        )
    # pinhole: <g, B> = (g00 + g11) / z - (g02 x + g12 y) / z^2
    rz = 1.0 / z
    rz2 = rz * rz
    return wp.vec3(-g[0, 2] * rz2, -g[1, 2] * rz2,
                   -(g[0, 0] + g[1, 1]) * rz2 + 2.0 * (g[0, 2] * x + g[1, 2] * y) * rz2 * rz)


@wp.func
def radial_terms(cam: CameraParams, s: float) -> wp.vec4:
    """(rho, rho', rho'', Q) at s = |n|^2: rho = P / Q and its derivatives in s."""
    a = cam.radial
    b = cam.radial_den
    pp = 1.0 + s * (a[0] + s * (a[1] + s * (a[2] + s * a[3])))
    p1 = a[0] + s * (2.0 * a[1] + s * (3.0 * a[2] + s * (4.0 * a[3])))
    p2 = 2.0 * a[1] + s * (6.0 * a[2] + s * (12.0 * a[3]))
    q = 1.0 + s * (b[0] + s * (b[1] + s * b[2]))
    q1 = b[0] + s * (2.0 * b[1] + s * (3.0 * b[2]))
    q2 = 2.0 * b[1] + s * (6.0 * b[2])
    rho = pp / q
    rho1 = (p1 - rho * q1) / q
    rho2 = (p2 - 2.0 * rho1 * q1 - rho * q2) / q
    return wp.vec4(rho, rho1, rho2, q)


@wp.func
def lens(n: wp.vec2, cam: CameraParams):
    """(m, A): the distorted point of ``n`` and A = dm/dn."""
    x = n[0]
    y = n[1]
    rt = radial_terms(cam, x * x + y * y)
    rho = rt[0]
    d = 2.0 * rt[1]
    p1 = cam.tangential[0]
    p2 = cam.tangential[1]
    s = x * x + y * y
    m = wp.vec2(rho * x + 2.0 * p1 * x * y + p2 * (s + 2.0 * x * x),
                rho * y + p1 * (s + 2.0 * y * y) + 2.0 * p2 * x * y)
    off = d * x * y + 2.0 * p1 * x + 2.0 * p2 * y
    return m, wp.mat22(rho + d * x * x + 2.0 * p1 * y + 6.0 * p2 * x, off,
                       off, rho + d * y * y + 6.0 * p1 * y + 2.0 * p2 * x)


@wp.func
def lens_vjp(n: wp.vec2, cam: CameraParams, g: wp.mat22) -> wp.vec2:
    """grad_n <g, A(n)> for A = dm/dn of ``lens``:
    A = rho I + 2 rho' n n^T + (the tangential terms' constant-slope Jacobian)."""
    rt = radial_terms(cam, n[0] * n[0] + n[1] * n[1])
    p1 = cam.tangential[0]
    p2 = cam.tangential[1]
    gs = g[0, 1] + g[1, 0]
    gn = wp.vec2(2.0 * g[0, 0] * n[0] + gs * n[1], gs * n[0] + 2.0 * g[1, 1] * n[1])  # (g + g^T) n
    ngn = 0.5 * wp.dot(n, gn)
    tangential = wp.vec2(6.0 * p2 * g[0, 0] + 2.0 * p1 * gs + 2.0 * p2 * g[1, 1],
                         2.0 * p1 * g[0, 0] + 2.0 * p2 * gs + 6.0 * p1 * g[1, 1])
    return (2.0 * rt[1] * (g[0, 0] + g[1, 1]) + 4.0 * rt[2] * ngn) * n + 2.0 * rt[1] * gn + tangential


@wp.func
def is_legacy_pinhole(cam: CameraParams) -> bool:
    """The undistorted pinhole: gsplat's clamped Jacobian, arithmetic as before the models."""
    return cam.model == MODEL_PINHOLE and cam.distorted == 0


@wp.func
def pinhole_project(p: wp.vec3, cam: CameraParams):
    """``camera_project`` of the undistorted pinhole (gsplat's clamped Jacobian)."""
    rz = 1.0 / p[2]
    jac = persp_jacobian(p, cam.fx, cam.fy, fov_limits(cam.fx, cam.fy, cam.cx, cam.cy, cam.width, cam.height))
    return wp.vec2(cam.fx * p[0] * rz + cam.cx, cam.fy * p[1] * rz + cam.cy), jac, True


@wp.func
def pinhole_vjp(p: wp.vec3, cam: CameraParams, v_xy: wp.vec2, v_depth: float, v_jac: mat23) -> wp.vec3:
    """``camera_vjp`` of the undistorted pinhole."""
    rz = 1.0 / p[2]
    v_p = wp.vec3(
        cam.fx * rz * v_xy[0],
        cam.fy * rz * v_xy[1],
        -(cam.fx * p[0] * v_xy[0] + cam.fy * p[1] * v_xy[1]) * rz * rz + v_depth,
    )
    lim = fov_limits(cam.fx, cam.fy, cam.cx, cam.cy, cam.width, cam.height)
    return v_p + persp_jacobian_vjp(p, cam.fx, cam.fy, lim, v_jac)


@wp.func
def camera_project(p: wp.vec3, cam: CameraParams):
    """(pixel, J, inside) of camera point ``p`` (z > 0): the pixel of the centre, the
    Jacobian for EWA (``persp_jacobian``'s clamp for the undistorted pinhole) and whether
    the point is inside the camera's projection domain (distorted: |n|^2 <= ``r2_max``,
    False for NaN)."""
    if is_legacy_pinhole(cam):
        return pinhole_project(p, cam)
    n, b = unit_map(p, cam.model)
    m = n
    inside = True
    if cam.distorted != 0:
        inside = wp.dot(n, n) <= cam.r2_max
        m, a = lens(n, cam)
        b = a * b
    jac = mat23(cam.fx * b[0, 0], cam.fx * b[0, 1], cam.fx * b[0, 2], cam.fy * b[1, 0], cam.fy * b[1, 1],
                cam.fy * b[1, 2])
    return wp.vec2(cam.fx * m[0] + cam.cx, cam.fy * m[1] + cam.cy), jac, inside


@wp.func
def camera_vjp(p: wp.vec3, cam: CameraParams, v_xy: wp.vec2, v_depth: float, v_jac: mat23) -> wp.vec3:
    """dL/dp given dL/dpixel ``v_xy``, dL/dz ``v_depth`` and dL/dJ ``v_jac`` (J of
    ``camera_project``)."""
    if is_legacy_pinhole(cam):
        return pinhole_vjp(p, cam, v_xy, v_depth, v_jac)
    n, b = unit_map(p, cam.model)
    w = mat23(cam.fx * v_jac[0, 0], cam.fx * v_jac[0, 1], cam.fx * v_jac[0, 2], cam.fy * v_jac[1, 0],
              cam.fy * v_jac[1, 1], cam.fy * v_jac[1, 2])
    v_n = wp.vec2(cam.fx * v_xy[0], cam.fy * v_xy[1])
    if cam.distorted != 0:
        m, a = lens(n, cam)
        v_n = wp.transpose(a) * v_n + lens_vjp(n, cam, w * wp.transpose(b))
        w = wp.transpose(a) * w
    return wp.transpose(b) * v_n + unit_map_vjp(p, cam.model, w) + wp.vec3(0.0, 0.0, v_depth)


@wp.func
def radial_map(cam: CameraParams, r: float) -> wp.vec3:
    """(R, dR/dr, Q) of the radial map R(r) = r rho(r^2) (Q: rho's denominator)."""
    rt = radial_terms(cam, r * r)
    return wp.vec3(r * rt[0], rt[0] + 2.0 * r * r * rt[1], rt[3])


@wp.func
def ray_radius(model: int, angle: float) -> float:
    """Undistorted radius |n| of a ray at ``angle`` (radians) to the optical axis."""
    if model == MODEL_FISHEYE:
        return angle
    return wp.tan(angle)


@wp.func
def increasing(m: wp.vec3) -> bool:
    return m[1] > 0.0 and m[2] > 0.0


@wp.func
def radial_limit(cam: CameraParams, corner: float) -> float:
    """The device's ``camera.radial_limit``: ``r2_max`` of a distorted camera whose image
    corner lies at distorted radius ``corner``, or -1 if the radial map folds (dR/dr <= 0 or
    Q <= 0) before reaching it. Samples RADIAL_STEPS ray angles in (0, pi/2) and bisects
    the step where the map folds or crosses 1.3 ``corner``."""
    target = (1.0 + FOV_SLACK) * corner
    lo = float(0.0)
    for k in range(1, RADIAL_STEPS + 1):
        hi = 0.5 * math.pi * float(k) / float(RADIAL_STEPS + 1)
        m = radial_map(cam, ray_radius(cam.model, hi))
        if not increasing(m):
            fold_lo = lo
            for _ in range(32):
                mid = 0.5 * (fold_lo + hi)
                if increasing(radial_map(cam, ray_radius(cam.model, mid))):
                    fold_lo = mid
                else:
                    hi = mid
            fold = radial_map(cam, ray_radius(cam.model, fold_lo))
            if fold[0] <= corner:
                return -1.0
            if fold[0] < target:
                r = ray_radius(cam.model, fold_lo)
                return r * r
            hi = fold_lo
            m = fold
        if m[0] >= target:
            for _ in range(32):
                mid = 0.5 * (lo + hi)
                if radial_map(cam, ray_radius(cam.model, mid))[0] < target:
                    lo = mid
                else:
                    hi = mid
            r = ray_radius(cam.model, hi)
            return r * r
        lo = hi
    return wp.inf
