"""Host checks of the splatting inputs: Gaussians, gradients, output arrays, sort sizes."""

from __future__ import annotations

import math

import warp as wp

from arc_warp._src.splat.records import GaussianGrads, Gaussians
from arc_warp._src.validate import check_array


def check_gaussians(means, quats, scales, opacities, colors, sh_degree: int | None = None) -> Gaussians:
    """The :class:`Gaussians` of these arrays, or TypeError/ValueError naming what is wrong
    (dtype, shape, device, contiguity). ``colors`` (N, K) wp.vec3 holds SH coefficients
    (K = 1, 4, 9 or 16), of which the first (sh_degree + 1)^2 are evaluated (``sh_degree``
    None: all K); (N,) wp.vec3 holds RGB. NaN/Inf are found later, on the device."""
    means = check_array(means, "means", wp.vec3, 1)
    n, device = means.shape[0], means.device
    check_array(quats, "quats", wp.vec4, 1, (n,), device)
    check_array(scales, "scales", wp.vec3, 1, (n,), device)
    check_array(opacities, "opacities", wp.float32, 1, (n,), device)
    if not isinstance(colors, wp.array):
        raise TypeError(f"colors must be a wp.array of wp.vec3, got {type(colors).__name__}")
    if colors.ndim == 1:
        check_array(colors, "colors", wp.vec3, 1, (n,), device)
        return Gaussians(means, quats, scales, opacities, colors, 0)
    check_array(colors, "colors", wp.vec3, 2, None, device)
    k = colors.shape[1]
    if colors.shape[0] != n or k not in (1, 4, 9, 16):
        raise ValueError(f"SH colors must have shape (N={n}, (d+1)^2) with d in 0..3, got {colors.shape}")
    degree = math.isqrt(k) - 1 if sh_degree is None else sh_degree
    if (degree + 1) ** 2 > k:
        raise ValueError(f"sh_degree {degree} needs {(degree + 1) ** 2} SH coefficients, colors has {k}")
    rows = wp.array(ptr=colors.ptr if n else None, dtype=wp.types.vector(3 * k, wp.float32), shape=(n,), device=device)
    rows._ref = colors
    return Gaussians(means, quats, scales, opacities, colors, (degree + 1) ** 2, rows)


def check_grads(grads: GaussianGrads, gaussians: Gaussians) -> GaussianGrads:
    """``grads`` must match the Gaussians in dtype, shape and device."""
    if not isinstance(grads, GaussianGrads):
        raise TypeError(f"grads must be a GaussianGrads, got {type(grads).__name__}")
    for name, src in zip(("means", "quats", "scales", "opacities", "colors"), gaussians.arrays):
        check_array(getattr(grads, name), f"grads.{name}", src.dtype, src.ndim, src.shape, src.device)
    return grads


# radix_sort_pairs needs key buffers of 2 * count entries, and a Warp array holds < 2^31
MAX_ISECTS = (2**31 - 1) // 2


def check_intersections(total: int, exact_total, n_gaussians: int, tiles_x: int, tiles_y: int) -> None:
    """ValueError if a render's tile intersections (``total``, saturated at 2^31 - 1)
    exceed what one sort can hold (``MAX_ISECTS``); ``exact_total()`` reads the int64
    total back for the message (error path only)."""
    if total <= MAX_ISECTS:
        return
    raise ValueError(
        f"render_gaussians: {n_gaussians} Gaussians on a {16 * tiles_x}x{16 * tiles_y}-pixel image "
        f"({tiles_x}x{tiles_y} tiles) make {exact_total()} tile intersections, more than the {MAX_ISECTS} "
        "one sort can hold; render fewer or smaller Gaussians, or the image in crops")
