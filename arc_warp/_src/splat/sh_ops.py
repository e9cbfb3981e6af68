"""Launches of the colour stage: SH evaluation (or plain RGB pass-through) and its backward."""

import warp as wp

from arc_warp._src.splat.math import CameraParams
from arc_warp._src.splat.records import GaussianGrads, GaussianInputs, ProjectResult
from arc_warp._src.splat.sh_kernels import make_rgb_bwd, make_sh_bwd, make_sh_fwd


def compute_colors(inputs: GaussianInputs, cam: CameraParams, proj: ProjectResult):
    """Fills ``proj.rgb`` from SH coefficients; plain RGB is used as-is (nothing to do)."""
    if inputs.sh_coeffs == 0:
        return
    wp.launch(
        make_sh_fwd(inputs.sh_coeffs),
        dim=inputs.count,
        inputs=[inputs.means, inputs.colors, proj.radii, cam.center],
        outputs=[proj.rgb],
        device=inputs.means.device,
        record_tape=False,
    )


def colors_backward(
    inputs: GaussianInputs,
    cam: CameraParams,
    proj: ProjectResult,
    raster_grads: wp.array,
    absgrad: bool,
    grads: GaussianGrads,
):
    """Adds dL/dcolors (and, for SH, the view-direction part of dL/dmeans) into ``grads``."""
    device = inputs.means.device
    if inputs.sh_coeffs == 0:
        wp.launch(
            make_rgb_bwd(absgrad),
            dim=inputs.count,
            inputs=[proj.radii, raster_grads],
            outputs=[grads.colors],
            device=device,
            record_tape=False,
        )
        return
    wp.launch(
        make_sh_bwd(inputs.sh_coeffs, absgrad),
        dim=inputs.count,
        inputs=[inputs.means, inputs.colors, proj.radii, cam.center, raster_grads],
        outputs=[grads.colors, grads.means],
        device=device,
        record_tape=False,
    )
