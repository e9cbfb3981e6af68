"""View-dependent colour from real spherical harmonics (degrees 0..3, gsplat constants).

colour = max(sum_k basis_k(d) * coeff_k + 0.5, 0) with d the normalised direction from
the camera centre to the Gaussian mean. Gradients reach the coefficients and, through
d, the means.
"""

import functools

import warp as wp

from arc_warp._src.splat.math import G_RGB, grad_vector

vec16 = wp.types.vector(16, wp.float32)

SH_C0 = 0.2820947917738781
SH_C1 = 0.48860251190292
SH_C2_XY = 1.092548430592079  # also -yz and -xz with a sign, 2 * 0.5462742152960395
SH_C2_ZZ = 0.9461746957575601
SH_C2_0 = 0.3153915652525201
SH_C2_XX = 0.5462742152960395
SH_C3_A = 0.5900435899266435
SH_C3_XYZ = 2.890611442640554  # 2 * 1.445305721320277
SH_C3_B = 1.445305721320277
SH_C3_ZZ = 2.285228997322329
SH_C3_0 = 0.4570457994644658
SH_C3_ZZZ = 1.865881662950577
SH_C3_Z = 1.119528997770346


@wp.func
def sh_basis(d: wp.vec3) -> vec16:
    """The 16 real SH basis values at unit direction ``d`` (gsplat order and signs)."""
    x = d[0]
    y = d[1]
    z = d[2]
    xx = x * x
    yy = y * y
    zz = z * z
    c3 = -SH_C3_ZZ * zz + SH_C3_0
    return vec16(
        SH_C0,
        -SH_C1 * y,
        SH_C1 * z,
        -SH_C1 * x,
        SH_C2_XY * x * y,
        -SH_C2_XY * y * z,
        SH_C2_ZZ * zz - SH_C2_0,
        -SH_C2_XY * x * z,
        SH_C2_XX * (xx - yy),
        -SH_C3_A * y * (3.0 * xx - yy),
        SH_C3_XYZ * x * y * z,
        c3 * y,
        z * (SH_C3_ZZZ * zz - SH_C3_Z),
        c3 * x,
        SH_C3_B * z * (xx - yy),
        -SH_C3_A * x * (xx - 3.0 * yy),
    )


@wp.func
def sh_basis_vjp(d: wp.vec3, w: vec16) -> wp.vec3:
    """sum_k w_k * grad basis_k(d), the gradient w.r.t. the (unit) direction."""
    x = d[0]
    y = d[1]
    z = d[2]
    xx = x * x
    yy = y * y
    zz = z * z
    c3 = -SH_C3_ZZ * zz + SH_C3_0
    dc3 = -2.0 * SH_C3_ZZ * z
    gx = (
        -SH_C1 * w[3]
        + SH_C2_XY * (y * w[4] - z * w[7] + x * w[8])
        - 6.0 * SH_C3_A * x * y * w[9]
        + SH_C3_XYZ * y * z * w[10]
        + c3 * w[13]
        + 2.0 * SH_C3_B * x * z * w[14]
        - 3.0 * SH_C3_A * (xx - yy) * w[15]
    )
    gy = (
        -SH_C1 * w[1]
        + SH_C2_XY * (x * w[4] - z * w[5] - y * w[8])
        - 3.0 * SH_C3_A * (xx - yy) * w[9]
        + SH_C3_XYZ * x * z * w[10]
        + c3 * w[11]
        - 2.0 * SH_C3_B * y * z * w[14]
        + 6.0 * SH_C3_A * x * y * w[15]
    )
    gz = (
        SH_C1 * w[2]
        - SH_C2_XY * (y * w[5] + x * w[7])
        + 2.0 * SH_C2_ZZ * z * w[6]
        + SH_C3_XYZ * x * y * w[10]
        + dc3 * (y * w[11] + x * w[13])
        + (3.0 * SH_C3_ZZZ * zz - SH_C3_Z) * w[12]
        + SH_C3_B * (xx - yy) * w[14]
    )
    return wp.vec3(gx, gy, gz)


@functools.cache
def make_sh_fwd(n_coeffs: int):
    """Colour from the first ``n_coeffs`` = (degree+1)^2 coefficients."""

    @wp.kernel(enable_backward=False, module="unique")
    def sh_fwd(
        means: wp.array(dtype=wp.vec3),
        coeffs: wp.array2d(dtype=wp.vec3),
        radii: wp.array(dtype=wp.vec2i),
        cam_center: wp.vec3,
        rgb: wp.array(dtype=wp.vec3),
    ):
        i = wp.tid()
        if radii[i][0] <= 0:
            rgb[i] = wp.vec3(0.0)
            return
        basis = sh_basis(wp.normalize(means[i] - cam_center))
        value = wp.vec3(0.5)
        for k in range(wp.static(n_coeffs)):
            value += basis[k] * coeffs[i, k]
        rgb[i] = wp.max(value, wp.vec3(0.0))

    return sh_fwd


@functools.cache
def make_sh_bwd(n_coeffs: int, absgrad: bool):
    """dL/dcoeffs and the view-direction part of dL/dmeans from the packed colour gradient."""
    grad_t = grad_vector(absgrad)

    @wp.kernel(enable_backward=False, module="unique")
    def sh_bwd(
        means: wp.array(dtype=wp.vec3),
        coeffs: wp.array2d(dtype=wp.vec3),
        radii: wp.array(dtype=wp.vec2i),
        cam_center: wp.vec3,
        raster_grads: wp.array(dtype=grad_t),
        v_coeffs: wp.array2d(dtype=wp.vec3),
        v_means: wp.array(dtype=wp.vec3),
    ):
        i = wp.tid()
        if radii[i][0] <= 0:
            return
        g = raster_grads[i]
        v_rgb = wp.vec3(g[G_RGB], g[G_RGB + 1], g[G_RGB + 2])
        offset = means[i] - cam_center
        inv_len = 1.0 / wp.length(offset)
        d = offset * inv_len
        basis = sh_basis(d)
        value = wp.vec3(0.5)
        for k in range(wp.static(n_coeffs)):
            value += basis[k] * coeffs[i, k]
        # clamp_min(., 0) passes the gradient where value >= 0, like torch
        for c in range(3):
            if value[c] < 0.0:
                v_rgb[c] = 0.0
        w = vec16(0.0)
        for k in range(wp.static(n_coeffs)):
            v_coeffs[i, k] = v_coeffs[i, k] + basis[k] * v_rgb
            w[k] = wp.dot(coeffs[i, k], v_rgb)
        if wp.static(n_coeffs > 1):
            v_d = sh_basis_vjp(d, w)
            v_means[i] = v_means[i] + (v_d - wp.dot(v_d, d) * d) * inv_len

    return sh_bwd


@functools.cache
def make_rgb_bwd(absgrad: bool):
    """dL/dcolour for plain RGB colours (used as-is by the rasteriser)."""
    grad_t = grad_vector(absgrad)

    @wp.kernel(enable_backward=False, module="unique")
    def rgb_bwd(
        radii: wp.array(dtype=wp.vec2i),
        raster_grads: wp.array(dtype=grad_t),
        v_colors: wp.array(dtype=wp.vec3),
    ):
        i = wp.tid()
        if radii[i][0] <= 0:
            return
        g = raster_grads[i]
        v_colors[i] = v_colors[i] + wp.vec3(g[G_RGB], g[G_RGB + 1], g[G_RGB + 2])

    return rgb_bwd
