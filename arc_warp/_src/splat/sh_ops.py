"""Launch of the colour stage: SH evaluation (plain RGB is used as-is).

Its backward runs inside the projection backward (``project_ops.project_backward``).
"""

import warp as wp

from arc_warp._src.splat.validate_kernels import BAD_SLOTS, flag_nonfinite
from arc_warp._src.splat.records import GaussianInputs, ProjectResult
from arc_warp._src.splat.sh_kernels import make_sh_fwd
from arc_warp._src.splat.workspace import Frame


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
    frame.launch(
        make_sh_fwd(inputs.sh_coeffs),
        inputs.count,
        [
            inputs.means,
            inputs.colors,
            proj.radii,
            cam,
            slot,
            proj.rgb,
            bad,
        ],
    )
