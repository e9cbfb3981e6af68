"""GaussianRenderer: N Gaussians into C cameras of one image size, with buffers and prepared
launches made once, and RenderState, what one forward leaves for its backward.

Per camera (ARCHITECTURE.md: A splat render): projection, SH colours, a depth sort and a
scan of the tile counts, then the tile keys written front to back into a sort of
``capacity`` entries sorted stably by tile alone (each tile's range in depth order, ties in
Gaussian order, as a sort of ``tile << 32 | depth`` keys would give, in ~log2(tiles) radix
bits), and the rasteriser per 16x16 tile. CPU launches of kernels with block storage hold
``cpu_launch_guard`` (their CPU block storage is C static).

The overflow rule. The sort holds ``capacity`` entries per camera, set by the first forward
(one wait for the totals) to :meth:`GaussianRenderer.capacity_for` the largest total. Every
forward writes each camera's total, input checks and overflow flag (total > capacity) to
``RenderStatus.flags`` and copies them to the host, which reads them in the forward itself
with ``check`` (the default on the CPU, where nothing waits: bad inputs raise ValueError, an
overflowed camera is rendered again, grown), else (CUDA; always in a graph capture) at the
start of the next forward: bad inputs raise there, an overflow grows the capacity with a
RuntimeWarning. Until then the overflow is a device flag, which
``SparseGaussianAdam.step(skip=status)`` reads to skip its update (as torch's GradScaler
does) and ``RenderStatus.check()`` raises for on request: no loss on an image that lacks
Gaussians is used without the caller being able to know it first.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import warp as wp
import warp.utils

from arc_warp._src.arc.calibrate import FALLBACK_THRESHOLD, resolve_threshold
from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.arc.scatter_ops import ordered_scatter_add, ordered_scatter_parts
from arc_warp._src.camera import CAMERA_MODELS, Camera, DeviceCameras
from arc_warp._src.launches import Bindings, Launches, View, ptr
from arc_warp._src.splat.bin_kernels import (STAGED_KEYS_PER_GAUSSIAN, gather_counts, store_total, tile_ranges,
                                             write_keys, write_keys_staged)
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS, TILE_SIZE, CameraParams, Splat2D, grad_vector
from arc_warp._src.splat.project_kernels import camera_from_matrices, make_project_bwd, make_project_fwd
from arc_warp._src.splat.raster_kernels import make_raster_bwd, make_raster_fwd
from arc_warp._src.splat.records import GaussianGrads, Gaussians, ImageGrads, RenderImages, RenderSettings, Surface
from arc_warp._src.splat.sh_kernels import make_sh_bwd, make_sh_fwd
from arc_warp._src.splat.status import RenderStatus
from arc_warp._src.splat.validate_kernels import BAD_SLOTS, FLAG_SLOTS, OVERFLOW_SLOT, flag_nan, flag_nonfinite
from arc_warp._src.validate import check_array

SORT_SLACK = 4096  # entries added to every capacity (capacity_for), so small scenes rarely overflow
ALIGN = 256  # byte alignment of each part carved from one allocation
MAX_ISECTS = (2**31 - 1) // 2  # radix_sort_pairs needs keys of 2 x count entries; a Warp array holds < 2^31
MAX_TILES = (2**31 - 1) // BLOCK_PIXELS  # rasteriser thread ids (one per tile-grid pixel) and tile keys in int32
WRITE_KEYS_BLOCK = 256  # write_keys_staged's block, whose threads stage their keys in shared memory together
SH_BWD_BLOCK = 256  # the SH backward's block: whole warps reach the accumulator (CPU: wp.config.enable_cpu_blocks)
CAMERA_RECORD = CameraParams.numpy_dtype()  # numpy's layout of one CameraParams (made once: it parses)
SLOT = {name: 1 + i for i, name in enumerate(BAD_SLOTS)}  # the flag slot of each input check


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """Number of 16x16 tiles along x and y; ValueError past ``MAX_TILES`` (about 2^31 pixels)."""
    tiles_x, tiles_y = (width + TILE_SIZE - 1) // TILE_SIZE, (height + TILE_SIZE - 1) // TILE_SIZE
    if tiles_x * tiles_y > MAX_TILES:
        raise ValueError(
            f"render_gaussians: a {width}x{height} image has {tiles_x * tiles_y} tiles of {TILE_SIZE}x{TILE_SIZE}, "
            f"more than the {MAX_TILES} one render can index; render it in crops")
    return tiles_x, tiles_y


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


class _Block:
    """Typed views of ``parts`` ((shape, dtype) each, ``ALIGN``-aligned) carved from one
    allocation of ``allocator(nbytes) -> (pointer, owner)``, whose caller keeps ``owner``
    alive (torch frees a render's memory once its backward is done; the views come from
    ``renderer.bound``), or of a Warp array (None), which each view keeps alive."""

    def __init__(self, renderer: GaussianRenderer, parts: list[tuple], allocator=None):
        offsets, total = [], 0
        for shape, dtype in parts:
            offsets.append(total)
            total += -(-wp.types.type_size_in_bytes(dtype) * math.prod(shape) // ALIGN) * ALIGN

        def views():  # base: set below
            return [wp.array(ptr=base + offset, dtype=dtype, shape=shape, device=renderer.device)
                    for offset, (shape, dtype) in zip(offsets, parts)]

        if allocator is None:  # 16-byte elements: a byte array stops at 2 GiB (Warp's int32 shapes)
            self.owner = wp.empty(max(-(-total // 16), 1), dtype=wp.vec4i, device=renderer.device)
            base = self.owner.ptr
            self.views = views()
            for view in self.views:
                view._ref = self.owner
        else:
            base, self.owner = allocator(max(total, 1))
            self.views = renderer.bound(("block", base, tuple(parts)), views)


class _CameraState:
    """One camera's part of a :class:`RenderState` (views into its allocations)."""

    __slots__ = ("cam", "splats", "rgb", "ranges", "final_t", "last_ids", "absgrad", "sort_ids")

    def __init__(self, cam, splats, rgb, ranges, final_t, last_ids, absgrad):
        self.cam, self.splats, self.rgb, self.ranges = cam, splats, rgb, ranges
        self.final_t, self.last_ids, self.absgrad, self.sort_ids = final_t, last_ids, absgrad, None


class RenderState:
    """What one :meth:`GaussianRenderer.forward` of C cameras leaves for its backward, made by
    :meth:`GaussianRenderer.new_state` from ``allocator`` (whose caller keeps ``owners`` alive
    while the backward may run). Per camera: its ``CameraParams``, the projected splats, the
    SH colours, the sorted Gaussian ids and tile ranges, the final transmittance and last
    contributor per pixel, and with ``settings.absgrad`` the (N,) vec2 absolute 2D mean
    gradients the backward adds. ``gaussians``, ``images``, ``status``: the forward's."""

    def __init__(self, renderer: GaussianRenderer, allocator=None):
        n, c, shape = renderer.num_gaussians, renderer.num_cameras, (renderer.height, renderer.width)
        self.renderer, self.num_gaussians, self.allocator = renderer, n, allocator
        sh, absgrad = renderer.sh_coeffs > 0, renderer.settings.absgrad
        per_camera = [((1,), CameraParams), ((n,), Splat2D), ((n if sh else 0,), wp.vec3),
                      ((renderer.tiles_x * renderer.tiles_y,), wp.vec2i), (shape, wp.float32), (shape, wp.int32),
                      ((n if absgrad else 0,), wp.vec2)]
        block = _Block(renderer, per_camera * c, allocator)
        self.owners = [block.owner]

        def parts():  # each camera's _CameraState, all cameras' (C,) CameraParams (evenly spaced), their CPU records
            k, views = len(per_camera), block.views
            cameras = [_CameraState(*views[i:i + k - 1], views[i + k - 1] if absgrad else None)
                       for i in range(0, len(views), k)]
            first, last = cameras[0].cam, cameras[-1].cam
            cams = first if c == 1 else wp.array(ptr=first.ptr, dtype=CameraParams, shape=(c,),
                                                 strides=((last.ptr - first.ptr) // (c - 1),), device=renderer.device)
            return cameras, cams, cams.numpy() if renderer.device.is_cpu else None

        self.cameras, self.cams, self.cam_records = parts() if allocator is None else \
            renderer.bound(("camera parts", block.views[0].ptr, n, c, sh, absgrad), parts)
        self.capacity = 0
        self.pinhole_only = False  # the forward's cameras were all plain pinholes (its kernel variant)
        self.gaussians = self.images = self.status = self.surfaces = None  # the forward's

    def sort_room(self, capacity: int) -> None:
        """Each camera's sorted ids made to hold a sort of ``capacity`` (2 x capacity int32)."""
        if capacity <= self.capacity:
            return
        block = _Block(self.renderer, [((2 * capacity,), wp.int32)] * len(self.cameras), self.allocator)
        self.owners.append(block.owner)
        for cs, ids in zip(self.cameras, block.views):
            cs.sort_ids = ids
        self.capacity = capacity

    @property
    def means2d_absgrad(self) -> wp.array | None:
        """Camera 0's (N,) vec2 absolute 2D mean gradients (``settings.absgrad``), or None."""
        return self.cameras[0].absgrad


class GaussianRenderer:
    """Renders N Gaussians into C cameras of one H x W size (the conventions of
    :func:`arc_warp.render_gaussians`), with its buffers and prepared launches made once.
    What a forward leaves for its backward lives in a :class:`RenderState` the caller
    holds, so several renders can wait for their backwards.

    Args:
        width, height: image size in pixels.
        gaussians: N (change it with :meth:`resize`); cameras: C, the cameras of one forward.
        sh_coeffs: coefficients evaluated per Gaussian, (degree + 1)^2, or 0 for RGB.
        settings, device: a :class:`RenderSettings` and a Warp device (None: the defaults).
        threshold: the ARC threshold when ``settings.threshold`` is None (None: the device's
            calibrated one, resolved here, never inside a step).
        capacity: tile intersections per camera the sort holds (None: measured by the first
            forward; the module notes: the overflow rule).
        allocator: ``nbytes -> (pointer, owner)``, stream-ordered on the stream the work runs
            on, for each call's scratch (torch's caching allocator); None: the renderer's own.
        record: prepare launches for reuse (False for a renderer used once).
    """

    def __init__(self, width: int, height: int, gaussians: int, cameras: int = 1, sh_coeffs: int = 0,
                 settings: RenderSettings | None = None, device=None, threshold: int | None = None,
                 capacity: int | None = None, allocator=None, record: bool = True):
        for name, value in (("width", width), ("height", height), ("cameras", cameras)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GaussianRenderer: {name} must be an int >= 1, got {value!r}")
        if sh_coeffs not in (0, 1, 4, 9, 16):
            raise ValueError(f"GaussianRenderer: sh_coeffs must be 0 (RGB) or (degree + 1)^2, got {sh_coeffs!r}")
        self.settings = RenderSettings() if settings is None else settings
        if not isinstance(self.settings, RenderSettings):
            raise TypeError(f"settings must be a RenderSettings, got {type(settings).__name__}")
        self.device = wp.get_device(device)
        self.width, self.height, self.num_cameras, self.sh_coeffs = width, height, cameras, sh_coeffs
        self.tiles_x, self.tiles_y = tile_grid(width, height)
        if self.settings.threshold is not None:
            self.threshold = self.settings.threshold
        elif threshold is None and self.settings.reduce != "arc":
            self.threshold = FALLBACK_THRESHOLD  # only "arc" reads it: no calibration
        else:
            self.threshold = resolve_threshold(self.device, threshold)
        self.allocator = allocator
        self._launches = Launches(self.device, record)
        # the last forward's device flags, and their host copy (pinned; on the CPU the flags)
        self._flags = wp.zeros((cameras, FLAG_SLOTS), dtype=wp.int32, device=self.device)
        self._host_flags = (self._flags if self.device.is_cpu else
                            wp.zeros((cameras, FLAG_SLOTS), dtype=wp.int32, device="cpu", pinned=True))
        self._host = self._host_flags.numpy()
        self._event = wp.Event(self.device) if self.device.is_cuda else None
        # host cameras' records on their way to the device, and an event after their last copy
        self._staging = wp.empty(cameras, dtype=CameraParams, device="cpu", pinned=self.device.is_cuda)
        self._staged_records = self._staging.numpy()
        self._staged = wp.Event(self.device) if self.device.is_cuda else None
        self._pending: RenderStatus | None = None  # the last forward's status, unread
        self._bindings = Bindings(self._launches)  # views and plans by memory: see bound() and _run()
        self._capture = None  # the stream plans are captured on (CUDA)
        self._forward_scratch = self._backward_scratch = None  # owned scratch (no allocator)
        self.capturing = False  # set by arc_warp_torch.capture.CapturedStep: no waits, no growth
        self.resize(gaussians, capacity)  # sets num_gaussians and capacity

    def resize(self, gaussians: int, capacity: int | None = None) -> None:
        """Render ``gaussians`` (N) from now on (after a densification, say). The capacity
        is set to ``capacity``, or measured again by the next forward (None): new Gaussians'
        intersections may differ a lot from the old ones'."""
        if isinstance(gaussians, bool) or not isinstance(gaussians, int) or gaussians < 0:
            raise ValueError(f"GaussianRenderer: gaussians must be an int >= 0, got {gaussians!r}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"GaussianRenderer: capacity must be None or an int >= 1, got {capacity!r}")
        self.num_gaussians, self.capacity = gaussians, capacity

    @staticmethod
    def capacity_for(total: int) -> int:
        """The sort capacity for ``total`` tile intersections per camera (the module notes):
        1.25x plus ``SORT_SLACK``, so the totals of the next steps rarely outgrow it."""
        return total * 5 // 4 + SORT_SLACK

    def new_state(self, allocator=None) -> RenderState:
        """A :class:`RenderState` for one forward (memory from ``allocator``, or Warp arrays)."""
        return RenderState(self, allocator)

    def bound(self, key: tuple, make):
        """What ``make()`` builds of the memory ``key`` names (Warp views, say), made once per
        memory (:meth:`Bindings.bound`). The caller keeps the memory alive while it uses them."""
        return self._bindings.bound(key, make)

    def forward(self, gaussians: Gaussians, cameras, state: RenderState, images: RenderImages,
                check: bool | None = None, surfaces: list[Surface] | None = None) -> RenderStatus:
        """Renders ``gaussians`` into each camera of ``cameras`` (C :class:`Camera`, or
        :class:`DeviceCameras` of C), writing ``images`` and ``state``; ``surfaces``: None or one
        :class:`Surface` per camera. ``check``: read the status before returning (None: where it
        costs no wait, the CPU), after the previous forward's, if unread (the module notes: the
        overflow rule). Returns the render's :class:`RenderStatus` (also ``state.status``)."""
        self._check_call(gaussians, cameras, state, images, surfaces)
        pending, self._pending = self._pending, None
        self._settle(pending)
        check = self.device.is_cpu if check is None else check
        if self.capturing:
            check = False
            if self.capacity is None:
                raise RuntimeError(
                    "GaussianRenderer: a render inside a CUDA graph capture cannot wait for the device to size its "
                    "sort; run the captured step once before capturing it")
            if self.device.is_cuda and not isinstance(cameras, DeviceCameras):
                raise RuntimeError(
                    "GaussianRenderer: host cameras inside a CUDA graph capture would be copied from memory the "
                    "replays no longer hold; pass DeviceCameras (arc_warp_torch: viewmats and Ks on the GPU)")
        state.gaussians, state.images, state.surfaces = gaussians, images, surfaces
        state.pinhole_only = is_plain_pinhole(cameras)
        device_cameras = isinstance(cameras, DeviceCameras)
        if not device_cameras:  # host values, new each call: written outside any plan
            self._write_cameras(cameras, state)

        def body(views, measure: bool = False):
            self._launches.call(self._flags.zero_)
            if device_cameras:
                self._write_cameras(cameras, state)
            self._render(state, views, range(self.num_cameras), measure)

        if self.capacity is None:  # measured: the totals read back (a first forward's one wait)
            measuring = self._scratch(False)  # held until the work is queued
            body(measuring.views, measure=True)
            measured = self._status()
            measured.check_inputs()
            self._grow(max(measured.totals), lambda: int(measuring.views[2][-1:].numpy()[0]))
        scratch = self._scratch(False)  # held until the work is queued (an allocator's memory)
        state.sort_room(self.capacity)
        cameras_key = ((cameras.viewmats.ptr, cameras.intrinsics.ptr, ptr(cameras.distortion), cameras.model)
                       if device_cameras else None)
        key = ("forward", self.capacity, state.pinhole_only, cameras_key, *(a.ptr for a in gaussians.arrays),
               *(a.ptr for a in images.planes[0]), state.cams.ptr, state.cameras[0].sort_ids.ptr, scratch.views[0].ptr,
               *(p for surface in surfaces or () for p in (surface.colors.ptr, surface.depths.ptr)))
        self._run(key, lambda: body(scratch.views))
        status = state.status = self._status()
        if check:
            self._settle(status, state)
        else:
            self._pending = status
        return status

    def _check_call(self, gaussians: Gaussians, cameras, state: RenderState, images: RenderImages,
                    surfaces: list[Surface] | None) -> None:
        """TypeError/ValueError, before anything is queued, for arguments this renderer was
        not made for."""
        if not isinstance(gaussians, Gaussians):
            raise TypeError(f"gaussians must be arc_warp.Gaussians (check_gaussians), got {type(gaussians).__name__}")
        if gaussians.count != self.num_gaussians or gaussians.sh_coeffs != self.sh_coeffs:
            raise ValueError(
                f"GaussianRenderer: made for {self.num_gaussians} Gaussians with {self.sh_coeffs} SH coefficients, "
                f"got {gaussians.count} with {gaussians.sh_coeffs}; resize() it, or use another renderer")
        if gaussians.device != self.device:
            raise ValueError(f"GaussianRenderer is on {self.device}, the Gaussians on {gaussians.device}")
        if not isinstance(state, RenderState) or state.renderer is not self or state.num_gaussians != gaussians.count:
            raise ValueError("state must be a RenderState of this renderer, made since its last resize "
                             "(GaussianRenderer.new_state)")
        if isinstance(cameras, DeviceCameras):
            size, count = (cameras.width, cameras.height), len(cameras)
            if cameras.viewmats.device != self.device:
                raise ValueError(f"DeviceCameras are on {cameras.viewmats.device}, the renderer on {self.device}")
        else:
            for i, cam in enumerate(cameras):
                if not isinstance(cam, Camera):
                    raise TypeError(f"cameras[{i}] must be a Camera, got {type(cam).__name__}")
            size, count = {(cam.width, cam.height) for cam in cameras}, len(cameras)
            size = size.pop() if len(size) == 1 else size
        if count != self.num_cameras or size != (self.width, self.height):
            raise ValueError(f"GaussianRenderer: made for {self.num_cameras} camera(s) of {self.width}x{self.height}, "
                             f"got {count} of {size}")
        c, h, w, n = self.num_cameras, self.height, self.width, self.num_gaussians
        for name, dtype, shapes in (("color", wp.vec3, [(c, h, w)]), ("alpha", wp.float32, [(c, h, w)]),
                                    ("depth", wp.float32, [(c, h, w), (c, 0, 0)]),
                                    ("expected_depth", wp.float32, [(c, h, w), (c, 0, 0)]),
                                    ("means2d", wp.vec2, [(c, n)]), ("radii", wp.vec2i, [(c, n)])):
            a = getattr(images, name)
            if not (isinstance(a, wp.array) and a.dtype is dtype and a.shape in shapes and a.is_contiguous
                    and a.device == self.device):  # the common case first: a call's host time
                check_array(a, f"images.{name}", dtype, a.ndim if isinstance(a, wp.array) else 0, None, self.device)
                raise ValueError(f"images.{name} must have shape {' or '.join(map(str, shapes))}, got {a.shape}")
        if surfaces is not None:
            if len(surfaces) != c or not all(isinstance(s, Surface) for s in surfaces):
                raise ValueError(f"surfaces: expected one Surface per camera ({c}), got {surfaces!r}")
            for i, surface in enumerate(surfaces):
                check_array(surface.colors, f"surfaces[{i}].colors", wp.vec3, 2, (h, w), self.device)
                check_array(surface.depths, f"surfaces[{i}].depths", wp.float32, 2, (h, w), self.device)

    def _scratch(self, backward: bool, n: int | None = None, capacity: int | None = None) -> _Block:
        """This call's scratch, owned and grown or fresh from the allocator: the forward's
        (tile counts, depth order, int64 scan, then keys the depth sort and the tile sort
        use in turn) or the backward's (packed rasteriser gradients, the SH share of
        dL/dmeans, and for ``deterministic`` ``capacity`` per-entry partials and the scratch
        of their ordered sum, ``ordered_scatter_parts``)."""
        n = self.num_gaussians if n is None else n
        cap = (self.capacity or 0) if capacity is None else capacity
        if backward:
            grad_t = grad_vector(self.settings.absgrad)
            det = self.settings.reduce == "deterministic"
            cap = cap if det else 0
            parts = [((n,), grad_t), ((n,), wp.vec3), ((cap,), grad_t), *ordered_scatter_parts(cap, n if det else 0)]
        else:
            parts = [((n,), wp.int32), ((2 * n,), wp.int32), ((n,), wp.int64), ((2 * max(n, cap),), wp.int32)]
        if self.allocator is not None:  # the caller holds the block until its work is queued
            return _Block(self, parts, self.allocator)
        attr = "_backward_scratch" if backward else "_forward_scratch"
        block = getattr(self, attr)
        if block is None or any(v.shape != shape for v, (shape, _) in zip(block.views, parts)):
            block = _Block(self, parts)
            setattr(self, attr, block)
        return block

    def _write_cameras(self, cameras, state: RenderState) -> None:
        """``state.cams`` from ``cameras``: device cameras by a kernel (an invalid one sets
        its flags), host values in place on the CPU, through the pinned staging records on CUDA."""
        if isinstance(cameras, DeviceCameras):
            for c in range(len(cameras)):
                self._launches.launch(camera_from_matrices, 1, [
                    cameras.viewmats, cameras.intrinsics, c, cameras.width, cameras.height, float(cameras.near),
                    float(cameras.far), CAMERA_MODELS.index(cameras.model), cameras.distortion, state.cams[c:c + 1],
                    self._flags[c], SLOT["cameras"], SLOT["camera distortion"]], key=("camera", c))
        elif state.cam_records is not None:
            camera_params(cameras, state.cam_records)
        else:  # once the previous copy has read the staging records (a step ago)
            wp.synchronize_event(self._staged)
            camera_params(cameras, self._staged_records)
            wp.copy(state.cams, self._staging)
            self.device.stream.record_event(self._staged)

    def _render(self, state: RenderState, scratch, cameras, measure: bool = False) -> None:
        """Queues the renders of ``cameras`` (indices) through the shared scratch. Per camera:
        projection, colours, depth sort and tile-count scan (its flags get the total, saturated
        at 2^31 - 1, and whether it passed the capacity), the tile sort, a copy of its flags to
        the host (the event follows the last copy) and the rasteriser; ``measure``: only up to
        the total (counted without a capacity) and that copy."""
        tiles_per_gauss, order, cum_tiles, keys = scratch
        g, s, cap, launches = state.gaussians, self.settings, self.capacity, self._launches
        n = g.count
        tx, ty, n_tiles = self.tiles_x, self.tiles_y, self.tiles_x * self.tiles_y
        for c in cameras:
            cs, flags = state.cameras[c], self._flags[c]
            color, alpha, depth, expected_depth, means2d, radii = state.images.planes[c]
            surface = None if state.surfaces is None else state.surfaces[c]
            if cs.absgrad is not None:
                launches.call(cs.absgrad.zero_)  # backwards add into it
            if surface is not None and not measure:
                pixels = self.height * self.width
                launches.launch(flag_nonfinite, 3 * pixels, [View(surface.colors, wp.float32, (3 * pixels,)), flags,
                                                             SLOT["surface_colors"]], key=("surface_colors", c))
                launches.launch(flag_nan, pixels, [View(surface.depths, wp.float32, (pixels,)), flags,
                                                   SLOT["surface_depths (NaN)"]], key=("surface_depths", c))
            launches.launch(make_project_fwd(s.antialiased, s.scale_activation, s.opacity_activation,
                                             state.pinhole_only), n, [
                g.means, g.quats, g.scales, g.opacities, cs.cam, s.eps2d, tx, ty, means2d, cs.splats, radii,
                tiles_per_gauss, keys, order, flags], key=("project", c))
            if n:
                if g.sh_coeffs:
                    launches.launch(make_sh_fwd(g.sh_coeffs, g.colors.shape[1]), n, [
                        g.means, g.coeff_rows, radii, cs.cam, SLOT["colors"], cs.rgb, flags], key=("sh_fwd", c))
                else:  # plain RGB is used as-is: one flat check pass
                    launches.launch(flag_nonfinite, 3 * n, [View(g.colors, wp.float32, (3 * n,)), flags,
                                                            SLOT["colors"]], key=("flag_colors", c))
                # stable: equal depths keep index order; the positive keys need 31 bits
                launches.call(wp.utils.radix_sort_pairs, keys, order, n, 0, 31)
                launches.launch(gather_counts, n, [order, tiles_per_gauss, cum_tiles], key=("gather_counts", c))
                launches.call(wp.utils.array_scan, cum_tiles, cum_tiles, inclusive=True)  # in place (cub, CPU allow it)
                launches.launch(store_total, 1, [cum_tiles, 2**31 - 1 if measure else cap, flags, OVERFLOW_SLOT],
                                key=("store_total", c))
            if n and not measure:
                # past the total: the filler tile n_tiles; past the capacity: dropped (flagged)
                args = [order, cs.splats, radii, tiles_per_gauss, cum_tiles, tx, ty, cap, keys, cs.sort_ids]
                if cap > STAGED_KEYS_PER_GAUSSIAN * n:  # large splats: through shared memory
                    with cpu_launch_guard(self.device):  # block barriers: whole blocks, CPU statics
                        launches.launch(write_keys_staged, -(-n // WRITE_KEYS_BLOCK) * WRITE_KEYS_BLOCK, args,
                                        block_dim=WRITE_KEYS_BLOCK, key=("write_keys_staged", c))
                else:
                    launches.launch(write_keys, n, args, key=("write_keys", c))
                launches.call(wp.utils.radix_sort_pairs, keys, cs.sort_ids, cap, 0, n_tiles.bit_length())
                launches.launch(tile_ranges, n_tiles + 1, [keys, cap, cs.ranges], key=("tile_ranges", c))
            elif not measure:
                launches.call(cs.ranges.zero_)
            if self._host_flags is not self._flags:
                launches.call(wp.copy, self._host_flags, self._flags, dest_offset=c * FLAG_SLOTS,
                              src_offset=c * FLAG_SLOTS, count=FLAG_SLOTS)
            if c == cameras[-1]:
                launches.call(self._record_event)
            if measure:
                continue
            with cpu_launch_guard(self.device):
                launches.launch(make_raster_fwd(surface is not None), n_tiles * BLOCK_PIXELS, [
                    cs.sort_ids, cs.ranges, cs.splats, cs.rgb if g.sh_coeffs else g.colors, self.width, self.height,
                    tx, wp.vec3(*s.background), None if surface is None else surface.colors,
                    None if surface is None else surface.depths, color, alpha, depth, expected_depth, cs.final_t,
                    cs.last_ids], block_dim=BLOCK_PIXELS, key=("raster_fwd", c))

    def _record_event(self) -> None:
        """The event after the flags' host copies (a node of the graph, inside one)."""
        if self._event is not None:
            self.device.stream.record_event(self._event, external=self.device.is_capturing)

    def _status(self) -> RenderStatus:
        """The status of the forward just queued (read without a wait inside a capture)."""
        return RenderStatus(self._flags, self._host, None if self.capturing else self._event, self.capacity or 0)

    def _run(self, key: tuple, body) -> None:
        """``body()`` through the bindings (:meth:`Bindings.run`: a plan from the second call on
        ``key``'s memory; on CUDA a graph, unless the caller's capture records this one)."""
        direct = self.capturing or self.device.is_cpu  # no graph of its own
        if not direct and self._capture is None:  # the stream plans are captured on (made on first use)
            self._capture = wp.Stream(self.device)
        self._bindings.run(key, body, None if direct else self._capture)

    def _settle(self, status: RenderStatus | None, state: RenderState | None = None) -> None:
        """Reads ``status`` (None: nothing to read) now: ValueError for bad inputs; cameras that
        overflowed (rare: 25% headroom) grow the capacity and are rendered again into ``state``.
        Without a state, ``status`` is the previous forward's (read without a wait inside a
        capture, which began synchronised) and an overflow is reported with a RuntimeWarning."""
        if status is None:
            return
        if state is None and self.capturing:
            status._event = None
        status.check_inputs(note=" (found in the previous render on this renderer, whose checks ran now)"
                            if state is None else "")
        over = status.overflowed
        if not over:
            return
        self._grow(max(status.totals))
        if state is None:
            warnings.warn(
                f"arc_warp: the previous render's camera(s) {over} had more tile intersections than the "
                f"{status.capacity} its sort held, so their images left out the farthest Gaussians of some tiles "
                f"(status.overflowed; SparseGaussianAdam.step(skip=status) skips such a step); renders sort "
                f"{self.capacity} from now on", RuntimeWarning, stacklevel=3)
            return
        state.sort_room(self.capacity)
        scratch = self._scratch(False)
        for c in over:
            self._flags[c].zero_()
        self._render(state, scratch.views, over)
        redone = self._status()
        redone.check_inputs()
        merged = status.read().copy()
        merged[over] = redone.read()[over]
        status._values, status.capacity = merged, self.capacity

    def _grow(self, total: int, exact_total=None) -> None:
        """A capacity that holds ``total`` intersections with the usual headroom; ValueError
        past ``MAX_ISECTS`` (``exact_total()`` reads the int64 total for the message)."""
        if total > MAX_ISECTS:
            raise ValueError(
                f"render_gaussians: {self.num_gaussians} Gaussians on a {16 * self.tiles_x}x{16 * self.tiles_y}-pixel "
                f"image ({self.tiles_x}x{self.tiles_y} tiles) make {total if exact_total is None else exact_total()} "
                f"tile intersections, more than the {MAX_ISECTS} one sort can hold; render fewer or smaller Gaussians, "
                "or the image in crops")
        self.capacity = max(self.capacity or 0, self.capacity_for(total))

    def host_status(self, capacity: int | None = None) -> RenderStatus:
        """The status the host copy of the flags holds now, read without a wait: for a caller
        synchronised with the last render, as after a CUDA graph replay (whose sorts held
        ``capacity``; default: the current one)."""
        status = RenderStatus(self._flags, self._host, None, self.capacity if capacity is None else capacity)
        status.read()
        return status

    def backward(self, state: RenderState, cotangents: list[ImageGrads | None], grads: GaussianGrads,
                 accumulate: bool = False, means2d_grads: list[wp.array | None] | None = None,
                 grad_surface_colors: list[wp.array | None] | None = None) -> None:
        """Gradients of a scalar loss w.r.t. the inputs of the forward that filled ``state``.

        ``cotangents``: one :class:`ImageGrads` per camera (None: not differentiated). The first
        camera differentiated writes ``grads`` (every entry) or, with ``accumulate``, adds into
        them; the others add. ``means2d_grads``: per camera an (N,) vec2 that receives dL/dmeans2d
        in pixels (written), or None. With ``settings.absgrad`` each ``state.cameras[c].absgrad``
        receives the per-pixel absolute sums (written). ``grad_surface_colors``: per camera with a
        surface, an (H, W) wp.vec3 that ``T_final * dL/dcolor`` is added into, or None.
        ``deterministic`` waits for the forward's totals (ARCHITECTURE.md: Determinism)."""
        g = state.gaussians
        if g is None:
            raise ValueError("GaussianRenderer.backward: the state holds no forward (run forward first)")
        if len(cotangents) != self.num_cameras:
            raise ValueError(f"cotangents: expected {self.num_cameras} entries (one per camera), got {len(cotangents)}")
        means2d_grads = means2d_grads or [None] * self.num_cameras
        s, launches, n = self.settings, self._launches, g.count
        det = s.reduce == "deterministic"
        totals = state.status.totals if (det or state.status.is_read) else None
        # sized by the state's render (the renderer may have been resized since); held until queued
        scratch = self._scratch(True, n, state.status.capacity)
        raster_grads, sh_share, entry_grads, *ordered = scratch.views
        surfaces = state.surfaces or [None] * self.num_cameras
        surface_grads = grad_surface_colors or [None] * self.num_cameras
        # no rasteriser backward for a camera without intersections (once known) and surface
        rastered = [cot is not None and ((n and (totals is None or totals[c] > 0)) or surfaces[c] is not None)
                    for c, cot in enumerate(cotangents)]
        key = ("backward", accumulate, tuple(rastered), tuple(totals) if det else None, state.cams.ptr,
               state.cameras[0].sort_ids.ptr, scratch.views[0].ptr, *(a.ptr for a in (*g.arrays, *grads.arrays)),
               *(ptr(a) for cot in cotangents for a in (vars(cot).values() if cot is not None else (None,))),
               *(ptr(a) for a in means2d_grads), *(ptr(a) for a in surface_grads),
               *(ptr(s.colors) for s in surfaces if s is not None))
        # the SH backward as a kernel of its own, its shares summed with the accumulator
        sh_apart = g.sh_coeffs > 0 and not det

        def body():
            first = next((c for c, cot in enumerate(cotangents) if cot is not None), None)  # writes unless accumulate
            for c, cot in enumerate(cotangents):
                if cot is None:
                    continue
                cs, surface = state.cameras[c], surfaces[c]
                _, _, depth, _, _, radii = state.images.planes[c]
                launches.call(raster_grads.zero_)
                rgb = cs.rgb if g.sh_coeffs else g.colors
                if rastered[c]:
                    if det:
                        launches.call(entry_grads.zero_)
                    isects = min(totals[c], state.status.capacity) if det else 0
                    with cpu_launch_guard(self.device):
                        launches.launch(make_raster_bwd(s.reduce, s.absgrad, surface=surface is not None),
                                        self.tiles_x * self.tiles_y * BLOCK_PIXELS, [
                            cs.sort_ids, cs.ranges, cs.splats, rgb, self.width, self.height, self.tiles_x,
                            wp.vec3(*s.background), None if surface is None else surface.colors,
                            None if surface is None else surface.depths, cs.final_t, cs.last_ids, depth, cot.color,
                            cot.alpha, cot.depth, cot.expected_depth, self.threshold,
                            entry_grads if isects > 0 else raster_grads, surface_grads[c]],
                            block_dim=BLOCK_PIXELS, key=("raster_bwd", c))
                    if isects > 0:
                        launches.call(ordered_scatter_add, raster_grads, cs.sort_ids[:isects], entry_grads[:isects],
                                      ordered)
                add = accumulate or c != first
                if add and not accumulate:  # this camera's own outputs are written, but the kernel adds
                    for own in (means2d_grads[c], cs.absgrad):
                        if own is not None:
                            launches.call(own.zero_)
                # a backward that writes dL/dmeans holds the SH share there (read before it is written)
                share = sh_share if add else grads.means
                if sh_apart:
                    # threads per Gaussian: the power of two covering the rows written (all stored when
                    # overwriting), so for up to 32 rows a warp's lanes hold whole Gaussians
                    lanes = 1 << (max(g.sh_coeffs if add else g.colors.shape[1], 1) - 1).bit_length()
                    if g.sh_coeffs > 1:
                        launches.call(share.zero_)
                    with cpu_launch_guard(self.device):
                        launches.launch(make_sh_bwd(g.sh_coeffs, lanes, s.absgrad, s.reduce, not add),
                                        -(-n * lanes // SH_BWD_BLOCK) * SH_BWD_BLOCK,
                                        [g.means, g.colors, cs.cam, radii, rgb, raster_grads, self.threshold,
                                         grads.colors, share], block_dim=SH_BWD_BLOCK, key=("sh_bwd", c))
                # the projection's and colour stage's shares (w.r.t. the raw log-scales / logits
                # with the activations), written or added, 0 for culled Gaussians
                launches.launch(make_project_bwd(g.sh_coeffs, s.absgrad, s.antialiased, not add, sh_apart,
                                                 s.scale_activation, s.opacity_activation,
                                                 means2d_grads[c] is not None, state.pinhole_only), n, [
                    g.means, g.quats, g.scales, g.colors, g.opacities, cs.cam, s.eps2d, radii, cs.splats, rgb,
                    raster_grads, grads.means, grads.quats, grads.scales, grads.opacities, grads.colors,
                    means2d_grads[c], cs.absgrad, share if sh_apart else None], key=("project_bwd", c))

        self._run(key, body)
