"""Input checks of the public splatting functions (shapes, dtypes, devices, flags)."""

import math

import numpy as np
import warp as wp

from arc_warp._src.splat.validate_kernels import BAD_SLOTS
from arc_warp._src.validate import check_array
from arc_warp._src.splat.records import GaussianGrads, GaussianInputs, RenderSettings


def check_inputs(means, quats, scales, opacities, colors, settings: RenderSettings) -> GaussianInputs:
    """Validated :class:`GaussianInputs`; NaN/Inf are checked later on the device."""
    means = check_array(means, "means", wp.vec3, 1)
    n, device = means.shape[0], means.device
    check_array(quats, "quats", wp.vec4, 1, (n,), device)
    check_array(scales, "scales", wp.vec3, 1, (n,), device)
    check_array(opacities, "opacities", wp.float32, 1, (n,), device)
    if not isinstance(colors, wp.array):
        raise TypeError(f"colors must be a wp.array of wp.vec3, got {type(colors).__name__}")
    if colors.ndim == 1:
        check_array(colors, "colors", wp.vec3, 1, (n,), device)
        sh_coeffs = 0
    else:
        check_array(colors, "colors", wp.vec3, 2, None, device)
        k = colors.shape[1]
        if colors.shape[0] != n or k not in (1, 4, 9, 16):
            raise ValueError(f"SH colors must have shape (N={n}, (d+1)^2) with d in 0..3, got {colors.shape}")
        degree = math.isqrt(k) - 1 if settings.sh_degree is None else settings.sh_degree
        if (degree + 1) ** 2 > k:
            raise ValueError(f"sh_degree {degree} needs {(degree + 1) ** 2} SH coefficients, colors has {k}")
        sh_coeffs = (degree + 1) ** 2
    return GaussianInputs(means, quats, scales, opacities, colors, sh_coeffs)


_ZERO_QUAT_SLOT = BAD_SLOTS.index("quats (zero norm)") + 1
_CAMERA_SLOT = BAD_SLOTS.index("cameras") + 1
_SURFACE_DEPTH_SLOT = BAD_SLOTS.index("surface_depths (NaN)") + 1


def raise_on_flags(flags: np.ndarray | list):
    """ValueError naming each input the device checks found non-finite, zero quaternions,
    invalid device cameras and NaN surface depths. ``flags`` is a numpy array or a list (slot 0, the
    intersection total, is not a check)."""
    if not any(flags[1:]):
        return
    special = (_ZERO_QUAT_SLOT, _CAMERA_SLOT, _SURFACE_DEPTH_SLOT)
    bad = [name for slot, name in enumerate(BAD_SLOTS, start=1) if flags[slot] and slot not in special]
    problems = [f"non-finite (NaN/Inf) values in {', '.join(bad)}"] if bad else []
    if flags[_ZERO_QUAT_SLOT]:
        problems.append(
            "quats has quaternions of zero norm (all four components 0), which cannot be normalised "
            "into a rotation; use (1, 0, 0, 0) for an unrotated Gaussian"
        )
    if flags[_CAMERA_SLOT]:
        problems.append(
            "a camera's viewmat/K (DeviceCameras) is non-finite, has a focal length <= 0 or a viewmat "
            "whose last row is not (0, 0, 0, 1); check the camera matrices"
        )
    if flags[_SURFACE_DEPTH_SLOT]:
        problems.append("surface_depths has NaN values; give +inf where a pixel has no surface")
    if problems:
        raise ValueError("render_gaussians: " + "; ".join(problems))


# radix_sort_pairs needs key buffers of 2 * count entries, and a Warp array holds < 2^31
MAX_ISECTS = (2**31 - 1) // 2


def check_intersections(n_isects: int, exact_total, n_gaussians: int, tiles_x: int, tiles_y: int):
    """ValueError if ``n_isects`` (the total saturated at 2^31 - 1) exceeds ``MAX_ISECTS``;
    ``exact_total()`` reads the int64 total back for the message (error path only)."""
    if n_isects <= MAX_ISECTS:
        return
    total = exact_total()
    raise ValueError(
        f"render_gaussians: {n_gaussians} Gaussians on a {16 * tiles_x}x{16 * tiles_y}-pixel image "
        f"({tiles_x}x{tiles_y} tiles) make {total} tile intersections, more than the {MAX_ISECTS} "
        "one sort can hold; render fewer or smaller Gaussians, or the image in crops"
    )


def check_grads(grads: GaussianGrads, inputs: GaussianInputs) -> GaussianGrads:
    """``grads`` must match the inputs in dtype, shape and device."""
    if not isinstance(grads, GaussianGrads):
        raise TypeError(f"grads must be a GaussianGrads, got {type(grads).__name__}")
    for name, src in zip(("means", "quats", "scales", "opacities", "colors"), inputs.arrays):
        check_array(getattr(grads, name), f"grads.{name}", src.dtype, src.ndim, src.shape, src.device)
    return grads
