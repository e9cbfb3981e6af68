"""Launches of the projection stage (forward and backward) and of the camera records."""

from __future__ import annotations

import numpy as np
import warp as wp

from arc_warp._src.camera import CAMERA_MODELS, Camera, DeviceCameras
from arc_warp._src.launches import Launches
from arc_warp._src.splat.geometry_funcs import CameraParams
from arc_warp._src.splat.project_kernels import camera_from_matrices, make_project_bwd, make_project_fwd
from arc_warp._src.splat.records import GaussianGrads, Gaussians, RenderSettings
from arc_warp._src.splat.validate_kernels import BAD_SLOTS


CAMERA_RECORD = CameraParams.numpy_dtype()  # numpy's layout of one CameraParams (made once: it parses)


def camera_params(cameras: list[Camera], out: np.ndarray | None = None) -> np.ndarray:
    """(C,) numpy records of ``CameraParams`` for host cameras (into ``out`` if given): their
    float64 values rounded once to float32, as the kernels read them."""
    params = np.zeros(len(cameras), dtype=CAMERA_RECORD) if out is None else out
    for i, camera in enumerate(cameras):
        w2c, lens = camera.world_to_camera, camera.distortion
        if lens is None:
            terms = ((0.0,) * 4, (0.0,) * 3, (0.0, 0.0), 0.0)
        else:
            num, den = lens.radial(camera.model)
            terms = (tuple(num[1:]) + (0.0,) * (5 - len(num)), tuple(den[1:]) + (0.0,) * (4 - len(den)),
                     (lens.p1, lens.p2), camera.r2_max)
        # one record at once, in CameraParams' field order (a field at a time costs ~10x)
        params[i] = (w2c[:3, :3], w2c[:3, 3], camera.center, camera.fx, camera.fy, camera.cx, camera.cy,
                     camera.width, camera.height, camera.near, camera.far, CAMERA_MODELS.index(camera.model),
                     lens is not None, *terms)
    return params


def is_plain_pinhole(cameras) -> bool:
    """True for undistorted pinhole cameras (a sequence of Camera, or DeviceCameras): the
    projection may then use kernels without the other models' code (``pinhole_only``)."""
    if isinstance(cameras, DeviceCameras):
        return cameras.model == "pinhole" and cameras.distortion is None
    return all(cam.model == "pinhole" and cam.distortion is None for cam in cameras)


def write_cameras(launches: Launches, cameras, cams: wp.array, flags: wp.array, staging: wp.array,
                  records: np.ndarray) -> None:
    """Fill the (C,) ``CameraParams`` ``cams``: host :class:`Camera` values written into the
    (C,) host ``staging`` records (page-locked on CUDA, so the copy queues without a wait;
    ``records`` is their numpy view) and copied over (``staging`` None: ``records`` are
    ``cams``' own, on the CPU), or :class:`DeviceCameras` read on the device (an invalid camera sets
    its row of the (C, FLAG_SLOTS) ``flags``). The caller makes sure the device has read
    ``staging``'s previous values."""
    if isinstance(cameras, DeviceCameras):
        slots = (1 + BAD_SLOTS.index("cameras"), 1 + BAD_SLOTS.index("camera distortion"))
        for c in range(len(cameras)):
            launches.launch(camera_from_matrices, 1,
                            [cameras.viewmats, cameras.intrinsics, c, cameras.width, cameras.height,
                             float(cameras.near), float(cameras.far), CAMERA_MODELS.index(cameras.model),
                             cameras.distortion, cams[c:c + 1], flags[c], *slots], key=("camera", c))
        return
    if staging is None:  # on the CPU, ``records`` are ``cams``' own
        camera_params(cameras, records)
        return
    camera_params(cameras, records)
    wp.copy(cams, staging)


def project(launches: Launches, key, g: Gaussians, cam: wp.array, settings: RenderSettings, tiles_x: int,
            tiles_y: int, flags: wp.array, means2d: wp.array, radii: wp.array, splats: wp.array,
            tiles_per_gauss: wp.array, depth_keys: wp.array, order: wp.array, pinhole_only: bool = False) -> None:
    """Screen-space splats (N,) ``Splat2D``, ``means2d`` (N,) vec2 pixels, ``radii`` (N,)
    vec2i, the (N,) int32 tile counts, and the depth sort's keys and identity order (the
    first N entries of ``depth_keys`` and ``order``); flags non-finite inputs in ``flags``.
    ``cam`` is one camera's (1,) ``CameraParams``. From ``settings``: ``eps2d``,
    ``antialiased`` and the scale / opacity activations (compile-time variants).
    ``pinhole_only``: the kernel without the other camera models' code (fewer registers;
    :func:`is_plain_pinhole`)."""
    launches.launch(
        make_project_fwd(settings.antialiased, settings.scale_activation, settings.opacity_activation, pinhole_only),
        g.count,
        [g.means, g.quats, g.scales, g.opacities, cam, settings.eps2d, tiles_x, tiles_y, means2d, splats, radii,
         tiles_per_gauss, depth_keys, order, flags],
        key=("project", key))


def project_backward(launches: Launches, key, g: Gaussians, cam: wp.array, settings: RenderSettings,
                     radii: wp.array, splats: wp.array, rgb: wp.array, raster_grads: wp.array, grads: GaussianGrads,
                     means2d_grad: wp.array | None, means2d_absgrad: wp.array | None, accumulate: bool,
                     sh_v_means: wp.array | None, pinhole_only: bool = False) -> None:
    """Adds the projection's and the colour stage's shares of the gradients into ``grads``
    (and the 2D mean gradients), in one pass over the Gaussians; ``accumulate`` False writes
    them instead (every entry, 0 for culled Gaussians: nothing needs zeroing first).

    ``sh_v_means``: (N,) vec3 from ``sh_ops.color_backward``, which has written the colour
    gradients; this adds its view-direction share of dL/dmeans (it may be ``grads.means``
    itself when not ``accumulate``: each entry is read before it is written). None: the
    colour backward runs here, per Gaussian. With the activations set, the scale / opacity
    gradients are w.r.t. the raw log-scales / logits. ``pinhole_only``: as :func:`project`'s
    (the forward's value)."""
    launches.launch(
        make_project_bwd(g.sh_coeffs, settings.absgrad, settings.antialiased, not accumulate,
                         sh_v_means is not None, settings.scale_activation, settings.opacity_activation,
                         means2d_grad is not None, pinhole_only),
        g.count,
        [g.means, g.quats, g.scales, g.colors, g.opacities, cam, settings.eps2d, radii, splats, rgb, raster_grads,
         grads.means, grads.quats, grads.scales, grads.opacities, grads.colors, means2d_grad, means2d_absgrad,
         sh_v_means],
        key=("project_bwd", key))
