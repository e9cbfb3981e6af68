"""View-dependent colour from real spherical harmonics (degrees 0..3, gsplat constants).

colour = max(sum_k basis_k(d) * coeff_k + 0.5, 0) with d the normalised direction from
the camera centre to the Gaussian mean. Gradients reach the coefficients and, through
d, the means. The backward is ``make_sh_bwd``, a kernel of one thread per (Gaussian,
coefficient) so that a warp reads and writes consecutive coefficient rows, or (plain RGB
colours, and the deterministic mode, which cannot sum with atomics) ``make_color_vjp``, a
``@wp.func`` run per Gaussian inside the projection backward kernel.
"""

import functools

import warp as wp

from arc_warp._src.arc.reduce_funcs import accumulator
from arc_warp._src.splat.geometry_funcs import G_RGB, CameraParams, grad_vector
from arc_warp._src.vector_io import vector_io

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


@wp.func
def clamped_cotangent(rgb: wp.vec3, v_rgb: wp.vec3) -> wp.vec3:
    """dL/d(unclamped colour) of rgb = max(value, 0), from the forward's clamped ``rgb``.

    The gradient passes where value > 0 (torch's clamp_min also passes it at exactly 0);
    the mask from the forward's colour spares a second read of the coefficients, the
    costliest memory traffic of the SH backward."""
    g = v_rgb
    for c in range(3):
        if rgb[c] <= 0.0:
            g[c] = 0.0
    return g


@wp.func
def direction_vjp(v_d: wp.vec3, d: wp.vec3, inv_len: float) -> wp.vec3:
    """dL/dmean from dL/dd, d = (mean - centre) * inv_len of unit length."""
    return (v_d - wp.dot(v_d, d) * d) * inv_len


@wp.func
def finite3(v: wp.vec3) -> bool:
    return wp.isfinite(v[0]) and wp.isfinite(v[1]) and wp.isfinite(v[2])


@functools.cache
def make_sh_fwd(n_coeffs: int, rows: int):
    """Colour from the first ``n_coeffs`` = (degree+1)^2 of a Gaussian's ``rows``
    coefficients.

    Reads each Gaussian's ``rows`` x 3 floats as one vector (``coeff_rows``: the (N, rows)
    vec3 coefficients viewed as (N,) vectors of 3 * rows floats) through
    ``vector_io``: 128-bit loads on CUDA when 3 * rows is a multiple of 4 (SH degree 3:
    12 loads, not 48), so a thread's 192 bytes arrive in few requests. Also sets
    ``bad[slot] = 1`` if any coefficient of the row (all ``rows`` of them, culled
    Gaussians included) is NaN or Inf, so the colours are read once for both.
    """
    load, _ = vector_io(3 * rows)
    row_t = wp.types.vector(3 * rows, wp.float32)

    @wp.kernel(enable_backward=False, module="unique")
    def sh_fwd(
        means: wp.array(dtype=wp.vec3),
        coeff_rows: wp.array(dtype=row_t),
        radii: wp.array(dtype=wp.vec2i),
        cams: wp.array(dtype=CameraParams),
        slot: int,
        rgb: wp.array(dtype=wp.vec3),
        bad: wp.array(dtype=wp.int32),
    ):
        i = wp.tid()
        row = load(coeff_rows, i)
        basis = sh_basis(wp.normalize(means[i] - cams[0].center))
        value = wp.vec3(0.5)
        finite = True
        for k in range(wp.static(rows)):
            c = wp.vec3(row[3 * k], row[3 * k + 1], row[3 * k + 2])
            finite = finite and finite3(c)
            if k < wp.static(n_coeffs):
                value += basis[k] * c
        if not finite:
            bad[slot] = 1
        if radii[i][0] <= 0:
            rgb[i] = wp.vec3(0.0)
        else:
            rgb[i] = wp.max(value, wp.vec3(0.0))

    return sh_fwd


@functools.cache
def make_color_vjp(n_coeffs: int, overwrite: bool = False):
    """``@wp.func`` ``color_vjp(i, mean, colors, cam_center, rgb, v_rgb, v_colors) -> wp.vec3``.

    Adds dL/dcolors of Gaussian ``i`` into ``v_colors`` given ``v_rgb`` = dL/drgb and the
    forward's clamped colour ``rgb``, and returns the view-direction part of dL/dmean
    (zero below SH degree 1). ``overwrite``: writes the row instead of adding to it (the
    coefficients past ``n_coeffs`` get 0), so ``v_colors`` need not be zeroed first.
    ``n_coeffs`` = 0 means plain RGB colours ((N,) ``colors`` used as-is); else ``colors``
    are (N, K) SH coefficients of which the first ``n_coeffs`` are evaluated.
    """
    if n_coeffs == 0:

        def color_vjp(
            i: int,
            mean: wp.vec3,
            colors: wp.array(dtype=wp.vec3),
            cam_center: wp.vec3,
            rgb: wp.vec3,
            v_rgb: wp.vec3,
            v_colors: wp.array(dtype=wp.vec3),
        ) -> wp.vec3:
            if wp.static(overwrite):
                v_colors[i] = v_rgb
            else:
                v_colors[i] = v_colors[i] + v_rgb
            return wp.vec3(0.0)

    else:

        def color_vjp(
            i: int,
            mean: wp.vec3,
            colors: wp.array2d(dtype=wp.vec3),
            cam_center: wp.vec3,
            rgb: wp.vec3,
            v_rgb: wp.vec3,
            v_colors: wp.array2d(dtype=wp.vec3),
        ) -> wp.vec3:
            offset = mean - cam_center
            inv_len = 1.0 / wp.length(offset)
            d = offset * inv_len
            basis = sh_basis(d)
            g = clamped_cotangent(rgb, v_rgb)
            w = vec16(0.0)
            for k in range(wp.static(n_coeffs)):
                if wp.static(overwrite):
                    v_colors[i, k] = basis[k] * g
                else:
                    v_colors[i, k] = v_colors[i, k] + basis[k] * g
                w[k] = wp.dot(colors[i, k], g)
            if wp.static(overwrite):
                for k in range(wp.static(n_coeffs), v_colors.shape[1]):
                    v_colors[i, k] = wp.vec3(0.0)
            v_mean = wp.vec3(0.0)
            if wp.static(n_coeffs > 1):
                v_mean = direction_vjp(sh_basis_vjp(d, w), d, inv_len)
            return v_mean

    return wp.func(color_vjp, name=f"color_vjp_{n_coeffs}_{int(overwrite)}", module="unique")


@functools.cache
def make_clear_colors(n_coeffs: int):
    """``@wp.func`` ``clear_colors(i, v_colors)``: zeroes Gaussian ``i``'s colour gradient
    (its (N,) RGB entry for ``n_coeffs`` = 0, else its whole (N, K) SH row)."""
    if n_coeffs == 0:

        def clear_colors(i: int, v_colors: wp.array(dtype=wp.vec3)):
            v_colors[i] = wp.vec3(0.0)

    else:

        def clear_colors(i: int, v_colors: wp.array2d(dtype=wp.vec3)):
            for k in range(v_colors.shape[1]):
                v_colors[i, k] = wp.vec3(0.0)

    return wp.func(clear_colors, name=f"clear_colors_{int(n_coeffs > 0)}", module="unique")


@functools.cache
def make_sh_bwd(n_coeffs: int, lanes: int, absgrad: bool, mode: str, overwrite: bool):
    """SH backward with thread ``t = i * lanes + k`` on coefficient row ``k`` of Gaussian ``i``
    (``lanes`` a power of two, ``GaussianRenderer.backward``), so consecutive threads touch
    consecutive 12-byte rows.

    Reads ``means`` (N,) vec3, ``colors`` (N, K) vec3, ``cams`` (1,) CameraParams,
    ``radii`` (N,) vec2i, the forward's clamped ``rgb`` (N,) vec3 and the packed
    ``raster_grads`` (N,) ``grad_vector(absgrad)``. Adds dL/dcolors into ``v_colors``
    (N, K) vec3, or with ``overwrite`` writes every row (0 for culled Gaussians and rows
    ``k >= n_coeffs``). Each thread's share of the view-direction part of dL/dmean is
    added into ``v_means`` (N,) vec3 (zeroed by the caller; untouched for ``n_coeffs`` 1)
    by the accumulator of ``mode``: the ``lanes`` threads of a Gaussian share one target.
    Launch a multiple of 32 threads (past ``N * lanes``: idle lanes) with no early exit,
    so whole warps reach the accumulator.
    """
    grad_t = grad_vector(absgrad)
    add = accumulator(wp.vec3, mode)
    shift = lanes.bit_length() - 1

    @wp.kernel(enable_backward=False, module="unique")
    def sh_bwd(
        means: wp.array(dtype=wp.vec3),
        colors: wp.array2d(dtype=wp.vec3),
        cams: wp.array(dtype=CameraParams),
        radii: wp.array(dtype=wp.vec2i),
        rgb: wp.array(dtype=wp.vec3),
        raster_grads: wp.array(dtype=grad_t),
        threshold: int,
        v_colors: wp.array2d(dtype=wp.vec3),
        v_means: wp.array(dtype=wp.vec3),
    ):
        t = wp.tid()
        i = t >> wp.static(shift)
        k = t & wp.static(lanes - 1)
        v_mean = wp.vec3(0.0)
        valid = False
        if i < colors.shape[0] and k < colors.shape[1]:
            v_coeff = wp.vec3(0.0)
            evaluated = k < wp.static(n_coeffs) and radii[i][0] > 0
            if evaluated:
                offset = means[i] - cams[0].center
                inv_len = 1.0 / wp.length(offset)
                d = offset * inv_len
                gr = raster_grads[i]
                g = clamped_cotangent(rgb[i], wp.vec3(gr[G_RGB], gr[G_RGB + 1], gr[G_RGB + 2]))
                # row k's basis value and derivative: an unrolled select keeps the
                # vectors in registers (a runtime index would put them in local memory)
                one_hot = vec16(0.0)
                for j in range(wp.static(n_coeffs)):
                    one_hot[j] = wp.where(j == k, 1.0, 0.0)
                v_coeff = wp.dot(sh_basis(d), one_hot) * g
                if wp.static(n_coeffs > 1):
                    v_d = sh_basis_vjp(d, wp.dot(colors[i, k], g) * one_hot)
                    v_mean = direction_vjp(v_d, d, inv_len)
                    valid = True
            if wp.static(overwrite):
                v_colors[i, k] = v_coeff
            elif evaluated:
                v_colors[i, k] = v_colors[i, k] + v_coeff
        if wp.static(n_coeffs > 1):
            add(v_means, i, v_mean, valid, threshold)

    return sh_bwd
