"""Launch of the colour stage: SH evaluation (plain RGB is used as-is).

Its backward runs inside the projection backward (``project_ops.project_backward``).
"""

import warp as wp

from arc_warp._src.splat.math import CameraParams
from arc_warp._src.splat.records import GaussianInputs, ProjectResult
from arc_warp._src.splat.sh_kernels import make_sh_fwd


def compute_colors(inputs: GaussianInputs, cam: CameraParams, proj: ProjectResult, bad: wp.array, slot: int):
    """Fills ``proj.rgb`` from SH coefficients and flags non-finite ones in ``bad[slot]``.

    Plain RGB colours are used as-is: nothing is launched (check them separately).
    """
    if inputs.sh_coeffs == 0:
        return
    wp.launch(
        make_sh_fwd(inputs.sh_coeffs),
        dim=inputs.count,
        inputs=[inputs.means, inputs.colors, proj.radii, cam.center, slot],
        outputs=[proj.rgb, bad],
        device=inputs.means.device,
        record_tape=False,
    )
