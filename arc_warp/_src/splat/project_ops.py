"""Launches of the projection stage (forward and backward)."""

import numpy as np
import warp as wp

from arc_warp._src.camera import Camera, DeviceCameras
from arc_warp._src.splat.bin_ops import forward_scratch
from arc_warp._src.splat.geometry_funcs import CameraParams, Splat2D
from arc_warp._src.splat.project_kernels import camera_from_matrices, make_project_bwd, make_project_fwd
from arc_warp._src.splat.validate_kernels import BAD_SLOTS
from arc_warp._src.splat.records import GaussianGrads, GaussianInputs, ProjectResult, RenderSettings
from arc_warp._src.splat.workspace import Frame


def camera_params(camera: Camera, device) -> wp.array:
    """(1,) ``CameraParams`` on ``device``: the float32 kernel argument of ``camera``."""
    params = CameraParams()
    w2c = camera.world_to_camera
    params.rot = wp.mat33(*w2c[:3, :3].astype(np.float32).ravel())
    params.trans = wp.vec3(*w2c[:3, 3].astype(np.float32))
    params.center = wp.vec3(*camera.center.astype(np.float32))
    params.fx = camera.fx
    params.fy = camera.fy
    params.cx = camera.cx
    params.cy = camera.cy
    params.width = camera.width
    params.height = camera.height
    params.near = camera.near
    params.far = camera.far
    return wp.array([params], dtype=CameraParams, device=device)


def device_camera_params(cameras: DeviceCameras, index: int, bad: wp.array, frame: Frame) -> wp.array:
    """(1,) ``CameraParams`` of camera ``index`` of ``cameras``, made on the device in a
    buffer of ``frame`` (no host copy); an invalid camera sets its flag in ``bad``."""
    cams = frame.array("camera", 1, CameraParams)
    frame.launch(
        camera_from_matrices,
        1,
        [cameras.viewmats, cameras.intrinsics, index, cameras.width, cameras.height, float(cameras.near),
         float(cameras.far), cams, bad, 1 + BAD_SLOTS.index("cameras")],
    )
    return cams


def project(
    inputs: GaussianInputs,
    cam: wp.array,  # (1,) CameraParams
    settings: RenderSettings,
    tiles_x: int,
    tiles_y: int,
    bad: wp.array,
    frame: Frame,
    means2d: wp.array,  # (N,) vec2, output
    radii: wp.array,  # (N,) vec2i, output
    arena: Frame | None = None,
) -> ProjectResult:
    """Screen-space splats, radii and tile counts, and the depth sort's keys and identity
    order (``ProjectResult.depth``); flags non-finite inputs in ``bad``.

    The backward's state comes from ``frame``; the tile counts and depth order, read only
    by the binning of this render, are the forward's stage of the scratch arena of
    ``arena`` (``bin_ops.forward_scratch``; None: ``frame.shared``, whose arena the
    renders of a call take in turn; a render whose binning waits for other renders'
    counts passes its own ``frame``); the shared arena's room also covers the tile sort's
    keys at the workspace's kept sort size.
    ``means2d`` and ``radii`` are the caller's outputs.
    From ``settings``: ``eps2d``, ``antialiased`` (splat opacities carry the 2D filter's
    compensation) and ``scale_activation`` / ``opacity_activation``, which pick the kernel
    that activates raw log-scales / logits as it reads them."""
    arena = frame.shared if arena is None else arena
    n = inputs.count
    sort_size = frame._workspace.sort_size((tiles_x, tiles_y)) if arena is frame.shared else None
    tiles_per_gauss, depth = forward_scratch(arena, n, sort_size or 0)
    result = ProjectResult(
        means2d=means2d,
        splats=frame.array("splats", n, Splat2D),  # culled entries are never read
        radii=radii,
        tiles_per_gauss=tiles_per_gauss,
        rgb=inputs.colors if inputs.sh_coeffs == 0 else frame.array("rgb", n, wp.vec3),
        depth=depth,
    )
    frame.launch(
        make_project_fwd(settings.antialiased, settings.scale_activation, settings.opacity_activation),
        n,
        [
            inputs.means,
            inputs.quats,
            inputs.scales,
            inputs.opacities,
            cam,
            settings.eps2d,
            tiles_x,
            tiles_y,
            result.means2d,
            result.splats,
            result.radii,
            result.tiles_per_gauss,
            depth.keys,
            depth.order,
            bad,
        ],
    )
    return result


def project_backward(
    inputs: GaussianInputs,
    cam: wp.array,  # (1,) CameraParams
    proj: ProjectResult,
    raster_grads: wp.array,
    settings: RenderSettings,
    grads: GaussianGrads,
    means2d_grad: wp.array | None,
    means2d_absgrad: wp.array | None,
    frame: Frame,
    accumulate: bool = True,
    sh_v_means: wp.array | None = None,
):
    """Adds the projection's and the colour stage's shares of the gradients into ``grads``
    (and the 2D mean grads), in one pass over the Gaussians; ``accumulate`` False writes
    them instead (every entry, 0 for culled Gaussians: nothing needs zeroing first).

    ``sh_v_means``: (N,) vec3 from ``sh_ops.color_backward``, which has written the colour
    gradients; this adds its view-direction share of dL/dmeans (it may be ``grads.means``
    itself when not ``accumulate``: each entry is read before it is written). None: the
    colour backward runs here, per Gaussian. With ``settings.scale_activation`` /
    ``opacity_activation`` set, the scale / opacity gradients are w.r.t. the raw log-scales
    / logits."""
    frame.launch(
        make_project_bwd(inputs.sh_coeffs, settings.absgrad, settings.antialiased, not accumulate,
                         sh_v_means is not None, settings.scale_activation, settings.opacity_activation,
                         means2d_grad is not None),
        inputs.count,
        [
            inputs.means,
            inputs.quats,
            inputs.scales,
            inputs.colors,
            inputs.opacities,
            cam,
            settings.eps2d,
            proj.radii,
            proj.splats,
            proj.rgb,
            raster_grads,
            grads.means,
            grads.quats,
            grads.scales,
            grads.opacities,
            grads.colors,
            means2d_grad,
            means2d_absgrad,
            sh_v_means,
        ],
    )
