"""Launches of the colour stage: SH evaluation (plain RGB is used as-is) and its backward.

The SH backward has a kernel of its own (:func:`color_backward`); plain RGB colours and
the deterministic mode take theirs inside the projection backward
(``project_ops.project_backward``).
"""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.launches import Launches
from arc_warp._src.splat.records import Gaussians
from arc_warp._src.splat.sh_kernels import make_sh_bwd, make_sh_fwd
from arc_warp._src.splat.validate_kernels import BAD_SLOTS, flag_nonfinite

SH_BWD_BLOCK = 256
"""Threads per block of the SH backward: a multiple of 32, so whole warps reach the
accumulator (and ``wp.config.enable_cpu_blocks`` emulates them on the CPU)."""

COLOR_SLOT = 1 + BAD_SLOTS.index("colors")


def compute_colors(launches: Launches, key, g: Gaussians, coeff_rows: wp.array | None, cam: wp.array,
                   radii: wp.array, rgb: wp.array, flags: wp.array) -> None:
    """Fills ``rgb`` (N,) vec3 from the SH coefficients (``coeff_rows``) and flags
    non-finite colour inputs in ``flags``. Plain RGB colours are used as-is and get one
    flat check pass."""
    if g.sh_coeffs == 0:
        flat = g.colors.view(wp.float32).flatten()
        launches.launch(flag_nonfinite, 3 * g.count, [flat, flags, COLOR_SLOT], key=("flag_colors", key))
        return
    launches.launch(make_sh_fwd(g.sh_coeffs, g.colors.shape[1]), g.count,
                    [g.means, coeff_rows, radii, cam, COLOR_SLOT, rgb, flags], key=("sh_fwd", key))


def sh_lanes(n_coeffs: int, rows: int, overwrite: bool) -> int:
    """Threads per Gaussian of the SH backward: the power of two covering the rows it
    writes (all ``rows`` stored when overwriting, else the ``n_coeffs`` evaluated), so for
    up to 32 rows a warp's lanes hold whole Gaussians."""
    return 1 << (max(rows if overwrite else n_coeffs, 1) - 1).bit_length()


def color_backward(launches: Launches, key, g: Gaussians, cam: wp.array, radii: wp.array, rgb: wp.array,
                   raster_grads: wp.array, absgrad: bool, v_colors: wp.array, mode: str, threshold: int,
                   accumulate: bool, v_means: wp.array) -> bool:
    """The SH backward as a kernel of its own: adds dL/dcoefficients into ``v_colors`` (or,
    without ``accumulate``, writes every entry) and the view-direction share of dL/dmeans
    into ``v_means`` (N,) vec3, for the projection backward to add (zeroed here, and
    neither written nor read for SH degree 0). ``v_means`` may be the gradient of the
    means itself when the projection backward writes it (it reads each entry before
    writing it). The shares of a Gaussian's threads are summed with the accumulator of
    ``mode`` (ARC ``threshold``).

    Returns False, launching nothing, for plain RGB colours and the ``deterministic`` mode
    (no atomics, fixed order): the projection backward then runs the colour backward per
    Gaussian."""
    if g.sh_coeffs == 0 or mode == "deterministic":
        return False
    n, rows = g.colors.shape
    lanes = sh_lanes(g.sh_coeffs, rows, not accumulate)
    if g.sh_coeffs > 1:
        launches.call(v_means.zero_)
    dim = -(-n * lanes // SH_BWD_BLOCK) * SH_BWD_BLOCK
    with cpu_launch_guard(launches.device):
        launches.launch(make_sh_bwd(g.sh_coeffs, lanes, absgrad, mode, not accumulate), dim,
                        [g.means, g.colors, cam, radii, rgb, raster_grads, threshold, v_colors, v_means],
                        block_dim=SH_BWD_BLOCK, key=("sh_bwd", key))
    return True
