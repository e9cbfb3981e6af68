"""The torch.autograd bridge: C cameras through `arc_warp.render_gaussians` in one node.

Tensors cross into Warp without copies (`wp.from_torch` / `wp.to_torch`) and every Warp
launch runs on torch's current stream of the tensors' device, so torch and Warp work stays
ordered without synchronisation. Callers (`rasterization`, `GaussianRasterizer`) validate
and convert their inputs first; this module assumes float32, contiguous, same-device tensors.
"""

import contextlib
import dataclasses
import functools
import math
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch
import warp as wp

from arc_warp import Camera, DeviceCameras, GaussianGrads, RenderSettings, Workspace
from arc_warp._src.splat.render import backwards_checked, leave_images, render_checked, settle_deferred
from arc_warp._src.splat.workspace import CurrentStream
from arc_warp._src.splat.validate import check_inputs

_NO_SCOPE = contextlib.nullcontext()  # reusable: entering it does nothing


class RenderContext:
    """What the bridge keeps across calls on one torch device (explicit state, no globals).

    - a :class:`arc_warp.Workspace`: repeated renders of one N and image size allocate
      no Warp arrays, and the ARC threshold is resolved (calibrated if needed) here, at
      creation, never inside a training step; once a render's backward has run (without
      retain_graph), its outputs' frame serves the next render even while its image is
      still referenced, so a training loop holds one frame, not two (`_finished`), and
      the aliases of the radii and projected means it saved for the backward are freed
      with its other saved tensors;
    - one ``wp.Stream`` per torch CUDA stream, made on first use of that stream
      (`warp_stream`), made Warp's current stream for the bridge's calls (`stream`), or
      handed to the core (a render repeated from its plan launches its graphs on it),
      so Warp launches on torch's current stream;
    - on CUDA, Warp's pool release threshold, set here when this context is made:
      ``pool_release_fraction`` of device memory stays pooled across the per-step sync
      (CUDA's default 0 hands every freed block back at each sync, so each step would
      re-allocate from the driver, as torch's caching allocator avoids). Applied only
      if the pool is still at CUDA's default; ``None`` leaves it alone;
    - ``graphs``: on CUDA, a render or backward repeated with the same tensors (the same
      memory, as torch's caching allocator hands out in a steady training loop) replays
      as a CUDA graph (see :class:`arc_warp.Workspace`); False launches kernel by kernel.
      With graphs, the tensors a render returns (images, radii, projected means) come
      from a private torch memory pool (`outputs`), so from step to step they reuse the
      same few blocks whatever else the loop allocates, and the graphs keep matching.

    - ``defer_checks`` (default: on CUDA): a render whose inputs require grad and are the
      same tensors (the same memory) as the previous render's, as in a training loop
      between densifications, does not wait for the device. Its checks, which read the
      device's flags (bad inputs, and whether the intersections fit the sort size kept
      from earlier renders), run in its backward, after the backward is queued, so the
      host never blocks in a training step and queues the next work while the device
      runs. A bad input then raises the forward's ValueError from ``loss.backward()``; a
      render that overflowed the kept size (its intersections grew by over 25% since the
      last renders) is rendered again exactly (into its images if the caller still holds
      them: the context does not keep them for the backward) and its backward redone,
      with a RuntimeWarning, since the loss saw the first image (the farthest Gaussians
      of some tiles left out). A render whose backward never runs is checked at the start
      of the next render. New tensors (a new N, another scene), renders without grad and
      ``reduce="deterministic"`` are checked before the render returns, as with
      ``defer_checks=False``.

    - ``release_workspace`` (default: on CUDA): the workspace's buffers come from torch's
      caching allocator (``arc_warp.Workspace``'s ``allocator``), and once a render's
      backward can no longer run (torch freed its saved tensors: after a backward without
      retain_graph, or when the render is dropped), its frame's and the shared render
      scratch's memory goes back to torch (blocks of 4 MiB or more), so the optimizer step
      that follows can use it: a training step's peak is that of its larger phase, not
      their sum. The next render takes it back as one block per frame. A steady loop gets
      the same addresses back after a few steps, so its CUDA graphs replay; where torch
      hands out other addresses (after a densification, say), the renders of the same
      key launch kernel by kernel until a graph of the new addresses is captured. False
      keeps the buffers in Warp's pool for the context's life.

    ``rasterization`` and ``GaussianRasterizer`` take ``context=``; ``None`` uses
    :func:`default_context` of the tensors' device.
    """

    def __init__(self, device, threshold: Optional[int] = None,
                 pool_release_fraction: Optional[float] = 0.5, graphs: bool = True,
                 defer_checks: Optional[bool] = None, release_workspace: Optional[bool] = None):
        wp.init()
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.defer_checks = self.device.type == "cuda" if defer_checks is None else bool(defer_checks)
        wdev = wp.device_from_torch(self.device)
        if (pool_release_fraction is not None and wdev.is_cuda and wdev.is_mempool_supported
                and wp.get_mempool_release_threshold(wdev) == 0):
            wp.set_mempool_release_threshold(wdev, pool_release_fraction)
        release = self.device.type == "cuda" if release_workspace is None else bool(release_workspace)
        self.workspace = Workspace(wdev, threshold, graphs=graphs, allocator=self._allocate if release else None)
        self._pool = torch.cuda.MemPool() if self.workspace.graphs else None
        self._pool_scope = _PoolScope(self) if self._pool is not None else None
        self._wdevice = wdev
        self._streams = {}  # torch CUDA stream handle -> wp.Stream
        self._torch_views = {}  # (pointer, shape, dtype) of a workspace array -> torch tensor
        self._memo = {}  # (kind, pointers, shapes, ...) -> checked views (see `_memoized`)
        self._device_cameras = {}  # (pointers, C, size, planes) -> DeviceCameras (see `device_cameras`)
        # (viewmats, Ks, what they were, DeviceCameras) of the last call (rasterization's `_cameras`)
        self.last_cameras = None
        self._settings = {}  # option values -> RenderSettings (see `settings`)
        # rasterization's call key -> what its checks made of such a call (`keep_checked_call`)
        self.checked_calls = {}
        self._pooling = False  # inside `outputs()`
        self.cameras = {}  # host camera values and image size -> arc_warp.Camera (bounded)
        self._intrinsics = {}  # (fx, fy, cx, cy) -> [1, 3, 3] device K (bounded)
        self.captured = None  # the CapturedStep whose graph holds this context's buffers (capture.py)

    def _allocate(self, nbytes: int):
        """The workspace's allocator (``release_workspace``): ``nbytes`` of torch memory on
        this device and torch's current stream, as (pointer, the tensor holding it)."""
        t = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return t.data_ptr(), t

    def keep_checked_call(self, key: tuple, checked: tuple) -> None:
        """Keep what `rasterization` made of a call's arguments (SH degree, cameras,
        settings, whether gradients are needed) by ``key``: a call whose tensors (memory,
        shape, dtype, requires_grad, contiguity) and options are the same passes
        the same checks, so a training step skips them (`rasterization`'s `_call_key`)."""
        if len(self.checked_calls) >= 64:  # bounded: pointers of freed memory pile up
            self.checked_calls.clear()
        self.checked_calls[key] = checked

    def camera(self, fx, fy, cx, cy, width, height, world_to_camera, near, far) -> Camera:
        """The Camera of these values, made (and validated) once: a training loop revisits
        the same views, and the workspace caches per Camera what kernels need of it."""
        key = (fx, fy, cx, cy, width, height, world_to_camera.tobytes(), near, far)
        cam = self.cameras.get(key)
        if cam is None:
            if len(self.cameras) >= 1024:
                self.cameras.clear()
            cam = self.cameras[key] = Camera(fx, fy, cx, cy, width, height,
                                             world_to_camera=world_to_camera, near=near, far=far)
        return cam

    def view(self, t: torch.Tensor, dtype) -> wp.array:
        """Zero-copy Warp view of a float32/int32 contiguous tensor whose last axis packs
        `dtype` (a vector type), whose last two axes pack it (a matrix type), or not (a
        scalar type).

        The view does NOT keep `t` alive: the caller keeps `t` alive while Warp uses it
        (torch saves what the backward reads). Owning views (`wp.from_torch`) held by
        the autograd context would make a cycle through the outputs' grad_fn that
        garbage collection cannot break, pinning every step's buffers. Views come from the
        workspace's cache (`Workspace.view`), so a tensor that reuses memory reuses its
        view and prepared launches need not repack it."""
        return self.workspace.view(t.data_ptr(), dtype, tuple(t.shape[:t.dim() - _element_axes(dtype)]))

    def _memoized(self, key, make):
        """``make()``, kept by ``key`` (pointers and shapes of the tensors it views): a
        training step passes the same memory every step, and checking and viewing it again
        would cost more host time than its replayed render."""
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) >= 256:  # bounded: pointers of freed memory pile up
                self._memo.clear()
            value = self._memo[key] = make()
        return value

    def inputs(self, tensors: Sequence[torch.Tensor], settings: RenderSettings):
        """Checked Warp views (`arc_warp`'s GaussianInputs) of float32 contiguous
        (means, quats, scales, opacities, colors) tensors; callers memoize them by memory
        (`_memoized`)."""
        return check_inputs(*(self.view(t, dt) for t, dt in zip(tensors, INPUT_DTYPES)), settings)

    def per_camera(self, tensors: Sequence[torch.Tensor], dtypes: Sequence, names: Sequence[str]) -> list[dict]:
        """For [C, ...] contiguous tensors, C dicts of Warp views of camera i's slice by
        name; a name given None is left out. Callers memoize them by memory (`_memoized`)."""
        present = [(t, dt, name) for t, dt, name in zip(tensors, dtypes, names) if t is not None]
        c = present[0][0].shape[0]
        return [{name: self.workspace.view(t.data_ptr() + i * t.stride(0) * t.element_size(), dt,
                                           tuple(t.shape[1:t.dim() - _element_axes(dt)]))
                 for t, dt, name in present} for i in range(c)]

    def grads(self, tensors: Sequence[torch.Tensor]) -> GaussianGrads:
        """Warp views of the five gradient tensors (shaped like the inputs); callers memoize
        them by memory (`_memoized`)."""
        return GaussianGrads(*(self.view(t, dt) for t, dt in zip(tensors, INPUT_DTYPES)))

    def gradients(self, inputs: Sequence[torch.Tensor], means2d_shape: Optional[torch.Size]):
        """Fresh float32 tensors for a backward to write: one shaped like each of `inputs`,
        and one of `means2d_shape` (None: no such tensor, None returned for it).

        torch owns the memory (its allocator, its stream); Warp writes into it. One new
        buffer holds the gradients of leaf inputs and the means2d one: torch keeps them
        as .grad (views of the buffer) until the optimizer step. Another holds those of
        computed inputs (activated quats, scales, opacities), which their backward
        consumes, so it is freed then instead of being held with the first. Where each
        tensor lies is worked out once per shapes and leaf pattern; a call then costs one
        allocation per buffer and one view per tensor."""
        leaves = (*(t.is_leaf for t in inputs), True)  # the means2d gradient joins the leaves'
        shapes = (*(t.shape for t in inputs), means2d_shape)

        def make():
            layout = []  # per buffer: (entries, [(index, shape, strides, offset)])
            for group in (True, False):
                parts, size = [], 0
                for i, (shape, leaf) in enumerate(zip(shapes, leaves)):
                    if shape is not None and leaf == group:
                        strides = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))
                        parts.append((i, tuple(shape), strides, size))
                        size += math.prod(shape)
                if parts:
                    layout.append((size, parts))
            return layout

        tensors = [None] * len(shapes)
        device = inputs[0].device
        for size, parts in self._memoized(("gradients", leaves, *shapes), make):
            buffer = torch.empty(size, dtype=torch.float32, device=device)
            for i, shape, strides, offset in parts:
                tensors[i] = buffer.as_strided(shape, strides, offset)
        return tuple(tensors[:-1]), tensors[-1]

    def device_cameras(self, viewmats: torch.Tensor, Ks: torch.Tensor, width: int, height: int,
                       near: float, far: float) -> DeviceCameras:
        """`arc_warp.DeviceCameras` over [C, 4, 4] world-to-camera and [C, 3, 3] K tensors on
        this context's CUDA device, read by the projection kernel. float32 contiguous
        copies are made only where needed; torch's allocator reuses their memory only in
        stream order, after the queued kernel has read them."""
        vm, ks = viewmats, Ks  # read by pointer only: no detach needed
        if vm.dtype is not torch.float32 or not vm.is_contiguous():
            vm = vm.to(torch.float32).contiguous()
        if ks.dtype is not torch.float32 or not ks.is_contiguous():
            ks = ks.to(torch.float32).contiguous()
        key = (vm.data_ptr(), ks.data_ptr(), vm.shape[0], width, height, near, far)
        cams = self._device_cameras.get(key)
        if cams is None:  # by pointer: the kernel reads the values, so a cached batch stays right
            if len(self._device_cameras) >= 256:
                self._device_cameras.clear()
            cams = self._device_cameras[key] = DeviceCameras(self.view(vm, wp.mat44), self.view(ks, wp.mat33), width,
                                                             height, near, far)
        return cams

    def settings(self, **values) -> RenderSettings:
        """The `RenderSettings` of these values, made (and validated) once."""
        key = tuple(values.items())
        try:
            settings = self._settings.get(key)
        except TypeError:  # an unhashable value: RenderSettings says what is wrong with it
            return RenderSettings(**values)
        if settings is None:
            if len(self._settings) >= 64:
                self._settings.clear()
            settings = self._settings[key] = RenderSettings(**values)
        return settings

    def intrinsics(self, fx: float, fy: float, cx: float, cy: float) -> torch.Tensor:
        """[1, 3, 3] float32 K on this context's device, made once per value (a host-to-device
        copy each call would wait for the device)."""
        key = (fx, fy, cx, cy)
        k = self._intrinsics.get(key)
        if k is None:
            if len(self._intrinsics) >= 256:
                self._intrinsics.clear()
            k = self._intrinsics[key] = torch.tensor([[[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]]],
                                                     dtype=torch.float32, device=self.device)
        return k

    def outputs(self):
        """Context in which the tensors a render returns are allocated: the private memory
        pool on CUDA with graphs (see the class notes), torch's default pool otherwise.
        Nested uses (a caller allocating its own outputs around the render's) enter it
        once."""
        if self._pool is None or self._pooling:
            return _NO_SCOPE
        return self._pool_scope

    def torch_view(self, a: wp.array) -> torch.Tensor:
        """Torch view of a workspace array (cached: workspace arrays live as long as it)."""
        key = (a.ptr, a.shape, a.dtype)
        t = self._torch_views.get(key)
        if t is None:
            t = self._torch_views[key] = wp.to_torch(a, requires_grad=False)
        return t

    def warp_stream(self) -> Optional[wp.Stream]:
        """The ``wp.Stream`` of torch's current stream on this device (None on the CPU)."""
        if self._wdevice.is_cpu:
            return None
        handle = _current_stream_handle(self.device.index)
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = wp.stream_from_torch(self.device)
        return stream

    def stream(self):
        """Context in which Warp launches on torch's current stream (no-op on the CPU)."""
        if self._wdevice.is_cpu:
            return _NO_SCOPE
        return CurrentStream(self._wdevice, self.warp_stream())


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from some builds


def _current_stream_handle(index: int) -> int:
    """The cudaStream_t of torch's current stream on device ``index``: torch's raw getter
    where it has one (a C call; ``torch.cuda.current_stream`` builds a Stream object)."""
    return _RAW_STREAM(index) if _RAW_STREAM is not None else torch.cuda.current_stream(index).cuda_stream


# The three C calls of torch.cuda.use_mem_pool: that generator context manager and its
# device lookup cost several us per render; a build without them uses it instead.
_POOL_CALLS = tuple(getattr(torch._C, name, None) for name in (
    "_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool", "_cuda_releasePool"))
if None in _POOL_CALLS:
    _POOL_CALLS = None


class _PoolScope:
    """Allocates a context's outputs in its private pool for a block (`RenderContext.outputs`;
    one per context, never nested: `outputs` enters it only outside it)."""

    __slots__ = ("context", "pool_key", "scope")

    def __init__(self, context):
        self.context = context
        self.pool_key = (context.device.index, context._pool.id)

    def __enter__(self):
        if _POOL_CALLS is not None:
            _POOL_CALLS[0](*self.pool_key)
        else:
            self.scope = torch.cuda.use_mem_pool(self.context._pool, self.context.device)
            self.scope.__enter__()
        self.context._pooling = True

    def __exit__(self, *exc):
        self.context._pooling = False
        if _POOL_CALLS is None:
            return self.scope.__exit__(*exc)
        _POOL_CALLS[1](*self.pool_key)
        _POOL_CALLS[2](*self.pool_key)
        return False


@functools.cache
def _element_axes(dtype) -> int:
    """Trailing tensor axes one element of a Warp dtype packs: 2 (matrix), 1 (vector), 0."""
    return 2 if wp.types.type_is_matrix(dtype) else 1 if wp.types.type_is_vector(dtype) else 0


_contexts = {}  # default RenderContext per torch device, made on first use


def default_context(device: torch.device) -> RenderContext:
    """The RenderContext used when none is passed: one per device, made on first use
    with RenderContext's defaults."""
    ctx = _contexts.get(device)
    if ctx is None:
        ctx = _contexts[device] = RenderContext(device)
    return ctx


def check_tensor(name: str, t, shape: tuple, device: Optional[torch.device] = None) -> torch.Tensor:
    """Validate a public tensor argument and return it as float32, contiguous.

    `shape` holds ints (exact size), None (any size) or str (a named size that must agree
    across arguments is checked by the caller). Raises TypeError for non-tensors and
    non-floating dtypes, ValueError for wrong shapes or devices. The dtype cast and the
    contiguity copy are autograd-tracked and happen only when needed.
    """
    # the common case, tested first: it costs a training step's host time on every call
    if (isinstance(t, torch.Tensor) and t.dtype is torch.float32 and _shape_fits(shape, t.shape)
            and ((t.is_cuda or t.is_cpu) if device is None else t.device == device) and t.is_contiguous()):
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    if not _shape_fits(shape, t.shape):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected a cpu or cuda tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device} (that of `means`), got {t.device}")
    if t.dtype != torch.float32:
        t = t.to(torch.float32)
    return t.contiguous()


def _shape_fits(spec: tuple, shape: torch.Size) -> bool:
    """Whether `shape` fits a `check_tensor` shape spec (ints exact, None or str any size)."""
    if len(spec) != len(shape):
        return False
    for s, d in zip(spec, shape):
        if s != d and s is not None and s.__class__ is not str:
            return False
    return True


class Means2dSink:
    """Where the screen-space gradient of the projected means goes in backward.

    `tensor` ([C, N, D] or, for one camera, [N, D]; D >= 2) receives dL/d(means2d)
    (pixels, times `scale` per axis) in its .grad; columns past 2 get 0. If
    `absgrad_owner` is given, the per-Gaussian |dL/d(means2d)| summed over pixels is
    added into `absgrad_owner.absgrad` (same shape as the owner, created on first use).

    By default `tensor` is passed to the autograd function as an input, so torch adds the
    gradient into its .grad (and the tensor may have a grad_fn of its own).
    ``attached=True`` (`rasterization`'s own leaf): the sink holds both tensors weakly and
    is no input of the graph: the backward adds the gradient into ``tensor.grad`` itself
    (as torch would) if the tensor is still alive, and skips computing it once the caller
    has dropped it, so neither the tensor nor its gradient is held through the optimizer
    step.
    """

    __slots__ = ("_tensor", "scale", "_absgrad_owner", "attached")

    def __init__(self, tensor: torch.Tensor, scale: Tuple[float, float] = (1.0, 1.0),
                 absgrad_owner: Optional[torch.Tensor] = None, attached: bool = False):
        hold = weakref.ref if attached else _Held
        self._tensor = hold(tensor)
        self._absgrad_owner = None if absgrad_owner is None else hold(absgrad_owner)
        self.scale, self.attached = scale, attached

    @property
    def tensor(self) -> Optional[torch.Tensor]:
        """The tensor whose .grad receives the gradient; None once an attached one died."""
        return self._tensor()

    @property
    def absgrad_owner(self) -> Optional[torch.Tensor]:
        """The tensor whose .absgrad receives the absolute sums, or None."""
        return None if self._absgrad_owner is None else self._absgrad_owner()


class _Held:
    """A strong reference with weakref.ref's call interface."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __call__(self):
        return self.value


@dataclass
class BatchRender:
    """Torch outputs of C cameras of one size (float32 unless noted, on the input device)."""

    color: torch.Tensor  # [C, H, W, 3] without background
    alpha: torch.Tensor  # [C, H, W, 1], as rasterization returns it
    depth: Optional[torch.Tensor]  # [C, H, W] sum of w_i z_i (None: not asked for)
    expected_depth: Optional[torch.Tensor]  # [C, H, W] depth / alpha, 0 where alpha == 0 (or None)
    means2d: torch.Tensor  # [C, N, 2] pixels, not differentiable (see Means2dSink, render_batch's means2d_grad)
    radii: torch.Tensor  # [C, N, 2] int32 pixels, (0, 0) = culled


@dataclass
class CameraRender:
    """Torch views of one camera's render (see BatchRender, without the camera axis)."""

    color: torch.Tensor  # [H, W, 3]
    alpha: torch.Tensor  # [H, W]
    depth: torch.Tensor  # [H, W]
    expected_depth: torch.Tensor  # [H, W]
    means2d: torch.Tensor  # [N, 2]
    radii: torch.Tensor  # [N, 2] int32


# Warp element types of (means, quats, scales, opacities, colors), vectors on the last axis.
INPUT_DTYPES = (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3)
# Warp element types of the image outputs (color, alpha, depth, expected_depth).
IMAGE_DTYPES = (wp.vec3, wp.float32, wp.float32, wp.float32)
IMAGE_NAMES = ("color", "alpha", "depth", "expected_depth")


class _RaiseOnDoubleBackward(torch.autograd.Function):
    """Identity on a gradient tensor whose own backward raises a clear error."""

    @staticmethod
    def forward(ctx, grad):
        return grad.view_as(grad)

    @staticmethod
    def backward(ctx, _):
        raise RuntimeError(
            "arc_warp_torch: double backward through the Warp renderer is not supported: its "
            "backward pass is hand-written Warp code and not itself differentiable. Do not "
            "differentiate gradients of the rendered images (create_graph=True) a second time.")


class _RenderGaussians(torch.autograd.Function):
    """(means, quats, scales, opacities, colors) -> (color, alpha, depth, expected_depth),
    or without the two depth images when `depths` is False (fewer outputs: less autograd
    bookkeeping per call), for C cameras of one size: the node of a render
    `_queue_render` queued just before it (so the device starts before torch's autograd
    bookkeeping runs), whose images it returns (the projected means and radii, not
    differentiable, went into an allocation of their own, which it holds through an
    alias). Backward runs the core backward of the C cameras (`backwards_checked`) into
    one gradient buffer: the first camera writes every entry, the others add."""

    @staticmethod
    def forward(ctx, context, queued, sink, sink_tensor, means, quats, scales, opacities, colors):
        ctx.set_materialize_grads(False)
        returned, outs, alias, block = queued
        # Saved so torch raises if anything the Warp backward reads was modified in place,
        # and so that the projected means and radii it reads (through non-owning views, see
        # RenderContext.view) stay alive: ``alias``, a view of their allocation that only
        # this node holds (the caller's tensors are the caller's alone). It dies when torch
        # frees the saved tensors (after a backward without retain_graph, or with the
        # graph), which drops what the backward needed (`_finished`).
        ctx.save_for_backward(means, quats, scales, opacities, colors, alias)
        ctx.outs, ctx.sink, ctx.context = outs, sink, context
        # The colour and depth images are not held: the backward does not read them, and a
        # loss that drops them frees their memory before the gradients are made; a deferred
        # check's re-render writes into them only while the caller holds them (the alpha
        # image shares the alias's memory, alive while the backward can run).
        ctx.images = weakref.ref(block)
        frames = [out._frame for out in outs] if context.workspace.allocator is not None else None
        weakref.finalize(alias, _finished, weakref.ref(ctx), context.workspace, frames)
        return returned

    @staticmethod
    def backward(ctx, *output_grads):
        saved = ctx.saved_tensors
        # (color, alpha[, depth, expected_depth]) cotangents
        cotangents = (*output_grads, None, None)[:4]
        # torch runs a backward with grad mode on only under create_graph=True; then hand
        # back grads whose own backward raises (as torch's once_differentiable does, with a
        # message naming this renderer)
        grad_mode = torch.is_grad_enabled()
        guard = grad_mode and any(g is not None and g.requires_grad for g in cotangents)
        with torch.no_grad() if grad_mode else _NO_SCOPE:
            grads, means2d_grad, target = _warp_backward(ctx.context, ctx.outs, saved[:5], ctx.sink, cotangents,
                                                         ctx.images)
        needed = ctx.needs_input_grad
        result = [None] * 4  # context, queued, sink, sink_tensor
        if target is not None and ctx.sink.attached:
            if target.grad is None:  # what torch's AccumulateGrad does for a leaf
                target.grad = means2d_grad
            else:
                target.grad += means2d_grad
        elif target is not None and needed[3]:
            result[3] = _guarded(means2d_grad) if guard else means2d_grad
        for i, g in enumerate(grads):
            result.append(None if not needed[4 + i] else _guarded(g) if guard else g)
        return tuple(result)


# torch.autograd.Function.apply without its functorch unwrapping of dead wrappers (a
# pytree walk over the arguments, several us per call), for calls outside functorch transforms
_APPLY = torch._C._FunctionBase.__dict__["apply"].__get__(None, _RenderGaussians)


def _guarded(g: torch.Tensor) -> torch.Tensor:
    """``g`` behind `_RaiseOnDoubleBackward`, for a backward under create_graph=True."""
    return _RaiseOnDoubleBackward.apply(g.detach().requires_grad_(True))


def _finished(node_ref, workspace: Workspace, frames) -> None:
    """Once torch has freed a render node's saved tensors (its backward cannot run again),
    drop its outputs, whose frames then serve the next render (the alias of the radii
    and projected means went with the saved tensors), and hand the frames' memory back
    to torch (``frames``; None: the workspace keeps it, ``release_workspace`` off). Runs
    where torch frees them: in the backward, on its device thread, or when the graph is
    dropped."""
    node = node_ref()
    if node is not None:
        node.outs = None
    if frames is not None:
        workspace.release(frames)


def _warp_backward(context, outs, inputs, sink, output_grads, images):
    """Run the core backward (`backwards_checked`) on torch cotangents ([C, ...]); return
    torch grads shaped like `inputs`, the sink's means2d gradient and the sink's tensor
    (both None without a sink, or once an attached sink's tensor died: then no means2d
    gradient is computed). ``images``: a weak reference to the block of the render's
    colour and depth images (dead: a deferred check's re-render writes them into the
    frames' images instead, `leave_images`)."""
    c, n = len(outs), inputs[0].shape[0]
    target = None if sink is None else sink.tensor
    # a [C, N, 2] (or, for one camera, [N, 2]) sink's gradient is written in place, into
    # the buffer of the leaf gradients (see `RenderContext.gradients`)
    direct = target is not None and target.shape[-1] == 2
    torch_grads, batched = context.gradients(inputs, (c, n, 2) if direct else None)
    with context.stream():
        output_grads = [g if g is None or (g.dtype is torch.float32 and g.is_contiguous())
                        else g.to(torch.float32).contiguous() for g in output_grads]
        key = ("backward", *(t.data_ptr() for t in torch_grads), None if batched is None else batched.data_ptr(),
               *(None if g is None else g.data_ptr() for g in output_grads), c, n, inputs[4].shape, outs[0].alpha.shape)
        into, m2d_grads, cotangents = context._memoized(
            key, lambda: _backward_views(context, torch_grads, batched, output_grads, c))

        def queue():
            # the first camera writes every entry (accumulate=False), so nothing is zeroed for
            # C = 1; later cameras add, into their own zeroed means2d slices
            if batched is not None and c > 1:
                batched[1:].zero_()
            for out, m2d_grad in zip(outs[1:], m2d_grads[1:]):  # each camera's own buffers
                if m2d_grad is None and target is not None:
                    out.means2d_grad.zero_()
                if out.means2d_absgrad is not None:
                    out.means2d_absgrad.zero_()
            backwards_checked(outs, cotangents, into, False, m2d_grads, target is not None)

        queue()
        # the forward's deferred checks, once the backward is queued (the host waits for
        # nothing the device has not done long since); a render they redid needs its
        # backward again (every camera's, since the first writes what the others add to)
        if context.workspace.deferred and images() is None:
            leave_images(context.workspace, outs, ("color", "depth", "expected_depth"))
        if any(out is r for r in settle_deferred(context.workspace) for out in outs):
            queue()
    if target is None:
        return torch_grads, None, None
    if batched is None:
        m2d = target.new_zeros(target.shape)
        batched = m2d.view(c, n, target.shape[-1])
        for i, out in enumerate(outs):
            batched[i, :, :2] = context.torch_view(out.means2d_grad)
    else:
        m2d = batched if target.dim() == 3 else batched.view(target.shape)
    _scale(batched, sink.scale)
    owner = sink.absgrad_owner
    if owner is not None:
        if getattr(owner, "absgrad", None) is None:
            owner.absgrad = torch.zeros_like(owner, requires_grad=False)
        absgrad = owner.absgrad.view(c, n, owner.shape[-1])
        for i, out in enumerate(outs):
            part = context.torch_view(out.means2d_absgrad)
            for axis in (0, 1):
                absgrad[i, :, axis] += part[:, axis] * sink.scale[axis]
    return torch_grads, m2d, target


def _backward_views(context, torch_grads, batched, output_grads, c):
    """Warp views a backward of C cameras writes and reads: the gradients (GaussianGrads),
    per camera its means2d gradient (None: without a direct sink, the workspace's, also on
    a second backward with retain_graph) and its (color, alpha, depth, expected_depth)
    cotangents (None where torch gives none; alpha's [C, H, W, 1], viewed as [C, H, W])."""
    sinks = [{}] * c if batched is None else context.per_camera((batched,), (wp.vec2,), ("means2d",))
    alpha = output_grads[1]
    if alpha is not None:
        output_grads = (output_grads[0], alpha.view(alpha.shape[:3]), *output_grads[2:])
    cotangents = context.per_camera(output_grads, IMAGE_DTYPES, IMAGE_NAMES) if any(
        g is not None for g in output_grads) else [{}] * c
    return (context.grads(torch_grads), [s.get("means2d") for s in sinks],
            [tuple(cot.get(name) for name in IMAGE_NAMES) for cot in cotangents])


def _scale(t: torch.Tensor, scale: Tuple[float, float]):
    """Multiply t[..., 0] and t[..., 1] in place by host floats (no host-to-device copy)."""
    for axis in (0, 1):
        if scale[axis] != 1.0:
            t[..., axis] *= scale[axis]


def _queue_render(context, cameras, settings, depths: bool, defer: bool, inputs: tuple) -> tuple:
    """Allocate a render's outputs and queue it: ``(images, outs, means2d, radii, block)``
    (images: color, alpha[, depth, expected_depth]; outs: the core's RenderOutputs;
    means2d: [C, N, 2] projected means; radii: [C, N, 2] int32; block: what holds the
    colour and depth images). The outputs are views of two allocations, not six:
    ``block`` holds the colour and depth images (without `depths` the depth images are
    empty, which the rasteriser leaves unwritten), the other the projected means, the
    radii and the alpha image, which a loop that keeps only the colours through its
    optimizer step (the backward reads none of them) frees after the backward. Only what
    the queued work needs (the outputs' memory, the checked Warp views) is made before it
    is queued; the torch views handed back are made after, while the device already works."""
    c, n = len(cameras), inputs[0].shape[0]
    size = cameras if isinstance(cameras, DeviceCameras) else cameras[0]
    h, w = size.height, size.width
    with context.outputs():
        block = inputs[0].new_empty((5 if depths else 3) * c * h * w)
        projected = inputs[0].new_empty(4 * c * n + c * h * w)

    def views(alpha_shape, alpha_strides):
        """means2d, radii and alpha in ``projected``."""
        return (projected.as_strided((c, n, 2), (2 * n, 2, 1)),
                projected.view(torch.int32).as_strided((c, n, 2), (2 * n, 2, 1), 2 * c * n),
                projected.as_strided(alpha_shape, alpha_strides, 4 * c * n))

    def checked_views():
        means2d, radii, alpha = views((c, h, w), (h * w, w, 1))  # [H, W] per camera for Warp
        return (context.inputs(inputs, settings),
                context.per_camera((*_images(block, alpha, c, h, w, depths, empty=True), means2d, radii),
                                   (*IMAGE_DTYPES, wp.vec2, wp.vec2i), (*IMAGE_NAMES, "means2d", "radii")))

    # one lookup by every pointer and size the Warp views depend on (the outputs' layout in
    # their allocations is fixed by c, n, h, w)
    means, quats, scales, opacities, colors = inputs
    key = ("forward", means.data_ptr(), quats.data_ptr(), scales.data_ptr(), opacities.data_ptr(),
           colors.data_ptr(), colors.shape, settings.sh_degree, block.data_ptr(), projected.data_ptr(), c, h, w,
           depths)
    checked, targets = context._memoized(key, checked_views)
    pairs = [(cameras, i) for i in range(c)] if isinstance(cameras, DeviceCameras) else [(cam, None) for cam in cameras]
    # all C cameras queued before the one wait that checks them (or none: defer), on torch's stream
    outs = render_checked(checked, pairs, settings, context.workspace, targets, defer, context.warp_stream())
    means2d, radii, alpha = views((c, h, w, 1), (h * w, w, 1, 1))  # as rasterization returns it
    return _images(block, alpha, c, h, w, depths), outs, means2d, radii, block


def _images(block: torch.Tensor, alpha: torch.Tensor, c: int, h: int, w: int, depths: bool,
            empty: bool = False) -> tuple:
    """color [C, H, W, 3] (a view of ``block``), ``alpha``, then with ``depths``
    depth and expected depth [C, H, W] (views of ``block`` after the colours), or with
    ``empty`` two empty [C, 0, 0] views in their place (the rasteriser leaves empty images
    unwritten)."""
    plane = c * h * w
    images = (block.as_strided((c, h, w, 3), (3 * h * w, 3 * w, 3, 1)), alpha)
    if depths:
        return (*images, *(block.as_strided((c, h, w), (h * w, w, 1), k * plane) for k in (3, 4)))
    return (*images, *(block.as_strided((c, 0, 0), (0, 0, 0)),) * 2) if empty else images


def render_batch(means: torch.Tensor,  # [N, 3] float32
                 quats: torch.Tensor,  # [N, 4] float32 wxyz
                 scales: torch.Tensor,  # [N, 3] float32 linear
                 opacities: torch.Tensor,  # [N] float32 in [0, 1]
                 colors: torch.Tensor,  # [N, 3] RGB or [N, K, 3] SH, float32
                 cameras: Union[Sequence[Camera], DeviceCameras],
                 settings: RenderSettings,
                 sink: Optional[Means2dSink] = None,
                 context: Optional[RenderContext] = None, depths: bool = True,
                 means2d_grad: bool = False) -> BatchRender:
    """Differentiable render of C cameras of one image size in one autograd node; inputs
    must be float32, contiguous, on one cpu/cuda device (use `check_tensor`).
    `depths` False leaves the depth images out (`depth`, `expected_depth` None).

    The projected means (`BatchRender.means2d`) are not differentiable; their gradient
    goes to `sink`, or, with `means2d_grad` (and no `sink`), to the returned means2d
    itself: a leaf with requires_grad=True whose .grad receives it while the caller holds
    it (an attached `Means2dSink`; with `settings.absgrad` its .absgrad gets the absolute
    sums): `rasterization`'s meta["means2d"]. `settings.absgrad` must be True when the sink
    has an `absgrad_owner`. `context` None uses `default_context(means.device)`. Under
    `torch.use_deterministic_algorithms(True)` the backward reduces with
    `reduce="deterministic"` whatever `settings.reduce` says."""
    if torch.are_deterministic_algorithms_enabled() and settings.reduce != "deterministic":
        settings = dataclasses.replace(settings, reduce="deterministic")
    if context is None:
        context = default_context(means.device)
    if context.captured is not None:
        raise RuntimeError("arc_warp_torch: this RenderContext belongs to a captured CUDA graph (capture_step), "
                           "whose buffers a render outside it could grow or overwrite; render with another "
                           "RenderContext, or call release() on the CapturedStep when the graph is done with")
    if not isinstance(cameras, DeviceCameras):
        cameras = tuple(cameras)
    # checked in the backward, after it is queued, when one can run (RenderContext notes)
    defer = (context.defer_checks and settings.reduce != "deterministic" and torch.is_grad_enabled()
             and (means.requires_grad or quats.requires_grad or scales.requires_grad or opacities.requires_grad
                  or colors.requires_grad))
    inputs = (means, quats, scales, opacities, colors)
    images, outs, means2d, radii, block = _queue_render(context, cameras, settings, depths, defer, inputs)
    # the node saves an alias of the projected means' allocation (`_RenderGaussians.forward`):
    # the tensors handed back are the caller's alone
    queued = (images, outs, means2d.detach(), block)
    if means2d_grad and sink is None:
        sink = Means2dSink(means2d.requires_grad_(True), absgrad_owner=means2d if settings.absgrad else None,
                           attached=True)
    sink_tensor = None if sink is None or sink.attached else sink.tensor
    apply = _RenderGaussians.apply if torch._C._are_functorch_transforms_active() else _APPLY
    images = apply(context, queued, sink, sink_tensor, *inputs)
    if not depths:
        images = (*images, None, None)
    return BatchRender(*images, means2d, radii)


def render_camera(means: torch.Tensor, quats: torch.Tensor, scales: torch.Tensor,
                  opacities: torch.Tensor, colors: torch.Tensor, camera: Union[Camera, DeviceCameras],
                  settings: RenderSettings, sink: Optional[Means2dSink] = None,
                  context: Optional[RenderContext] = None) -> CameraRender:
    """`render_batch` of one camera (a Camera, or DeviceCameras of one), without the
    camera axis (sink tensor [N, D])."""
    r = render_batch(means, quats, scales, opacities, colors,
                     camera if isinstance(camera, DeviceCameras) else (camera,), settings, sink,
                     context=context)
    return CameraRender(r.color[0], r.alpha[0, :, :, 0], r.depth[0], r.expected_depth[0], r.means2d[0],
                        r.radii[0])
