"""3D Gaussian splatting: the public forward, its hand-written backward, and wp.Tape recording."""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import NamedTuple

import numpy as np
import warp as wp

from arc_warp._src.arc.calibrate import FALLBACK_THRESHOLD
from arc_warp._src.camera import Camera, DeviceCameras
from arc_warp._src.splat.bin_ops import count_intersections, sort_intersections, tile_grid
from arc_warp._src.splat.project_ops import camera_params, device_camera_params, project, project_backward
from arc_warp._src.splat.raster_ops import raster_backward, rasterize
from arc_warp._src.splat.records import (BinResult, GaussianGrads, GaussianInputs, ProjectResult, RenderOutput,
                                         RenderSettings, replaced)
from arc_warp._src.splat.sh_ops import color_backward, compute_colors
from arc_warp._src.splat.surface_ops import check_surfaces, flag_surface
from arc_warp._src.splat.validate import check_array, check_grads, check_inputs, raise_on_flags
from arc_warp._src.splat.validate_kernels import BAD_SLOTS
from arc_warp._src.splat.workspace import RENDER_PLANS, CurrentStream, Frame, GraphKey, Workspace, signature
from arc_warp._src.tape import active_tape

# Names and dtypes of the (H, W) images a caller may supply through ``outputs``.
IMAGE_OUTPUTS = {"color": wp.vec3, "alpha": wp.float32, "depth": wp.float32, "expected_depth": wp.float32}


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
    surface_colors: wp.array | list | None = None,  # (H, W) wp.vec3, or C of them / (C, H, W) for a batch
    surface_depths: wp.array | list | None = None,  # (H, W) float32 camera z, +inf: no surface; as the colours
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

    Host syncs: the tile sort needs the number of Gaussian-tile intersections, which
    only the device knows. With a ``workspace`` that has rendered this image size
    before, the sort is sized from the workspace's kept capacity (1.25x the recent
    totals) and nothing waits for the device until every camera of the call is queued;
    then one wait reads all totals (the device meanwhile runs the queued sorts and
    rasterisers), and a camera whose total exceeded the capacity is rendered again with
    its total read back first (so results are always exact). Otherwise (first render of
    a size, or no workspace) each camera reads its total back before sorting.

    Checks: types, dtypes, shapes and devices raise TypeError/ValueError before any
    launch. NaN/Inf in any input (and an all-zero quaternion) is found by the device:
    the projection kernel checks the values it reads anyway and one flat kernel
    checks ``colors``; the flags come back with the intersection totals, and a
    ValueError is raised before this function returns (non-finite Gaussians are culled,
    so the queued work never reads or writes out of bounds).

    Gradients: if any input has ``requires_grad`` and a ``wp.Tape`` is given (``tape=``)
    or active (``with tape:``), the outputs get ``requires_grad`` and the backward is
    recorded with
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
        camera: a :class:`Camera`, or a list/tuple of them (see ``Camera.batch``), or
            :class:`DeviceCameras` (matrices on the device, read there: no host copy);
            a list or DeviceCameras renders each camera and returns a list.
        settings: :class:`RenderSettings`; ``None`` uses the defaults.
        workspace: a :class:`Workspace` whose buffers this render reuses: with one,
            repeated renders (and backwards) of the same N and image size allocate no
            Warp arrays, and the ARC threshold was resolved when it was made. The
            output's arrays then belong to the workspace: they stay valid while the
            :class:`RenderOutput` is alive and are reused after it is dropped.
            ``None`` allocates fresh arrays (and resolves the threshold here).
        outputs: optional caller-owned (H, W) arrays for the images, by name:
            ``color`` (wp.vec3), ``alpha``, ``depth``, ``expected_depth`` (float32),
            and (N,) ``means2d`` (wp.vec2) and ``radii`` (wp.vec2i); the render writes
            into them. For a list of cameras, a list of such dicts (or None), one per
            camera. Missing names are allocated.
        tape: the ``wp.Tape`` to record the backward on; ``None`` uses the tape of an
            enclosing ``with tape:`` block, if any.
        surface_colors, surface_depths: an opaque surface behind the Gaussians (a mesh,
            see :func:`surface_from_mesh`), per pixel a colour and a camera depth (z, world
            units, the depth the Gaussians are sorted by; +inf where there is none), both
            or neither. At a pixel, every Gaussian whose centre is not in front of the
            surface (depth >= surface depth) is hidden, and the surface colour shows
            through the transmittance the others leave (``T_final * colour``) instead of
            the background; where the depth is +inf the background shows, so a surface at
            +inf everywhere renders what no surface renders, bit for bit. ``alpha``,
            ``depth`` and ``expected_depth`` stay the visible Gaussians' own. Checked like
            the inputs (NaN depths and non-finite colours by the device). The backward adds
            ``T_final * dL/dcolor`` into the colours' gradient (``.grad`` on the tape,
            ``grad_surface_colors`` of :func:`render_gaussians_backward`); the depths get
            none. Renders with a surface are not kept as repeatable call plans.

    Returns:
        :class:`RenderOutput` (or a list of them for a camera batch).
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
    if isinstance(camera, DeviceCameras):
        cameras = [(camera, i) for i in range(len(camera))]
    elif batch:
        cameras = [(cam, None) for cam in Camera.batch(camera)]
    elif isinstance(camera, Camera):
        cameras = [(camera, None)]
    else:
        raise TypeError(f"camera must be a Camera, a list of cameras or DeviceCameras, got {type(camera).__name__}")
    if batch and outputs is not None and (not isinstance(outputs, (list, tuple)) or len(outputs) != len(cameras)):
        raise ValueError(f"outputs= for a list of {len(cameras)} cameras must be a list of as many dicts (or None)")
    inputs = check_inputs(means, quats, scales, opacities, colors, settings)
    per_camera = outputs if batch and outputs is not None else [outputs] * len(cameras)
    per_camera = [_check_outputs(o, inputs, cam) for o, (cam, _) in zip(per_camera, cameras)]
    if workspace is None:
        # a one-off workspace; only "arc" reads the threshold (resolving may calibrate once)
        unused = FALLBACK_THRESHOLD if settings.reduce != "arc" or settings.threshold is not None else None
        workspace = Workspace(inputs.means.device, unused, replay=False)
    elif workspace.device != inputs.means.device:
        raise ValueError(f"workspace is on {workspace.device} but the inputs are on {inputs.means.device}")
    if isinstance(camera, DeviceCameras) and camera.viewmats.device != inputs.means.device:
        raise ValueError(f"DeviceCameras are on {camera.viewmats.device} but the inputs are on {inputs.means.device}")
    surfaces = check_surfaces(surface_colors, surface_depths, [(cam.height, cam.width) for cam, _ in cameras],
                              batch, inputs.means.device)
    outs = render_checked(inputs, cameras, settings, workspace, per_camera, surfaces=surfaces)
    if tape is None:
        tape = active_tape()
    if tape is not None and any(a.requires_grad for a in inputs.arrays + _surface_colors(surfaces)):
        for out in outs:
            tracked = [a for a in (out.color, out.alpha, out.depth, out.expected_depth, *inputs.arrays,
                                   *_surface_colors([out._images.surface])) if a.requires_grad]
            tape.record_func(lambda out=out: _tape_backward(out), tracked)
    return outs if batch else outs[0]


def _surface_colors(surfaces: list | None) -> tuple:
    """The colour arrays of ``surfaces`` (entries may be None)."""
    return tuple(s.colors for s in surfaces or () if s is not None)


def render_checked(inputs: GaussianInputs, cameras: list, settings: RenderSettings, workspace: Workspace,
                   per_camera: list, defer: bool = False, stream: wp.Stream | None = None,
                   surfaces: list | None = None) -> list[RenderOutput]:
    """The renders of :func:`render_gaussians` from arguments it has checked (also the
    torch bridge's entry, which checks its tensors itself): ``cameras`` as
    (Camera, None) or (DeviceCameras, index) pairs, ``per_camera`` one dict of valid
    output arrays by name per camera. All cameras are queued before the one wait that
    checks them (:func:`_settle`); with graphs, consecutive cameras with graph keys go
    through one ``Frame.replay`` (:func:`_replay_together`). A call that repeats one whose
    cameras all replayed kept graphs is repeated from its :class:`_RenderPlan`.

    ``defer``: if ``inputs`` are the workspace's previous call's (the same memory, shapes
    and settings: a training loop's steady state, whose kept sort size has 25% headroom over
    the same Gaussians' totals one step before), renders queued with the kept sort size
    are not waited for here; their checks run in :func:`settle_deferred`, which the
    caller runs after queueing their backward (the torch bridge does), and which this
    function runs first on every call (so it never returns before the checks of an
    earlier call's renders). Other inputs (new Gaussians, after a densification for
    instance, whose totals may jump) are checked here.

    ``stream``: the stream to queue on (None: the device's current stream). A call
    repeated from its plan launches its graphs there directly; anything else runs with
    it made the device's current stream (:class:`CurrentStream`).

    ``surfaces``: one checked :class:`Surface` per camera (``check_surfaces``), or None."""
    with workspace.busy:
        outs = _render_checked(inputs, cameras, settings, workspace, per_camera, defer,
                               CurrentStream(workspace.device, stream), surfaces)
        workspace.release_forward()  # the backward has scratch of its own
        return outs


def _render_checked(inputs: GaussianInputs, cameras: list, settings: RenderSettings, workspace: Workspace,
                    per_camera: list, defer: bool, on_stream: CurrentStream,
                    surfaces: list | None = None) -> list[RenderOutput]:
    """:func:`render_checked` inside ``workspace.busy``; ``on_stream`` makes its stream current."""
    if workspace.deferred:
        try:
            with on_stream:  # a render found overflowed is rendered again
                settle_deferred(workspace)
        except ValueError as e:
            raise ValueError(f"{e} (found in an earlier render on this workspace, whose checks were deferred to a "
                             "backward that did not run)") from e
    input_key = _input_key(inputs, settings) if workspace.graphs else None
    if defer:
        same = input_key if input_key is not None else (tuple(signature(a) for a in inputs.arrays), settings)
        defer, workspace.last_input_key = same == workspace.last_input_key, same
    else:
        workspace.last_input_key = None
    if workspace.capturing and not defer:
        raise RuntimeError(
            "arc_warp: a render inside a CUDA graph capture cannot wait for the device, so it must repeat the "
            "previous render on this workspace (the same input arrays and settings, inputs that require grad; "
            "arc_warp_torch: defer_checks on) to leave its checks for after the replays; run the captured step "
            "once, with the same tensors, before capturing it")
    for plan in workspace.render_plans if surfaces is None else ():  # plans hold no surfaces
        if plan.matches(input_key, cameras, settings, per_camera):
            outs = plan.repeat(inputs, settings, defer, on_stream)
            if outs is not None:
                return outs
    with on_stream:
        return _render_prepared(inputs, cameras, settings, workspace, per_camera, defer, input_key, surfaces)


def _render_prepared(inputs: GaussianInputs, cameras: list, settings: RenderSettings, workspace: Workspace,
                     per_camera: list, defer: bool, input_key, surfaces: list | None = None) -> list[RenderOutput]:
    """:func:`render_checked`'s renders prepared camera by camera (no plan repeats them)."""
    queued, batch, replayed = [], [], []
    # batched cameras are binned after all of them are counted, so each keeps its counts
    own_arena = input_key is not None and len(cameras) > 1

    def flush():
        prepared = [(frame, key, stages) for frame, _, key, stages, _ in batch]
        results = _replay_together("forward", prepared, FORWARD_GRAPHS)
        for (frame, targets, _, _, finish), result in zip(batch, results):
            out, pending = finish(result)
            workspace.release_with(out, frame)
            queued.append((out, pending, targets))
        if prepared:
            replayed.append(prepared)
        batch.clear()

    frames = [workspace.acquire() for _ in cameras]
    workspace.restore(frames)  # their memory handed back after earlier backwards, in one block
    for i, ((cam, index), targets, frame) in enumerate(zip(cameras, per_camera, frames)):
        key, stages, finish = _prepare_forward(inputs, cam, index, settings, frame, targets, input_key, own_arena,
                                               surface=None if surfaces is None else surfaces[i])
        if key is not None:
            batch.append((frame, targets, key, stages, finish))
            continue
        flush()  # queued in camera order, so the last pending render is the last queued
        out, pending = finish(None)
        workspace.release_with(out, frame)
        queued.append((out, pending, targets))
    flush()
    _settle(queued, workspace, defer)
    if len(replayed) == 1 and len(replayed[0]) == len(cameras) and surfaces is None:
        _RenderPlan.keep(workspace, input_key, cameras, settings, per_camera, replayed[0], queued)
    return [out for out, _, _ in queued]


class _RenderPlan:
    """A render call (every camera's render through kept graphs, ``FORWARD_GRAPHS``) kept to be repeated:
    the same inputs, cameras, settings and output arrays, on frames that are free again,
    with the workspace's buffers and kept sort sizes unchanged. Repeating it launches the
    graphs, copies the outputs of the call that made it and settles them (one wait, the
    totals checked as always), without preparing anything: a training step's render
    spends most of its host time in that preparation."""

    __slots__ = ("workspace", "input_key", "cameras", "settings", "per_camera", "frames", "graphs", "allocations",
                 "sizes", "outputs", "pending")

    @classmethod
    def keep(cls, workspace, input_key, cameras, settings, per_camera, prepared, queued) -> None:
        """Keep the call that just queued ``prepared`` (its cameras' (frame, key, stages))
        and ``queued`` ((output, pending, targets) per camera), if its graph is kept."""
        frames = [frame for frame, _, _ in prepared]
        graphs = [frames[0].kept_graph(_together_key("forward", prepared, group))
                  for group in range(len(FORWARD_GRAPHS))]
        if None in graphs:
            return  # queued without graphs (its first time): nothing to repeat yet
        plan = cls()
        plan.workspace, plan.input_key, plan.settings = workspace, input_key, settings
        plan.cameras, plan.per_camera = list(cameras), list(per_camera)
        # the graph's buffers stay where they are while no buffer is allocated
        plan.frames, plan.graphs, plan.allocations = frames, graphs, workspace.allocations
        # copies (the originals release their frames), without this call's inputs: a repeat
        # sets its own (the backward reads their .grad through them, in the Warp API); made
        # before any backward, so their means2d_grad is still to be made (zeroed) per render
        plan.outputs = [replaced(out, _inputs=None) for out, _, _ in queued]
        plan.pending = [pending for _, pending, _ in queued]
        plan.sizes = [(p.grid, p.sort_size) for p in plan.pending]
        plans = workspace.render_plans
        plans[:] = [p for p in plans
                    if not (p.frames == frames and p.matches(input_key, cameras, settings, per_camera))]
        plans.insert(0, plan)
        del plans[RENDER_PLANS:]

    def matches(self, input_key, cameras, settings, per_camera) -> bool:
        """Whether a call with these arguments repeats this one (inputs by pointers and
        shapes, cameras by identity, output arrays by identity)."""
        return (input_key == self.input_key and (settings is self.settings or settings == self.settings)
                and len(cameras) == len(self.cameras)
                and all(cam is kept[0] and index == kept[1] for (cam, index), kept in zip(cameras, self.cameras))
                and per_camera == self.per_camera)

    def repeat(self, inputs: GaussianInputs, settings: RenderSettings, defer: bool,
               on_stream: CurrentStream) -> list[RenderOutput] | None:
        """The call's outputs for ``inputs`` (those of :meth:`matches`), queued on
        ``on_stream``'s stream and settled again (or their checks deferred,
        ``render_checked``'s ``defer``); None if it cannot be repeated (a frame is leased,
        the workspace allocated, a kept sort size changed): the caller then prepares the
        call as usual."""
        workspace = self.workspace
        if not workspace.is_free(self.frames):
            return None
        workspace.restore(self.frames)  # memory handed back after their last backward (Workspace.allocator)
        if workspace.allocations != self.allocations or any(workspace.sort_size(grid) != size
                                                             for grid, size in self.sizes):
            return None
        for graph in self.graphs:
            self.frames[0].launch_graph(graph, on_stream.stream)
        workspace.lease(self.frames)
        queued = []
        for kept, frame, pending, targets in zip(self.outputs, self.frames, self.pending, self.per_camera):
            # its n_isects is this render's (the sort size until settled)
            out = replaced(kept, _bins=replaced(kept._bins, n_isects=pending.sort_size), _inputs=inputs,
                           settings=settings)
            _track_images(out)
            workspace.release_with(out, frame)
            queued.append((out, pending, targets))
        if defer:
            _settle(queued, workspace, defer)
        else:
            with on_stream:  # an overflowed render is rendered again
                _settle(queued, workspace)
        return [out for out, _, _ in queued]


def _input_key(inputs: GaussianInputs, settings: RenderSettings) -> GraphKey:
    """The part of a render's graph key that its inputs and settings fix, made once per
    (inputs, settings) pair: the torch bridge passes the same ``inputs`` object for the same
    memory, so a training step reuses it (a wp.array's pointer and shape never change)."""
    cached = inputs.graph_key
    if cached is not None and cached[0] is settings:
        return cached[1]
    key = GraphKey((tuple(signature(a) for a in inputs.arrays), inputs.sh_coeffs, settings))
    inputs.graph_key = (settings, key)
    return key


# The forward's stages (`_prepare_forward`) by graph: the projection alone, so the device
# starts on a small graph's launch while the host launches the rest, which the
# projection's device time covers (one graph started the device 6-12 us later: BENCHMARKS.md)
FORWARD_GRAPHS = ((0,), (1, 2))


def _replay_together(kind: str, prepared: list, graphs: tuple = ((0,),)) -> list:
    """Queues the (frame, key, stages) of C renders (or backwards) and returns their
    results. ``stages`` are callables run through the render's frame, each given the
    previous one's result (the first None); every render has as many. Stage by stage:
    all renders' first stages, then all second ones, so the forward's one wait (recorded
    at the end of each count stage) ends once every camera is counted, not after the
    sorts and rasterisers of the cameras before the last. ``graphs`` groups consecutive
    stage indices; each group of them all is one ``Frame.replay`` on the first frame,
    keyed by the group and all their keys and frames (each frame's buffers are baked
    into the graph; frames live as long as their workspace, so their ids are never
    reused): C renders cost a graph launch per group, not C of them and C lookups. The
    frames' memory must be back (``Workspace.restore``: the callers restore up front)."""
    if not prepared:
        return []
    frame = prepared[0][0]
    results = [None] * len(prepared)
    for group, stages in enumerate(graphs):
        def queue(stages=stages, results=results):
            for stage in stages:
                results = [queued[stage](result) for (_, _, queued), result in zip(prepared, results)]
            return results

        results = frame.replay(_together_key(kind, prepared, group), queue)
    return results


def _together_key(kind: str, prepared: list, group: int):
    """The ``Frame.replay`` key of graph ``group`` of :func:`_replay_together`'s renders
    (or backwards)."""
    if len(prepared) == 1:
        return kind, group, prepared[0][1]
    return GraphKey((kind, group, tuple(key for _, key, _ in prepared), tuple(id(frame) for frame, _, _ in prepared)))


def _camera_args(workspace: Workspace, camera: Camera) -> wp.array:
    """``camera_params(camera)`` on the workspace's device, made once per Camera object."""
    cached = workspace.camera_args.get(id(camera))
    if cached is None:
        if len(workspace.camera_args) >= 256:  # bounded: a loop making new cameras
            workspace.camera_args.clear()
        cached = workspace.camera_args[id(camera)] = (camera, camera_params(camera, workspace.device))
    return cached[1]


def _check_outputs(outputs, inputs: GaussianInputs, camera: Camera) -> dict:
    """Validated caller-owned output arrays by name (see ``render_gaussians``)."""
    if outputs is None:
        return {}
    if not isinstance(outputs, dict):
        raise TypeError(f"outputs must be a dict of wp.arrays by name, got {type(outputs).__name__}")
    wanted = {name: (dtype, 2, (camera.height, camera.width)) for name, dtype in IMAGE_OUTPUTS.items()}
    wanted["means2d"] = (wp.vec2, 1, (inputs.count,))
    wanted["radii"] = (wp.vec2i, 1, (inputs.count,))
    for name, array in outputs.items():
        if name not in wanted:
            raise ValueError(f"outputs: unknown name {name!r}; expected some of {sorted(wanted)}")
        check_array(array, f"outputs[{name!r}]", *wanted[name], inputs.means.device)
    return outputs


class _Pending(NamedTuple):
    """A render queued with a kept sort size, for :func:`_settle` to check."""

    host_flags: np.ndarray  # host copy of the render's flags (slot 0: intersection total)
    event: wp.Event | None  # recorded after the copy (None on the CPU)
    sort_size: int  # the size the sort was queued with
    grid: tuple[int, int]  # (tiles_x, tiles_y) of the image, whose kept sort size the total updates


def _read_total(flags: np.ndarray, workspace: Workspace, grid: tuple[int, int]) -> int:
    """The intersection total from a render's flags, once the copy has landed: raises on
    bad inputs and records the total for the workspace's kept sort size."""
    flags = flags.tolist()  # python ints: cheaper to test than numpy scalars
    raise_on_flags(flags)
    total = flags[0]
    workspace.observe_total(grid, total)
    return total


def _render_exact(inputs: GaussianInputs, camera: Camera | DeviceCameras, index: int | None,
                  settings: RenderSettings, frame: Frame, outputs: dict, surface=None) -> RenderOutput:
    """One camera's render queued kernel by kernel, its sort sized by the total read back
    first (see :func:`_prepare_forward`)."""
    _, _, finish = _prepare_forward(inputs, camera, index, settings, frame, outputs, None, exact=True,
                                    surface=surface)
    return finish(None)[0]


def _prepare_forward(inputs: GaussianInputs, camera: Camera | DeviceCameras, index: int | None,
                     settings: RenderSettings, frame: Frame, outputs: dict, input_key, own_arena: bool = False,
                     exact: bool = False, surface=None):
    """One camera's render (camera ``index`` of ``DeviceCameras``, or a Camera), prepared
    but not queued: ``(key, stages, finish)``.

    The intersection sort is sized by the workspace's kept capacity without waiting for
    the device, or (``exact``, or no capacity yet) by reading the total back first.
    With a kept capacity and graphs, ``key`` is not None: ``stages`` are three
    callables for :func:`_replay_together` (CUDA graphs once the same arguments repeat,
    grouped by ``FORWARD_GRAPHS``), each given the previous one's result: the projection
    and colours (a small first graph, which the device starts on while the host launches
    the rest), the depth sort and count through the flags copy and the event the host
    waits on, and the tile sort through the rasteriser; ``finish(the last one's
    result)`` makes the output. ``own_arena``: the counts and depth order go to
    ``frame``'s own scratch arena, not the shared one, so the first stages of several
    renders can run before their later ones.
    Otherwise ``finish(None)`` queues the render kernel by kernel. ``input_key`` is the
    part of the graph keys common to all cameras (None: no graphs). ``finish`` returns
    the output and, for a render queued with a kept size, what :func:`_settle` checks
    once all cameras are queued. Nothing is queued before a stage or ``finish`` runs.
    ``surface``: a checked :class:`Surface` composited behind the Gaussians, or None."""
    grid = tile_grid(camera.width, camera.height)
    workspace = frame._workspace
    n = inputs.count
    shape = (camera.height, camera.width)

    def output(name, shape, dtype):
        given = outputs.get(name)
        return frame.array(name, shape, dtype) if given is None else given

    images_out = {name: output(name, shape, dtype) for name, dtype in IMAGE_OUTPUTS.items()}
    means2d, radii = output("means2d", n, wp.vec2), output("radii", n, wp.vec2i)
    cam = None if index is not None else _camera_args(workspace, camera)
    sort_size = None if exact or n == 0 else workspace.sort_size(grid)
    if sort_size is None and n > 0 and workspace.capturing:
        raise RuntimeError(
            f"arc_warp: a render of a {camera.width}x{camera.height} image inside a CUDA graph capture, a size this "
            "workspace has not rendered before, would have to wait for the device to size its sort; run the "
            "captured step once before capturing it")
    key = None
    if sort_size is not None and input_key is not None:
        # everything the queued work reads or writes outside the workspace's buffers
        if index is None:
            camera_key = signature(cam)
        else:
            camera_key = (signature(camera.viewmats), signature(camera.intrinsics), index, camera.width,
                          camera.height, camera.near, camera.far)
        key = GraphKey((input_key, camera_key, sort_size, tuple(signature(a) for a in images_out.values()),
                        signature(means2d), signature(radii), own_arena,
                        None if surface is None else (signature(surface.colors), signature(surface.depths))))

    def queue_projected(_):
        flags = frame.array("flags", 1 + len(BAD_SLOTS), wp.int32, zero=True)
        params = cam if index is None else device_camera_params(camera, index, flags, frame)
        arena = frame if own_arena else None
        proj = project(inputs, params, settings, *grid, flags, frame, means2d, radii, arena)
        if n > 0:
            compute_colors(inputs, params, proj, flags, frame)  # flags bad colours before the readback
        if surface is not None:
            flag_surface(surface, flags, frame)
        return params, _unbound(proj, inputs), flags

    def queue_counted(projected):
        params, proj, flags = projected
        depth = count_intersections(bound(proj), flags, frame)
        host_flags = frame.host_array("host_flags", flags.shape[0], wp.int32)
        wp.copy(host_flags, flags)
        if event is not None:  # always on CUDA, where graphs run
            # external: recorded into a graph when captured (the host waits on it)
            frame.device.stream.record_event(event, external=key is not None)
        return params, proj, depth, host_flags

    def bound(proj):
        """``proj`` with this call's arrays (outputs, plain RGB inputs) put back."""
        return replaced(proj, means2d=means2d, radii=radii, rgb=inputs.colors if inputs.sh_coeffs == 0 else proj.rgb)

    def queue_raster(proj, depth, sort_size):
        if n > 0:
            # buffers for the size later renders will sort, so those allocate nothing
            reserve = workspace.sort_size(grid) or 0
            bins = sort_intersections(proj, depth, sort_size, *grid, frame, reserve, frame if own_arena else None)
        else:
            bins = BinResult(*grid, 0, frame.capacity("sort_ids", 0, wp.int32),
                             frame.array("tile_ranges", grid[0] * grid[1], wp.vec2i, zero=True))
        images = rasterize(proj, bins, camera.width, camera.height, settings.background, frame, images_out, surface)
        means2d_absgrad = frame.array("means2d_absgrad", n, wp.vec2, zero=True) if settings.absgrad else None
        return bins, replaced(images, **dict.fromkeys(IMAGE_OUTPUTS)), means2d_absgrad

    event = frame.event() if n > 0 else None

    def queue_rastered(counted):
        params, proj, depth, host_flags = counted
        return params, proj, host_flags, queue_raster(bound(proj), depth, sort_size)

    def finish(replayed):
        pending = None
        if replayed is not None:
            params, proj, host_flags, rastered = replayed
            proj = bound(proj)
            pending = _Pending(frame.host_numpy(host_flags), event, sort_size, grid)
        else:
            size = sort_size
            if n > 0:
                params, proj, depth, host_flags = queue_counted(queue_projected(None))
                if size is None:
                    if event is not None:
                        wp.synchronize_event(event)  # the one host sync of this render
                    size = _read_total(frame.host_numpy(host_flags), workspace, grid)
                else:
                    pending = _Pending(frame.host_numpy(host_flags), event, size, grid)
            else:
                params, proj, flags = queue_projected(None)
                if surface is not None:  # no total to wait for, but the surface's checks
                    raise_on_flags(flags.numpy())
                depth = None
            proj = bound(proj)
            rastered = queue_raster(proj, depth, size)
        bins, images, means2d_absgrad = rastered
        bins = replaced(bins)  # its n_isects is this render's
        images = replaced(images, **images_out, surface=surface)
        out = RenderOutput(
            color=images.color,
            alpha=images.alpha,
            depth=images.depth,
            expected_depth=images.expected_depth,
            means2d=means2d,
            radii=radii,
            camera=camera,
            settings=settings,
            means2d_absgrad=means2d_absgrad,
            camera_index=index,
            _inputs=inputs,
            _cam=params,
            _project=proj,
            _bins=bins,
            _images=images,
            _frame=frame,
            _key=key,
        )
        _track_images(out)
        return out, pending

    return key, (queue_projected, queue_counted, queue_rastered) if key is not None else None, finish


def _track_images(out: RenderOutput) -> None:
    """Images of a render of inputs (or surface colours) that require grad require grad too
    (wp.Tape records them)."""
    if any(a.requires_grad for a in out._inputs.arrays + _surface_colors([out._images.surface])):
        for img in (out.color, out.alpha, out.depth, out.expected_depth):
            img.requires_grad = True


def _unbound(proj: ProjectResult, inputs: GaussianInputs) -> ProjectResult:
    """``proj`` without the arrays a replayed render passes in again (outputs and plain RGB
    inputs), so a kept graph result holds only workspace buffers."""
    return replaced(proj, means2d=None, radii=None, rgb=None if inputs.sh_coeffs == 0 else proj.rgb)


def _settle(queued: list, workspace: Workspace, defer: bool = False, wait: bool = True) -> list[RenderOutput]:
    """Checks the renders queued without a sync, after all of them are queued: one wait for
    the last flags copy (work on one stream is ordered, so the earlier copies are done
    too; the device meanwhile runs the queued sorts and rasterisers), then per render the
    input flags (ValueError) and the intersection total. A total over the sort size it was
    queued with re-renders that camera with the total read back first (rare: the kept size
    has 25% headroom over recent totals); otherwise the exact total replaces the size.
    Returns the outputs re-rendered. ``queued`` holds (output, pending, targets) per render;
    an output of None (collected before a deferred check) only has its flags and total
    checked. ``defer`` keeps them for :func:`settle_deferred` instead. ``wait`` False: the
    device has finished them already, and nothing may wait for it or queue work now (see
    :func:`settle_deferred`)."""
    pending = [p for _, p, _ in queued if p is not None]
    if not pending:
        return []
    if defer:
        workspace.deferred.extend((weakref.ref(out), p, targets) for out, p, targets in queued if p is not None)
        return []
    if wait and pending[-1].event is not None:
        wp.synchronize_event(pending[-1].event)
    redone = []
    for out, p, targets in queued:
        if p is None:
            continue
        total = _read_total(p.host_flags, workspace, p.grid)
        if out is None:
            continue
        if total > p.sort_size:
            if not wait:
                raise RuntimeError(
                    f"arc_warp: a render before the capture had {total} tile intersections, more than the "
                    f"{p.sort_size} its sort held, and it cannot be rendered again inside the capture; run the "
                    "step once more, with its backward, before capturing it")
            exact = _render_exact(out._inputs, out.camera, out.camera_index, out.settings, out._frame, targets,
                                  out._images.surface)
            for field in dataclasses.fields(RenderOutput):
                setattr(out, field.name, getattr(exact, field.name))
            redone.append(out)
        else:
            out._bins.n_isects = total
    return redone


def settle_deferred(workspace: Workspace, wait: bool = True) -> list[RenderOutput]:
    """Runs the checks of the renders queued with ``render_checked(defer=True)`` whose checks
    have not run yet, as :func:`_settle` would have run them in the call (a ValueError for
    bad inputs; a render that overflowed its kept sort size is rendered again, exactly,
    into the same arrays, with a RuntimeWarning: whatever read its images before, a
    loss for instance, saw the farthest Gaussians of some tiles left out). The wait is
    for the flags copy of the last of them, normally long done. Returns the outputs
    re-rendered (a backward queued before for one of them must be run again).

    ``wait`` False, where the caller knows the device has finished every render (a CUDA
    graph capture that began with a device sync, as ``torch.cuda.graph`` does), reads the
    flags without waiting for the device, which a capture forbids, and raises
    RuntimeError for a render that overflowed, which it cannot render again."""
    if not workspace.deferred or workspace.capturing:  # captured: checked after replays (CapturedRenders)
        return []
    with workspace.busy:  # a re-render queues work through the frames
        entries, workspace.deferred = workspace.deferred, []
        redone = _settle([(ref(), p, targets) for ref, p, targets in entries], workspace, wait=wait)
    if redone:
        warnings.warn(
            f"arc_warp: {len(redone)} render(s) queued with the kept intersection capacity overflowed it (the "
            "intersections grew by over 25% since the last renders); they were rendered again exactly when "
            "checked, after their images had been handed out: a loss computed from them saw the farthest "
            "Gaussians of some tiles left out. RenderContext(defer_checks=False) checks every render before "
            "it returns.", RuntimeWarning, stacklevel=2)
    return redone


def leave_images(workspace: Workspace, outs: list[RenderOutput], names=tuple(IMAGE_OUTPUTS)) -> None:
    """The deferred checks of ``outs`` (renders queued with ``render_checked(defer=True)``)
    re-render them, if they must, into their frames' own images of ``names`` (default:
    all four) instead of the caller's image arrays, which the caller no longer holds (the
    torch bridge does not keep a render's colour and depth images alive for its backward,
    which does not read them); their other outputs still go to the caller's arrays."""
    workspace.deferred = [
        (ref, p, {k: v for k, v in targets.items() if k not in names}
         if any(ref() is out for out in outs) else targets)
        for ref, p, targets in workspace.deferred]


def _grads_into(frame: Frame, inputs: GaussianInputs, own_grads: bool, zero: bool = True) -> GaussianGrads:
    """Where the backward puts the input gradients: with ``own_grads``, each input's
    ``.grad`` where it requires grad; everywhere else a buffer of ``frame``, zeroed with
    ``zero``."""
    names = (f.name for f in dataclasses.fields(GaussianGrads))
    return GaussianGrads(*(
        a.grad if own_grads and a.requires_grad else frame.array(f"grad_{name}", a.shape, a.dtype, zero=zero)
        for name, a in zip(names, inputs.arrays)
    ))


def _tape_backward(out: RenderOutput):
    """Tape callback: output .grad -> input .grad (scratch for inputs without one)."""
    grads = _grads_into(out._frame, out._inputs, own_grads=True)
    surface = out._images.surface
    render_gaussians_backward(
        out, out.color.grad, out.alpha.grad, out.depth.grad, out.expected_depth.grad, grads=grads,
        grad_surface_colors=surface.colors.grad if surface is not None and surface.colors.requires_grad else None,
    )


def render_gaussians_backward(
    out: RenderOutput,
    grad_color: wp.array | None,  # (H, W) wp.vec3, dL/dcolor
    grad_alpha: wp.array | None = None,  # (H, W) float
    grad_depth: wp.array | None = None,  # (H, W) float
    grad_expected_depth: wp.array | None = None,  # (H, W) float
    grads: GaussianGrads | None = None,
    accumulate: bool = True,
    means2d_grad: wp.array | None = None,  # (N,) wp.vec2
    grad_surface_colors: wp.array | None = None,  # (H, W) wp.vec3, dL/d(surface colour) added into
) -> GaussianGrads:
    """Gradients of a scalar loss w.r.t. the inputs of the render that made ``out``.

    ``grad_*`` are cotangents shaped like the outputs, on the same device; ``None``
    means zero. The rasteriser backward runs one 256-thread block per tile and reduces
    the per-Gaussian gradients with the accumulator of ``out.settings.reduce``
    (``"floor"`` yields no rasteriser gradients: benchmarking only). Then the SH
    backward, one thread per coefficient row (coefficients, and means via the view
    direction: each Gaussian's row shares summed with the same accumulator), and one
    per-Gaussian kernel through the projection (means, quats via the normalisation,
    scales, opacities). Plain RGB colours, and SH under ``"deterministic"``, take their
    colour backward inside the per-Gaussian kernel. The 2D mean gradients are added into
    ``out.means2d_grad`` and, with ``settings.absgrad``, their per-pixel absolute sums into
    ``out.means2d_absgrad``.

    ``accumulate`` False writes the gradients into ``grads`` (every entry: culled
    Gaussians and SH coefficients past ``settings.sh_degree`` get 0) instead of adding
    them, so ``grads`` need not be zeroed first; it also writes the 2D mean gradients
    (and ``means2d_absgrad``). Without ``grads`` the gradients are always written into
    fresh workspace buffers. ``means2d_grad``, if given, receives the 2D mean gradients
    in place of ``out.means2d_grad``. ``grad_surface_colors``, for a render with a surface,
    gets the surface colours' gradient added (``T_final * dL/dcolor`` where the surface
    depth is below +inf); None: not computed.

    Returns:
        :class:`GaussianGrads` shaped like the inputs: buffers of the render's workspace
        (valid while ``out`` is alive), or ``grads``
        (which must match the inputs) with the gradients added in (or written).
    """
    if not isinstance(out, RenderOutput) or out._inputs is None:
        raise TypeError(f"out must be a RenderOutput returned by render_gaussians, got {type(out).__name__}")
    inputs = out._inputs
    device = inputs.means.device
    shape = out.alpha.shape

    def cotangent(value, name, dtype):
        return None if value is None else check_array(value, name, dtype, 2, shape, device)

    v_color = cotangent(grad_color, "grad_color", wp.vec3)
    v_alpha = cotangent(grad_alpha, "grad_alpha", wp.float32)
    v_depth = cotangent(grad_depth, "grad_depth", wp.float32)
    v_expected = cotangent(grad_expected_depth, "grad_expected_depth", wp.float32)
    if grads is None:
        grads = _grads_into(out._frame, inputs, own_grads=False, zero=False)
        accumulate = False
    else:
        check_grads(grads, inputs)
    if means2d_grad is not None:
        check_array(means2d_grad, "means2d_grad", wp.vec2, 1, (inputs.count,), device)
    if grad_surface_colors is not None:
        if out._images.surface is None:
            raise ValueError("grad_surface_colors: this render had no surface (render_gaussians(surface_colors=))")
        check_array(grad_surface_colors, "grad_surface_colors", wp.vec3, 2, shape, device)
    backwards_checked([out], [(v_color, v_alpha, v_depth, v_expected)], grads, accumulate, [means2d_grad],
                      surface_grads=[grad_surface_colors])
    return grads


def backwards_checked(outs: list[RenderOutput], cotangents: list[tuple], grads: GaussianGrads, accumulate: bool,
                      means2d_grads: list, means2d: bool = True, surface_grads: list | None = None) -> None:
    """:func:`render_gaussians_backward` of the C renders of one call from arguments it
    has checked (also the torch bridge's entry), in order, into one ``grads`` matching the
    inputs: the first adds with ``accumulate`` (or writes), the others add.
    ``cotangents`` holds per render (color, alpha, depth, expected_depth), each shaped
    like the render's images or None (zero); ``means2d_grads`` per render an (N,) wp.vec2
    or None (``out.means2d_grad``); ``means2d`` False: no 2D mean gradients are written
    (nobody reads them; ``means2d_grads`` is then ignored). With graphs, consecutive
    backwards with graph keys go through one ``Frame.replay`` (:func:`_replay_together`).
    ``surface_grads``: per render an (H, W) wp.vec3 that its surface colours' gradient is
    added into, or None (the default for all)."""
    if outs:
        with outs[0]._frame._workspace.busy:
            _backwards_checked(outs, cotangents, grads, accumulate, means2d_grads, means2d,
                               surface_grads or [None] * len(outs))


def _backwards_checked(outs: list[RenderOutput], cotangents: list[tuple], grads: GaussianGrads, accumulate: bool,
                       means2d_grads: list, means2d: bool, surface_grads: list) -> None:
    """:func:`backwards_checked` inside its workspace's ``busy``."""
    # memory handed back comes back before any graph key is taken (a buffer that moved
    # changes the allocation count) or capture (Frame.restore allocates), as a render call
    # restores its frames up front; the backward's scratch, not the forward's arena
    outs[0]._frame._workspace.restore([out._frame for out in outs], forward=False)
    batch = []
    for i, (out, cot, means2d_grad, surface_grad) in enumerate(zip(outs, cotangents, means2d_grads, surface_grads)):
        frame, key, queue = _prepare_backward(out, *cot, grads, accumulate or i > 0, means2d_grad, means2d,
                                              surface_grad)
        if key is not None:
            batch.append((frame, key, (queue,)))
            continue
        _replay_together("backward", batch)
        batch.clear()
        queue(None)
    _replay_together("backward", batch)


def _prepare_backward(out: RenderOutput, v_color: wp.array | None, v_alpha: wp.array | None,
                      v_depth: wp.array | None, v_expected: wp.array | None, grads: GaussianGrads,
                      accumulate: bool, means2d_grad: wp.array | None, means2d: bool = True,
                      grad_surface_colors: wp.array | None = None) -> tuple:
    """One render's backward (arguments as :func:`backwards_checked`, one render's),
    prepared but not queued: ``(frame, key, queue)``; ``queue(None)`` queues it, for a ``Frame.replay`` by
    ``key`` unless ``key`` is None (no graphs, or ``"deterministic"``, which reads the
    exact total)."""
    inputs = out._inputs
    frame = out._frame
    if inputs.count == 0 and grad_surface_colors is None:
        return frame, None, lambda _: None
    if not means2d:
        means2d_grad = None
    elif means2d_grad is None:
        means2d_grad = out.means2d_grad
    settings = out.settings
    # resolved when the workspace was made, never here (no lazy calibration in a step)
    threshold = settings.threshold if settings.threshold is not None else frame._workspace.threshold
    key = None
    if out._key is not None and settings.reduce != "deterministic":  # deterministic reads the exact total
        # a render without intersections skips the rasteriser backward (raster_backward)
        # looked up by the arrays themselves before their signatures are made (an array
        # object keeps its pointer and shape, and a training step passes the same ones)
        parts = (out._key, out._bins.n_isects == 0, threshold, accumulate, v_color, v_alpha, v_depth, v_expected,
                 grads.means, grads.quats, grads.scales, grads.opacities, grads.colors, means2d_grad,
                 out.means2d_absgrad, grad_surface_colors)
        keys = frame._workspace.backward_keys
        key = keys.get(parts)
        if key is None:
            if len(keys) >= 256:  # bounded: it holds the arrays
                keys.clear()
            key = keys[parts] = GraphKey((*parts[:4], *(signature(a) for a in parts[4:])))

    # what the queued work uses of ``out``, not ``out`` itself: a kept queue must not keep
    # the output (and so its frame) alive
    cam, proj, bins, images, absgrad = out._cam, out._project, out._bins, out._images, out.means2d_absgrad

    def queue_backward(_):
        # a backward that writes dL/dmeans holds the SH stage's share of it there, not in
        # scratch held with the gradients (project_backward reads it before writing)
        raster_grads = raster_backward(
            proj, bins, images, settings.background, v_color, v_alpha, v_depth, v_expected,
            settings.reduce, settings.absgrad, threshold, frame, share_room=accumulate,
            grad_surface_colors=grad_surface_colors,
        )
        if inputs.count == 0:
            return  # the surface colours' gradient alone
        sh_v_means = color_backward(inputs, cam, proj, raster_grads, settings.absgrad, grads.colors,
                                    settings.reduce, threshold, frame, accumulate,
                                    None if accumulate else grads.means)
        project_backward(inputs, cam, proj, raster_grads, settings, grads, means2d_grad, absgrad, frame, accumulate,
                         sh_v_means)

    return frame, key, queue_backward
