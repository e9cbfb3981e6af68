"""Launches of the colour stage: SH evaluation (plain RGB is used as-is) and its backward.

The SH backward has a kernel of its own (``color_backward``); plain RGB colours and the
deterministic mode take theirs inside the projection backward
(``project_ops.project_backward``).
"""

import warp as wp

from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.splat.validate_kernels import BAD_SLOTS, flag_nonfinite
from arc_warp._src.splat.records import GaussianInputs, ProjectResult
from arc_warp._src.splat.sh_kernels import make_sh_bwd, make_sh_fwd
from arc_warp._src.splat.workspace import Frame

SH_BWD_BLOCK = 256
"""Threads per block of the SH backward: a multiple of 32, so whole warps reach the
accumulator (and ``wp.config.enable_cpu_blocks`` emulates them on the CPU)."""


def compute_colors(inputs: GaussianInputs, cam: wp.array, proj: ProjectResult, bad: wp.array, frame: Frame):
    """Fills ``proj.rgb`` from SH coefficients and flags non-finite colour inputs in ``bad``.

    SH evaluation checks the coefficients it reads; plain RGB colours are used as-is
    (``proj.rgb`` is ``inputs.colors``) and get one flat check pass.
    """
    slot = 1 + BAD_SLOTS.index("colors")
    if inputs.sh_coeffs == 0:
        flat_colors = inputs.colors.view(wp.float32).flatten()
        frame.launch(flag_nonfinite, flat_colors.shape[0], [flat_colors, bad, slot])
        return
    rows = inputs.colors.shape[1]
    # the same memory as (N,) vectors of 3 * rows floats, for vector loads (a cached view)
    coeff_rows = frame._workspace.view(inputs.colors.ptr, wp.types.vector(3 * rows, wp.float32), (inputs.count,))
    frame.launch(
        make_sh_fwd(inputs.sh_coeffs, rows),
        inputs.count,
        [
            inputs.means,
            coeff_rows,
            proj.radii,
            cam,
            slot,
            proj.rgb,
            bad,
        ],
    )


def sh_lanes(n_coeffs: int, rows: int, overwrite: bool) -> int:
    """Threads per Gaussian of the SH backward: the power of two covering the rows it
    writes (all ``rows`` stored when overwriting, else the ``n_coeffs`` evaluated), so for
    up to 32 rows a warp's lanes hold whole Gaussians."""
    return 1 << (max(rows if overwrite else n_coeffs, 1) - 1).bit_length()


def color_backward(
    inputs: GaussianInputs,
    cam: wp.array,  # (1,) CameraParams
    proj: ProjectResult,
    raster_grads: wp.array,  # (N,) grad_vector(absgrad)
    absgrad: bool,
    v_colors: wp.array,  # (N, K) vec3, the colour gradient
    mode: str,
    threshold: int,
    frame: Frame,
    accumulate: bool = True,
    v_means: wp.array | None = None,  # (N,) vec3
) -> wp.array | None:
    """The SH backward as a kernel of its own: adds dL/dcoefficients into ``v_colors`` (or,
    without ``accumulate``, writes every entry) and returns the view-direction share of
    dL/dmeans for the projection backward to add (not written, nor read there, for SH
    degree 0): in ``v_means`` if given, else in ``frame.backward_shared``'s scratch arena after
    ``raster_grads`` (``raster_backward``'s ``share_room``). A backward that writes dL/dmeans
    passes that array: the projection backward reads each entry before writing it, so the
    share takes no scratch. Its threads' shares are summed with the accumulator of ``mode``
    (ARC ``threshold``).

    Returns None, launching nothing, for plain RGB colours and the ``deterministic`` mode
    (no atomics, fixed order): the projection backward then runs the colour backward per
    Gaussian."""
    if inputs.sh_coeffs == 0 or mode == "deterministic":
        return None
    n, rows = inputs.colors.shape
    lanes = sh_lanes(inputs.sh_coeffs, rows, not accumulate)
    if v_means is None:
        v_means = frame.backward_shared.scratch(n, wp.vec3, after=raster_grads, zero=inputs.sh_coeffs > 1)
    elif inputs.sh_coeffs > 1:
        v_means.zero_()
    dim = -(-n * lanes // SH_BWD_BLOCK) * SH_BWD_BLOCK
    with cpu_launch_guard(frame.device):
        frame.launch(
            make_sh_bwd(inputs.sh_coeffs, lanes, absgrad, mode, not accumulate),
            dim,
            [inputs.means, inputs.colors, cam, proj.radii, proj.rgb, raster_grads, threshold, v_colors, v_means],
            block_dim=SH_BWD_BLOCK,
        )
    return v_means
