"""The functional API: render_gaussians / render_gaussians_backward over a GaussianRenderer,
their wp.Tape recording, and the Workspace whose objects repeated functional calls reuse."""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.calibrate import resolve_threshold
from arc_warp._src.camera import Camera, DeviceCameras
from arc_warp._src.launches import LRU
from arc_warp._src.splat.records import (GaussianGrads, ImageGrads, RenderImages, RenderOutput, RenderSettings,
                                         check_gaussians)
from arc_warp._src.splat.renderer import GaussianRenderer
from arc_warp._src.splat.surface_ops import check_surfaces
from arc_warp._src.tape import active_tape
from arc_warp._src.validate import check_array

# Names and dtypes of the (H, W) images a caller may supply through ``outputs``.
IMAGE_OUTPUTS = {"color": wp.vec3, "alpha": wp.float32, "depth": wp.float32, "expected_depth": wp.float32}
WORKSPACE_OBJECTS = 32  # objects a Workspace keeps: a few image sizes' renderers and mesh op chains


class Workspace:
    """The objects that repeated functional calls reuse on one device (explicit state, no
    globals): pass it as ``workspace=`` to :func:`render_gaussians` and to the mesh ops. It
    holds one object per kind and size: ``(GaussianRenderer, width, height, cameras,
    sh_coeffs, settings)`` (:meth:`renderer`; a new Gaussian count resizes it) or ``(op class,
    sizes..., options...)`` (mesh ops' ``of``; :meth:`get`), the least recently used dropped
    past ``limit``. ARC thresholds are resolved here (``threshold`` None: the device's
    calibrated values), never inside a step. One thread (and stream) at a time.
    ``allocator``: the renderers' (None: their own)."""

    def __init__(self, device=None, threshold: int | None = None, allocator=None, limit: int = WORKSPACE_OBJECTS):
        self.device = wp.get_device(device)
        self.threshold = resolve_threshold(self.device, threshold)
        self.keyed_threshold = resolve_threshold(self.device, threshold, keyed=True)
        self.allocator = allocator
        self._objects = LRU(limit)  # (kind, sizes..., options...) -> its object

    def get(self, key: tuple, make):
        """The object of ``key`` (its kind, sizes and options), made by ``make()`` if not held."""
        return self._objects.get(key, make)

    def renderer(self, width: int, height: int, gaussians: int, cameras: int, sh_coeffs: int,
                 settings: RenderSettings) -> GaussianRenderer:
        """The renderer of this size and settings (made on first use), resized to
        ``gaussians`` if it rendered another count."""
        renderer = self.get((GaussianRenderer, width, height, cameras, sh_coeffs, settings), lambda: GaussianRenderer(
            width, height, gaussians, cameras, sh_coeffs, settings, self.device, self.threshold,
            allocator=self.allocator))
        if renderer.num_gaussians != gaussians:
            renderer.resize(gaussians)
        return renderer

    def objects(self, kind: type | None = None) -> list:
        """The objects held (of class ``kind`` only, if given), least recently used first."""
        return [obj for obj in self._objects.values() if kind is None or isinstance(obj, kind)]

    def renderers(self) -> list[GaussianRenderer]:
        """The :class:`GaussianRenderer` objects held (a graph capture marks them capturing)."""
        return self.objects(GaussianRenderer)


def render_gaussians(
    means: wp.array,  # (N,) wp.vec3, world units
    quats: wp.array,  # (N,) wp.vec4, wxyz, any norm > 0
    scales: wp.array,  # (N,) wp.vec3, linear std-devs, world units
    opacities: wp.array,  # (N,) float32 in [0, 1]
    colors: wp.array,  # (N, (d+1)^2) wp.vec3 SH coefficients, or (N,) wp.vec3 RGB
    camera: Camera | list[Camera] | tuple[Camera, ...] | DeviceCameras,
    settings: RenderSettings | None = None,
    workspace: Workspace | None = None,
    outputs: dict[str, wp.array] | None = None,
    tape: wp.Tape | None = None,
    *,
    surface_colors: wp.array | list | None = None,  # (H, W) wp.vec3, or C of them / (C, H, W) for several cameras
    surface_depths: wp.array | list | None = None,  # (H, W) float32 camera z, +inf: no surface; as the colours
) -> RenderOutput | list[RenderOutput]:
    """Renders 3D Gaussians with gsplat 1.5.3 "classic" conventions.

    Pipeline: EWA projection (clamped Jacobian, ``eps2d`` dilation, opacity-aware
    extent, near/far/opacity/off-image culling) -> SH colour (view direction from the
    camera centre, ``+0.5``, clamped at 0; plain RGB is used as-is) -> 16x16 tile
    binning with a stable (tile, depth) radix sort -> front-to-back compositing
    (pixel centres at +0.5, alpha = min(0.999, o exp(-power)), alphas < 1/255 skipped,
    a Gaussian that would bring T to <= 1e-4 ends the pixel uncomposited, background
    added as T_final * background). All arrays live on one device; outputs are made there.

    This is one :meth:`GaussianRenderer.forward` with ``check=True``: TypeError/ValueError
    for types, dtypes, shapes and devices before any launch, ValueError for NaN/Inf in any
    input (or an all-zero quaternion) once the device has found it; the images are always
    complete. For renders that never wait, hold a :class:`GaussianRenderer` yourself.

    Gradients: if any input has ``requires_grad`` and a ``wp.Tape`` is given (``tape=``;
    None: the tape of an enclosing ``with tape:`` block, if any), the outputs get
    ``requires_grad`` and the backward is recorded with ``tape.record_func``:
    ``tape.backward()`` adds into the inputs' ``.grad`` and continues into the kernels that
    made them (docs/warp.md has an example).

    Args:
        camera: a :class:`Camera`, a list/tuple of cameras of one image size, or
            :class:`DeviceCameras` (matrices on the device, read there); a list or
            DeviceCameras renders each camera and returns a list of :class:`RenderOutput`.
        settings: :class:`RenderSettings`; ``None`` uses the defaults.
        workspace: a :class:`Workspace` whose renderer of this size is reused (its scratch
            and prepared launches); None makes a renderer for this call.
        outputs: optional caller-owned (H, W) arrays for the images, by name: ``color``
            (wp.vec3), ``alpha``, ``depth``, ``expected_depth`` (float32), and (N,)
            ``means2d`` (wp.vec2) and ``radii`` (wp.vec2i); the render writes into them.
            For several cameras, a list of such dicts (or None), one per camera.
        surface_colors, surface_depths: an opaque surface behind the Gaussians, both or
            neither: per pixel a colour and a camera depth (+inf where there is none); see
            :class:`Surface` for how it composites. On the tape the colours' ``.grad`` gets
            their gradient (``grad_surface_colors`` of :func:`render_gaussians_backward`).
    """
    if settings is None:
        settings = RenderSettings()
    elif not isinstance(settings, RenderSettings):
        raise TypeError(f"settings must be a RenderSettings, got {type(settings).__name__}")
    if workspace is not None and not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must be an arc_warp Workspace or None, got {type(workspace).__name__}")
    if tape is not None and not isinstance(tape, wp.Tape):
        raise TypeError(f"tape must be a wp.Tape or None, got {type(tape).__name__}")
    batch = isinstance(camera, (list, tuple, DeviceCameras))
    if isinstance(camera, (list, tuple)):
        cameras = Camera.batch(camera)
        if not cameras:
            raise ValueError("camera: an empty list of cameras; pass at least one")
    elif isinstance(camera, (Camera, DeviceCameras)):
        cameras = camera if batch else (camera,)
    else:
        raise TypeError(f"camera must be a Camera, a list of cameras or DeviceCameras, got {type(camera).__name__}")
    sized = camera if isinstance(camera, DeviceCameras) else cameras[0]
    g = check_gaussians(means, quats, scales, opacities, colors, settings.sh_degree)
    c, n, shape = len(cameras), g.count, (sized.height, sized.width)
    if workspace is not None and workspace.device != g.device:
        raise ValueError(f"workspace is on {workspace.device} but the inputs are on {g.device}")
    if batch and outputs is not None and (not isinstance(outputs, (list, tuple)) or len(outputs) != c):
        raise ValueError(f"outputs= for a list of {c} cameras must be a list of as many dicts (or None)")
    per_camera = outputs if batch and outputs is not None else [outputs] * c
    given = [_check_outputs(o, n, shape, g.device) for o in per_camera]
    surfaces = check_surfaces(surface_colors, surface_depths, [shape] * c, batch, g.device)
    renderer = (GaussianRenderer(sized.width, sized.height, n, c, g.sh_coeffs, settings, g.device, record=False)
                if workspace is None else workspace.renderer(sized.width, sized.height, n, c, g.sh_coeffs, settings))
    images = RenderImages(*(wp.empty((c, *shape), dtype=dtype, device=g.device) for dtype in IMAGE_OUTPUTS.values()),
                          *(wp.empty((c, n), dtype=dtype, device=g.device) for dtype in (wp.vec2, wp.vec2i)))
    state = renderer.new_state()
    status = renderer.forward(g, cameras, state, images, check=True, surfaces=surfaces)
    outs = []
    for i, mine in enumerate(given):
        views = dict(zip((*IMAGE_OUTPUTS, "means2d", "radii"), images.planes[i]))
        for name, array in mine.items():  # the caller's arrays get the camera's results
            wp.copy(array, views[name])
            views[name] = array
        on_device = isinstance(camera, DeviceCameras)
        outs.append(RenderOutput(**views, camera=camera if on_device else cameras[i], settings=settings, status=status,
                                 means2d_absgrad=state.cameras[i].absgrad, camera_index=i if on_device else None,
                                 _renderer=renderer, _state=state, _index=i))
    tape = active_tape() if tape is None else tape
    surface_inputs = tuple(surface.colors for surface in surfaces or ())
    if tape is not None and any(a.requires_grad for a in g.arrays + surface_inputs):
        for out in outs:
            for img in (out.color, out.alpha, out.depth, out.expected_depth):
                img.requires_grad = True
            own = () if surfaces is None else (surfaces[out._index].colors,)
            tracked = [a for a in (out.color, out.alpha, out.depth, out.expected_depth, *g.arrays, *own)
                       if a.requires_grad]
            tape.record_func(lambda out=out: _tape_backward(out), tracked)
    return outs if batch else outs[0]


def _check_outputs(outputs, n: int, shape: tuple, device) -> dict:
    """Validated caller-owned output arrays by name (see ``render_gaussians``)."""
    if outputs is None:
        return {}
    if not isinstance(outputs, dict):
        raise TypeError(f"outputs must be a dict of wp.arrays by name, got {type(outputs).__name__}")
    wanted = {**{name: (dtype, 2, shape) for name, dtype in IMAGE_OUTPUTS.items()},
              "means2d": (wp.vec2, 1, (n,)), "radii": (wp.vec2i, 1, (n,))}
    for name, array in outputs.items():
        if name not in wanted:
            raise ValueError(f"outputs: unknown name {name!r}; expected some of {sorted(wanted)}")
        check_array(array, f"outputs[{name!r}]", *wanted[name], device)
    return outputs


def _tape_backward(out: RenderOutput):
    """Tape callback: output .grad -> input .grad (the inputs' own .grad where they have
    one, scratch for the others)."""
    g, surfaces = out._state.gaussians, out._state.surfaces
    grads = GaussianGrads(*(a.grad if a.requires_grad else wp.zeros_like(a) for a in g.arrays))
    surface = None if surfaces is None else surfaces[out._index].colors
    render_gaussians_backward(out, out.color.grad, out.alpha.grad, out.depth.grad, out.expected_depth.grad,
                              grads=grads, grad_surface_colors=surface.grad if surface is not None
                              and surface.requires_grad else None)


def render_gaussians_backward(
    out: RenderOutput,
    grad_color: wp.array | None,  # (H, W) wp.vec3, dL/dcolor
    grad_alpha: wp.array | None = None,  # (H, W) float
    grad_depth: wp.array | None = None,  # (H, W) float
    grad_expected_depth: wp.array | None = None,  # (H, W) float
    grads: GaussianGrads | None = None,
    accumulate: bool = True,
    means2d_grad: wp.array | None = None,  # (N,) wp.vec2
    grad_surface_colors: wp.array | None = None,  # (H, W) wp.vec3, added into
) -> GaussianGrads:
    """Gradients of a scalar loss w.r.t. the inputs of the render that made ``out``.

    ``grad_*``: cotangents shaped like the outputs, on their device (None: zero). This is
    :meth:`GaussianRenderer.backward`: the 2D mean gradients go into ``means2d_grad`` (default
    ``out.means2d_grad``) and, with ``settings.absgrad``, their per-pixel absolute sums into
    ``out.means2d_absgrad``. ``accumulate`` False writes them and ``grads`` (every entry:
    culled Gaussians and SH coefficients past ``settings.sh_degree`` get 0) instead of adding.

    Returns:
        :class:`GaussianGrads` shaped like the inputs: ``grads`` with the gradients added in
        (or written), or new arrays without ``grads``.
    """
    if not isinstance(out, RenderOutput) or out._state is None:
        raise TypeError(f"out must be a RenderOutput returned by render_gaussians, got {type(out).__name__}")
    g = out._state.gaussians
    shape, device = out.alpha.shape, g.device
    cot = ImageGrads(*(None if value is None else check_array(value, f"grad_{name}", dtype, 2, shape, device)
                       for value, (name, dtype) in zip((grad_color, grad_alpha, grad_depth, grad_expected_depth),
                                                       IMAGE_OUTPUTS.items())))
    if grads is None:
        grads = GaussianGrads(*(wp.empty_like(a) for a in g.arrays))
        accumulate = False
    elif not isinstance(grads, GaussianGrads):
        raise TypeError(f"grads must be a GaussianGrads, got {type(grads).__name__}")
    else:  # shaped like the Gaussians
        for name, src in zip(("means", "quats", "scales", "opacities", "colors"), g.arrays):
            check_array(getattr(grads, name), f"grads.{name}", src.dtype, src.ndim, src.shape, src.device)
    means2d_grad = (out.means2d_grad if means2d_grad is None else
                    check_array(means2d_grad, "means2d_grad", wp.vec2, 1, (g.count,), device))
    if grad_surface_colors is not None:
        if out._state.surfaces is None:
            raise ValueError("grad_surface_colors: the render had no surface (surface_colors / surface_depths)")
        check_array(grad_surface_colors, "grad_surface_colors", wp.vec3, 2, shape, device)

    def this_camera(value) -> list:  # the renderer's per-camera lists: None for the state's other cameras
        return [value if c == out._index else None for c in range(out._renderer.num_cameras)]

    out._renderer.backward(out._state, this_camera(cot), grads, accumulate, this_camera(means2d_grad),
                           this_camera(grad_surface_colors))
    return grads
