"""3D Gaussian splatting: the public forward, its hand-written backward, and wp.Tape recording."""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.calibrate import resolve_threshold
from arc_warp._src.camera import Camera
from arc_warp._src.splat.bin_ops import count_intersections, sort_intersections, tile_grid
from arc_warp._src.splat.project_kernels import BAD_SLOTS
from arc_warp._src.splat.project_ops import camera_params, project, project_backward
from arc_warp._src.splat.raster_ops import raster_backward, rasterize
from arc_warp._src.splat.records import BinResult, GaussianGrads, GaussianInputs, RenderOutput, RenderSettings
from arc_warp._src.splat.sh_ops import compute_colors
from arc_warp._src.splat.validate import check_array, check_grads, check_inputs, raise_on_flags


def render_gaussians(
    means: wp.array,  # (N,) wp.vec3, world units
    quats: wp.array,  # (N,) wp.vec4, wxyz, any norm > 0
    scales: wp.array,  # (N,) wp.vec3, linear std-devs, world units
    opacities: wp.array,  # (N,) float32 in [0, 1]
    colors: wp.array,  # (N, (d+1)^2) wp.vec3 SH coefficients, or (N,) wp.vec3 RGB
    camera: Camera | list[Camera] | tuple[Camera, ...],
    settings: RenderSettings | None = None,
) -> RenderOutput | list[RenderOutput]:
    """Renders 3D Gaussians with gsplat 1.5.3 "classic" conventions.

    Pipeline: EWA projection (clamped Jacobian, ``eps2d`` dilation, opacity-aware
    extent, near/far/opacity/off-image culling) -> SH colour (view direction from the
    camera centre, ``+0.5``, clamped at 0; plain RGB is used as-is) -> 16x16 tile
    binning with a stable (tile, depth) radix sort -> front-to-back compositing
    (pixel centres at +0.5, alpha = min(0.999, o exp(-power)), alphas < 1/255 skipped,
    a Gaussian that would bring T to <= 1e-4 ends the pixel uncomposited, background
    added as T_final * background).

    All arrays live on one device (cpu or cuda); outputs are allocated there.

    Checks: types, dtypes, shapes and devices raise TypeError/ValueError before any
    launch. NaN/Inf in any input (and an all-zero quaternion) is found by the device:
    the projection kernel checks the values it reads anyway and one flat kernel
    checks ``colors``; the flags come back with the single readback that sizes the
    sort, and a ValueError is raised before binning or rasterising.

    Gradients: if any input has ``requires_grad`` and a ``wp.Tape`` is active, the
    outputs get ``requires_grad`` and the backward is recorded with
    ``tape.record_func``, so ``tape.backward()`` adds into the inputs' ``.grad`` and
    continues into upstream kernels. Example, with means made by a user kernel::

        @wp.kernel
        def offset(base: wp.array(dtype=wp.vec3), shift: wp.array(dtype=wp.vec3),
                   out: wp.array(dtype=wp.vec3)):
            i = wp.tid()
            out[i] = base[i] + shift[0]

        shift = wp.zeros(1, dtype=wp.vec3, requires_grad=True)
        means = wp.zeros(n, dtype=wp.vec3, requires_grad=True)
        tape = wp.Tape()
        with tape:
            wp.launch(offset, dim=n, inputs=[base, shift], outputs=[means])
            out = render_gaussians(means, quats, scales, opacities, colors, camera)
            wp.launch(image_loss, dim=(h, w), inputs=[out.color], outputs=[loss])
        tape.backward(loss)  # shift.grad now holds dL/dshift

    Args:
        camera: a :class:`Camera`, or a list/tuple of them (see ``Camera.batch``), which
            renders each camera and returns a list.
        settings: :class:`RenderSettings`; ``None`` uses the defaults.

    Returns:
        :class:`RenderOutput` (or a list of them for a camera batch).
    """
    if settings is None:
        settings = RenderSettings()
    elif not isinstance(settings, RenderSettings):
        raise TypeError(f"settings must be a RenderSettings, got {type(settings).__name__}")
    if isinstance(camera, (list, tuple)):
        return [render_gaussians(means, quats, scales, opacities, colors, cam, settings) for cam in Camera.batch(camera)]
    if not isinstance(camera, Camera):
        raise TypeError(f"camera must be a Camera or a list of cameras, got {type(camera).__name__}")
    inputs = check_inputs(means, quats, scales, opacities, colors, settings)
    out = _forward(inputs, camera, settings)
    tape = wp._src.context.runtime.tape  # the active wp.Tape, if any (Warp has no public getter)
    if tape is not None and any(a.requires_grad for a in inputs.arrays):
        tracked = [a for a in (out.color, out.alpha, out.depth, out.expected_depth, *inputs.arrays) if a.requires_grad]
        tape.record_func(lambda: _tape_backward(out), tracked)
    return out


def _forward(inputs: GaussianInputs, camera: Camera, settings: RenderSettings) -> RenderOutput:
    device = inputs.means.device
    tiles_x, tiles_y = tile_grid(camera.width, camera.height)
    cam = camera_params(camera)
    flags = wp.zeros(1 + len(BAD_SLOTS), dtype=wp.int32, device=device)
    proj = project(inputs, cam, settings.eps2d, tiles_x, tiles_y, flags, settings.antialiased)
    if inputs.count > 0:
        compute_colors(inputs, cam, proj, flags)  # flags bad colours before the readback
        cum_tiles, host_flags = count_intersections(proj, flags)
        raise_on_flags(host_flags)
        bins = sort_intersections(proj, cum_tiles, int(host_flags[0]), tiles_x, tiles_y)
    else:
        bins = BinResult(tiles_x, tiles_y, 0, wp.empty(0, dtype=wp.int32, device=device),
                         wp.zeros(tiles_x * tiles_y, dtype=wp.vec2i, device=device))
    images = rasterize(proj, bins, camera.width, camera.height, settings.background)

    if any(a.requires_grad for a in inputs.arrays):
        for img in (images.color, images.alpha, images.depth, images.expected_depth):
            img.requires_grad = True
    means2d_grad = wp.zeros(inputs.count, dtype=wp.vec2, device=device)
    means2d_absgrad = wp.zeros(inputs.count, dtype=wp.vec2, device=device) if settings.absgrad else None
    return RenderOutput(
        color=images.color,
        alpha=images.alpha,
        depth=images.depth,
        expected_depth=images.expected_depth,
        means2d=proj.means2d,
        radii=proj.radii,
        camera=camera,
        settings=settings,
        means2d_grad=means2d_grad,
        means2d_absgrad=means2d_absgrad,
        _inputs=inputs,
        _cam=cam,
        _project=proj,
        _bins=bins,
        _images=images,
    )


def _tape_backward(out: RenderOutput):
    """Tape callback: output .grad -> input .grad (scratch for inputs without one)."""
    grads = GaussianGrads(
        *(a.grad if a.requires_grad else wp.zeros(a.shape, dtype=a.dtype, device=a.device) for a in out._inputs.arrays)
    )
    render_gaussians_backward(
        out, out.color.grad, out.alpha.grad, out.depth.grad, out.expected_depth.grad, grads=grads
    )


def render_gaussians_backward(
    out: RenderOutput,
    grad_color: wp.array | None,  # (H, W) wp.vec3, dL/dcolor
    grad_alpha: wp.array | None = None,  # (H, W) float
    grad_depth: wp.array | None = None,  # (H, W) float
    grad_expected_depth: wp.array | None = None,  # (H, W) float
    grads: GaussianGrads | None = None,
) -> GaussianGrads:
    """Gradients of a scalar loss w.r.t. the inputs of the render that made ``out``.

    ``grad_*`` are cotangents shaped like the outputs, on the same device; ``None``
    means zero. The rasteriser backward runs one 256-thread block per tile and reduces
    the per-Gaussian gradients with the accumulator of ``out.settings.reduce``
    (``"floor"`` yields no rasteriser gradients: benchmarking only). Then one
    per-Gaussian kernel takes them through the projection (means, quats via the
    normalisation, scales, opacities) and the SH evaluation (coefficients, and means via
    the view direction). The 2D mean gradients are added into ``out.means2d_grad`` and, with
    ``settings.absgrad``, their per-pixel absolute sums into ``out.means2d_absgrad``.

    Returns:
        :class:`GaussianGrads` shaped like the inputs: newly allocated, or ``grads``
        (which must match the inputs) with the gradients added in.
    """
    if not isinstance(out, RenderOutput) or out._inputs is None:
        raise TypeError(f"out must be a RenderOutput returned by render_gaussians, got {type(out).__name__}")
    inputs = out._inputs
    device = inputs.means.device
    shape = out.alpha.shape

    zero_image = None  # one read-only zero image serves every missing float cotangent

    def cotangent(value, name, dtype):
        nonlocal zero_image
        if value is not None:
            return check_array(value, name, dtype, 2, shape, device)
        if dtype is not wp.float32:
            return wp.zeros(shape, dtype=dtype, device=device)
        if zero_image is None:
            zero_image = wp.zeros(shape, dtype=dtype, device=device)
        return zero_image

    v_color = cotangent(grad_color, "grad_color", wp.vec3)
    v_alpha = cotangent(grad_alpha, "grad_alpha", wp.float32)
    v_depth = cotangent(grad_depth, "grad_depth", wp.float32)
    v_expected = cotangent(grad_expected_depth, "grad_expected_depth", wp.float32)
    if grads is None:
        grads = GaussianGrads(*(wp.zeros(a.shape, dtype=a.dtype, device=device) for a in inputs.arrays))
    else:
        check_grads(grads, inputs)
    if inputs.count == 0:
        return grads

    settings = out.settings
    # only "arc" reads the threshold; resolving it may calibrate the GPU once
    threshold = resolve_threshold(device, settings.threshold) if settings.reduce == "arc" else 0
    raster_grads = raster_backward(
        out._project,
        out._bins,
        out._images,
        settings.background,
        v_color,
        v_alpha,
        v_depth,
        v_expected,
        settings.reduce,
        settings.absgrad,
        threshold,
    )
    cam = out._cam
    project_backward(
        inputs, cam, out._project, raster_grads, settings.absgrad, grads, out.means2d_grad, out.means2d_absgrad,
        settings.eps2d, settings.antialiased
    )
    return grads
