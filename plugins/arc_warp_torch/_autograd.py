"""The torch.autograd bridge: C cameras through an `arc_warp.GaussianRenderer` in one node.

Tensors cross into Warp as views of their memory, and Warp launches run on torch's
current stream, so the two stay ordered without synchronisation. What a backward reads
lives in torch memory the autograd node saves (freed with the graph). Callers
(`rasterization`, `GaussianRasterizer`) validate and convert their inputs first
(`check_tensor`, `cameras_of`): float32, contiguous, on one device.
"""

from __future__ import annotations

import collections
import contextlib
import math
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch
import warp as wp

from arc_warp import (Camera, DeviceCameras, GaussianGrads, GaussianRenderer, ImageGrads, RenderImages,
                      RenderSettings, RenderStatus, Workspace, check_gaussians)
from arc_warp.splat import Surface

INPUT_DTYPES = (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3)  # of means, quats, scales, opacities, colors
_NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.int32: np.dtype(np.int32), torch.uint8: np.dtype(np.uint8)}


def view(t: torch.Tensor, dtype, shape: tuple, offset: int = 0) -> wp.array:
    """A Warp array of ``shape`` and ``dtype`` over a contiguous tensor's memory, ``offset``
    bytes in; the caller keeps ``t`` alive until the launches that read it have run."""
    return wp.array(ptr=t.data_ptr() + offset, dtype=dtype, shape=shape, device=wp.device_from_torch(t.device))


class RenderContext:
    """What the bridge keeps on one torch device: an :class:`arc_warp.Workspace` (the
    renderers by image size, camera count and settings, and the nvdiffrast drop-in's mesh op
    objects; its ARC threshold resolved here, never inside a training step) whose renderers
    take their per-call scratch from torch's caching allocator. ``check``
    (``GaussianRenderer.forward``'s overflow rule): True reads every render's checks before it
    returns (one wait per render on CUDA; a debugging aid), False never, None (the default)
    where it costs no wait (the CPU); otherwise the next render of that size reads them, and
    ``SparseGaussianAdam.step(skip=meta["status"])`` skips the update of a step whose image
    lacked Gaussians. Not thread-safe: ``default_context`` gives each thread its own."""

    def __init__(self, device, threshold: Optional[int] = None, check: Optional[bool] = None):
        wp.init()
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"RenderContext: expected a cpu or cuda device, got {self.device}")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.wp_device = wp.device_from_torch(self.device)
        self.workspace = Workspace(self.wp_device, threshold, allocator=self.allocate)
        self.check = check
        # CPU only: numpy byte blocks by size, kept for the next call once free (see empty)
        self._host_blocks = collections.defaultdict(list) if self.device.type == "cpu" else None

    def empty(self, shape, dtype=torch.float32) -> torch.Tensor:
        """A new tensor on this device for a call's memory: from torch's caching allocator
        on CUDA; on the CPU from blocks kept for the next call, so that a repeated call gets
        the same memory back (and the renderers' views and plans of it) as on CUDA."""
        if self._host_blocks is None:
            return torch.empty(shape, dtype=dtype, device=self.device)
        # a block is free again when only this pool references its numpy array (a tensor made
        # from it holds a typed view of it, whose base it is, until its memory is released)
        shape = (shape,) if isinstance(shape, int) else shape
        np_dtype = _NUMPY_DTYPES[dtype]
        nbytes = math.prod(shape) * np_dtype.itemsize
        blocks = self._host_blocks[nbytes]
        for block in blocks:
            if sys.getrefcount(block) == 3:  # the list's, the loop's and getrefcount's own
                break
        else:
            block = np.empty(max(nbytes, 4), dtype=np.uint8)
            blocks.append(block)
        return torch.from_numpy(block[:nbytes].view(np_dtype).reshape(shape))

    def allocate(self, nbytes: int):
        """``nbytes`` of this device's memory (:meth:`empty`), on torch's current stream, as
        (pointer, the tensor holding it)."""
        t = self.empty(nbytes, torch.uint8)
        return t.data_ptr(), t

    def warp_stream(self) -> wp.Stream:
        """The Warp stream over torch's current stream (CUDA only), from :data:`_WARP_STREAMS`."""
        current = torch.cuda.current_stream(self.device)
        key = (self.device.index, current.cuda_stream)
        stream = _WARP_STREAMS.get(key)
        if stream is None:
            stream = _WARP_STREAMS[key] = wp.stream_from_torch(current)
        return stream

    def stream(self):
        """Context in which Warp launches on torch's current stream (no-op on the CPU)."""
        return _NO_STREAM if self.wp_device.is_cpu else _TorchStream(self.wp_device, self.warp_stream())


_NO_STREAM = contextlib.nullcontext()

# (CUDA ordinal, torch stream handle) -> the process's one Warp stream over it, never dropped
# (a few per process). One object per stream: when a Warp stream object over a handle is
# collected, Warp forgets that handle's record, its capture among them, whoever else wraps it.
_WARP_STREAMS: dict = {}


class _TorchStream:
    """Makes a Warp stream over torch's current stream the device's current stream for a
    block, without a wait (torch orders everything the bridge touches on that stream)."""

    def __init__(self, device, stream: wp.Stream):
        self.device, self.stream = device, stream

    def __enter__(self):
        self.saved = self.device.stream
        self.device.set_stream(self.stream, sync=False)

    def __exit__(self, *exc):
        self.device.set_stream(self.saved, sync=False)


_contexts = threading.local()  # per thread: torch device -> its default RenderContext


def default_context(device: torch.device) -> RenderContext:
    """The RenderContext used when none is passed (and by the nvdiffrast drop-in, whose
    op objects live in its workspace): one per device and thread, made on first use."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    by_device = _contexts.__dict__.setdefault("by_device", {})
    if device not in by_device:
        by_device[device] = RenderContext(device)
    return by_device[device]


def check_tensor(name: str, t, shape: tuple, device: Optional[torch.device] = None) -> torch.Tensor:
    """A public tensor argument as float32, contiguous (cast and copied only when needed,
    autograd-tracked), or TypeError for non-tensors and non-floating dtypes, ValueError for
    wrong shapes (``shape``: ints, or None for any size) or devices."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    if len(shape) != t.dim() or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        raise ValueError(f"{name}: expected shape [{', '.join('*' if s is None else str(s) for s in shape)}], "
                         f"got {list(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected a cpu or cuda tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device} (that of `means`), got {t.device}")
    return (t if t.dtype == torch.float32 else t.to(torch.float32)).contiguous()


def sh_colors(name: str, colors, n: int, sh_degree: Optional[int], device) -> tuple:
    """(sh_degree or None, float32 colours with exactly the SH coefficients it needs) of
    [N, 3] RGB (``sh_degree`` None) or [N, K, 3] SH ``colors`` (``sh_degree`` None: K =
    (d + 1)^2 gives it), or TypeError/ValueError naming ``name``."""
    if isinstance(colors, torch.Tensor) and colors.dim() == 2:
        if sh_degree is not None:
            raise ValueError(f"{name}: sh_degree={sh_degree} needs SH coefficients [N, K, 3], "
                             f"got RGB shape {list(colors.shape)}")
        return None, check_tensor(name, colors, (n, 3), device)
    colors = check_tensor(name, colors, (n, None, 3), device)  # or TypeError for a non-tensor
    k = colors.shape[1]
    if sh_degree is None:
        sh_degree = math.isqrt(k) - 1
        if (sh_degree + 1) ** 2 != k:
            raise ValueError(f"{name}: [N, K, 3] with sh_degree=None needs K = (d+1)^2, got K={k}")
    if not isinstance(sh_degree, int) or not 0 <= sh_degree <= 3:
        raise ValueError(f"sh_degree: expected None or an int in 0..3, got {sh_degree!r}")
    needed = (sh_degree + 1) ** 2
    if k < needed:
        raise ValueError(f"{name}: sh_degree={sh_degree} needs K >= {needed} coefficients, got K={k}")
    return sh_degree, colors[:, :needed].contiguous() if k > needed else colors


def cameras_of(viewmats, Ks, width: int, height: int, near: float, far: float, device: torch.device,
               model: str = "pinhole", distortion: Optional[torch.Tensor] = None):
    """The cameras of [C, 4, 4] world-to-camera `viewmats` and [C, 3, 3] `Ks` (of ``model``, with
    [C, K] ``distortion`` coefficients or None), and the tensors their views read (held by the
    caller until the render is queued): CUDA tensors on `device` as `arc_warp.DeviceCameras`
    views (no host copy, checked on the device), others as C `Camera`s (checked here)."""
    for name, t, shape in (("viewmats", viewmats, "[C, 4, 4]"), ("Ks", Ks, "[C, 3, 3]")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor {shape}, got {type(t).__name__}")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: expected a cpu or cuda tensor, got device {t.device}; move it with "
                             f"{name}.to(means.device)")
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a float {shape} tensor, got {t.dtype}")
        if t.requires_grad:
            raise ValueError(f"{name} requires grad, but camera gradients are not supported; pass a detached tensor")
    if viewmats.dim() != 3 or tuple(viewmats.shape[1:]) != (4, 4):
        raise ValueError(f"viewmats: expected a float [C, 4, 4] tensor, got {list(viewmats.shape)}")
    c = viewmats.shape[0]
    if c == 0:
        raise ValueError("viewmats: no cameras (C = 0); pass at least one [4, 4] world-to-camera matrix")
    if Ks.shape != (c, 3, 3):
        raise ValueError(f"Ks: expected a float [C, 3, 3] tensor with C={c} (from viewmats), got {list(Ks.shape)}")
    if viewmats.device == device == Ks.device and device.type == "cuda":
        vm, ks = (t.to(torch.float32).contiguous() for t in (viewmats, Ks))
        lens = None if distortion is None else distortion.to(device, torch.float32).contiguous()
        cams = DeviceCameras(view(vm, wp.mat44, (c,)), view(ks, wp.mat33, (c,)), width, height, near, far, model,
                             None if lens is None else view(lens, wp.float32, tuple(lens.shape)))
        return cams, (vm, ks, lens)
    # Camera reads them as float64 (numpy has no bfloat16)
    vm, kk = (t.detach().cpu().numpy() if t.dtype in (torch.float32, torch.float64)
              else t.detach().to("cpu", torch.float64).numpy() for t in (viewmats, Ks))
    cameras = []
    for i, (v, k) in enumerate(zip(vm, kk)):
        try:
            cameras.append(Camera(float(k[0, 0]), float(k[1, 1]), float(k[0, 2]), float(k[1, 2]), width, height,
                                  world_to_camera=v, near=near, far=far, model=model,
                                  distortion=None if distortion is None else distortion[i].tolist()))
        except ValueError as e:
            raise ValueError(f"camera {i} (viewmats[{i}], Ks[{i}]): {e}") from None
    return cameras, ()


class Means2dSink:
    """Where the screen-space gradient of the projected means goes in backward: `tensor`
    ([C, N, D] or, for one camera, [N, D]; D >= 2) receives dL/d(means2d) (pixels, times
    `scale` per axis; columns past 2 get 0) in its .grad, and `absgrad_owner.absgrad` (made on
    first use) the per-Gaussian |dL/d(means2d)| summed over pixels. `tensor` is an input of the
    autograd node or, with ``attached=True`` (`rasterization`'s own leaf), held by weak
    reference: the backward adds into its .grad while the caller holds it, else computes nothing."""

    def __init__(self, tensor: torch.Tensor, scale: Tuple[float, float] = (1.0, 1.0),
                 absgrad_owner: Optional[torch.Tensor] = None, attached: bool = False):
        hold = weakref.ref if attached else (lambda t: (lambda: t))
        # callables returning the tensors (None once an attached one died, or not given)
        self.tensor = hold(tensor)
        self.absgrad_owner = (lambda: None) if absgrad_owner is None else hold(absgrad_owner)
        self.scale, self.attached = scale, attached


@dataclass
class BatchRender:
    """Torch outputs of C cameras of one size (float32 unless noted, on the input device)."""

    color: torch.Tensor  # [C, H, W, 3] without background
    alpha: torch.Tensor  # [C, H, W, 1], as rasterization returns it
    depth: Optional[torch.Tensor]  # [C, H, W] sum of w_i z_i (None: not asked for)
    expected_depth: Optional[torch.Tensor]  # [C, H, W] depth / alpha, 0 where alpha == 0 (or None)
    means2d: torch.Tensor  # [C, N, 2] pixels, not differentiable (see Means2dSink, render_batch's means2d_grad)
    radii: torch.Tensor  # [C, N, 2] int32 pixels, (0, 0) = culled
    status: RenderStatus  # the render's checks (see arc_warp.GaussianRenderer's overflow rule)


class _RenderGaussians(torch.autograd.Function):
    """(means, quats, scales, opacities, colors[, surface colours]) -> (color, alpha[, depth,
    expected_depth]) of C cameras: the node of a render `render_batch` queued just before.
    It saves what its backward reads, so torch frees that once the backward has run."""

    @staticmethod
    def forward(ctx, queued, sink, sink_tensor, means, quats, scales, opacities, colors, surface_colors=None):
        ctx.set_materialize_grads(False)
        returned, context, renderer, state, saved = queued
        ctx.save_for_backward(means, quats, scales, opacities, colors, *saved)
        ctx.context, ctx.renderer, ctx.state, ctx.sink = context, renderer, state, sink
        return returned

    @staticmethod
    def backward(ctx, *output_grads):
        # grad mode is on only under create_graph=True: the gradients handed back then raise if differentiated
        guard = torch.is_grad_enabled() and any(g is not None and g.requires_grad for g in output_grads)
        needed = ctx.needs_input_grad
        with torch.no_grad():
            grads, means2d_grad = _backward(ctx.context, ctx.renderer, ctx.state, ctx.saved_tensors[:5], ctx.sink,
                                            (*output_grads, None, None)[:4], len(needed) > 8 and needed[8])
        if means2d_grad is not None and ctx.sink.attached:
            target = ctx.sink.tensor()  # not an input (needed[2] is False): its .grad as AccumulateGrad does
            if target.grad is None:
                target.grad = means2d_grad
            else:
                target.grad += means2d_grad
        if guard:
            grads = [_RaiseOnDoubleBackward.apply(g.detach().requires_grad_(True)) for g in grads]
        # queued, sink, sink_tensor, the inputs
        return (None, None, means2d_grad if needed[2] else None,
                *(g if needed[3 + i] else None for i, g in enumerate(grads)))


class _RaiseOnDoubleBackward(torch.autograd.Function):
    """Identity on a gradient tensor whose own backward raises a clear error."""

    @staticmethod
    def forward(ctx, grad):
        return grad.view_as(grad)

    @staticmethod
    def backward(ctx, _):
        raise RuntimeError(
            "arc_warp_torch: double backward through the Warp renderer is not supported: its backward pass is "
            "hand-written Warp code and not itself differentiable (do not differentiate the gradients of rendered "
            "images again)")


def _backward(context: RenderContext, renderer: GaussianRenderer, state, inputs, sink, output_grads,
              surface: bool = False):
    """The renderer's backward from torch cotangents ([C, ...]): gradients shaped like
    ``inputs`` (with ``surface`` then the surface colours' [C, H, W, 3]), and the sink's
    means2d gradient (None without a sink or once an attached sink's tensor died)."""
    c, n, h, w = renderer.num_cameras, inputs[0].shape[0], renderer.height, renderer.width
    target = None if sink is None else sink.tensor()
    grads = [context.empty(t.shape) for t in inputs]
    m2d = context.empty((c, n, 2)) if target is not None else None
    # contiguous float32 cotangents (copies into the context's memory on the CPU or where torch handed
    # others, as the expanded one of `.sum()`), held here until the launches that read them are queued
    dense = [None if g is None else g if (g.is_cuda and g.dtype is torch.float32 and g.is_contiguous())
             else context.empty(g.shape).copy_(g) for g in output_grads]

    def views():
        cotangents = [ImageGrads(*(None if g is None else view(g, dt, (h, w), i * h * w * k * 4)
                                   for g, dt, k in zip(dense, (wp.vec3, wp.float32, wp.float32, wp.float32),
                                                       (3, 1, 1, 1)))) for i in range(c)]
        return (cotangents, GaussianGrads(*(view(g, dt, (n,) if g.dim() < 3 else (n, g.shape[1]))
                                            for g, dt in zip(grads, INPUT_DTYPES))),
                None if m2d is None else [view(m2d, wp.vec2, (n,), i * n * 8) for i in range(c)])

    # Warp views of the call's tensors, made once per memory (GaussianRenderer.bound)
    key = ("backward views", n, *(0 if g is None else g.data_ptr() for g in (*dense, *grads, m2d)))
    cotangents, wgrads, wm2d = renderer.bound(key, views)
    # the renderer adds T_final * dL/dcolor into the surface colours' gradient
    surface_grad = torch.zeros((c, h, w, 3), dtype=torch.float32, device=inputs[0].device) if surface else None
    with context.stream():
        renderer.backward(state, cotangents, wgrads, False, wm2d,
                          [view(surface_grad, wp.vec3, (h, w), i * h * w * 12) for i in range(c)] if surface else None)
    if surface:
        grads.append(surface_grad)
    if target is None:
        return grads, None
    if target.shape[-1] != 2:
        m2d = torch.nn.functional.pad(m2d, (0, target.shape[-1] - 2))
    m2d = m2d.view(target.shape)
    for axis in (0, 1):
        if sink.scale[axis] != 1.0:
            m2d[..., axis] *= sink.scale[axis]
    owner = sink.absgrad_owner()
    if owner is not None:
        if getattr(owner, "absgrad", None) is None:
            owner.absgrad = torch.zeros_like(owner, requires_grad=False)
        absgrad = owner.absgrad.view(c, n, owner.shape[-1])
        for i, cs in enumerate(state.cameras):
            part = wp.to_torch(cs.absgrad, requires_grad=False)
            for axis in (0, 1):
                absgrad[i, :, axis] += part[:, axis] * sink.scale[axis]
    return grads, m2d


def render_batch(means: torch.Tensor,  # [N, 3] float32
                 quats: torch.Tensor,  # [N, 4] float32 wxyz
                 scales: torch.Tensor,  # [N, 3] float32 linear
                 opacities: torch.Tensor,  # [N] float32 in [0, 1]
                 colors: torch.Tensor,  # [N, 3] RGB or [N, K, 3] SH, float32
                 cameras: Union[Sequence[Camera], DeviceCameras],
                 settings: RenderSettings,
                 sink: Optional[Means2dSink] = None,
                 context: Optional[RenderContext] = None, depths: bool = True,
                 means2d_grad: bool = False,
                 surfaces: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> BatchRender:
    """Differentiable render of C cameras of one image size in one autograd node. `depths`
    False leaves the depth images out (None). `surfaces`: None, or (colours [C, H, W, 3],
    camera depths [C, H, W]) (`arc_warp.Surface`; the colours are an input of the node). The
    projected means' gradient goes to `sink`, or with `means2d_grad` to the returned means2d,
    an attached sink's leaf. `context` None: `default_context(means.device)`. Under
    `torch.use_deterministic_algorithms(True)` the backward uses `reduce="deterministic"`."""
    if torch.are_deterministic_algorithms_enabled() and settings.reduce != "deterministic":
        settings = RenderSettings(**{**vars(settings), "reduce": "deterministic"})
    context = default_context(means.device) if context is None else context
    c, n = len(cameras), means.shape[0]
    sized = cameras if isinstance(cameras, DeviceCameras) else cameras[0]
    h, w = sized.height, sized.width
    inputs = (means, quats, scales, opacities, colors)
    sh_coeffs = colors.shape[1] if colors.dim() == 3 else 0
    renderer = context.workspace.renderer(w, h, n, c, sh_coeffs, settings)
    # Warp views of the inputs and outputs, made once per memory (GaussianRenderer.bound)
    g = renderer.bound(("gaussians", n, *(t.data_ptr() for t in inputs)), lambda: check_gaussians(
        *(view(t, dt, (n,) if t.dim() < 3 else (n, sh_coeffs)) for t, dt in zip(inputs, INPUT_DTYPES))))
    # two allocations: the colour and depth images, and the alpha image, projected means
    # and radii, which a loop that keeps only the colours through its optimizer step frees
    block = context.empty((5 if depths else 3) * c * h * w)
    projected = context.empty(4 * c * n + c * h * w)
    plane = c * h * w * 4
    images = renderer.bound(("images", n, block.data_ptr(), projected.data_ptr(), depths), lambda: RenderImages(
        color=view(block, wp.vec3, (c, h, w)), alpha=view(projected, wp.float32, (c, h, w), 16 * c * n),
        depth=view(block, wp.float32, (c, h, w) if depths else (c, 0, 0), 3 * plane),
        expected_depth=view(block, wp.float32, (c, h, w) if depths else (c, 0, 0), 4 * plane),
        means2d=view(projected, wp.vec2, (c, n)), radii=view(projected, wp.vec2i, (c, n), 8 * c * n)))
    state = renderer.new_state(context.allocate)
    planes = None if surfaces is None else [Surface(view(surfaces[0], wp.vec3, (h, w), i * h * w * 12),
                                                    view(surfaces[1], wp.float32, (h, w), i * h * w * 4))
                                            for i in range(c)]
    with context.stream():
        status = renderer.forward(g, cameras, state, images, context.check, planes)
    means2d = projected.as_strided((c, n, 2), (2 * n, 2, 1))
    radii = projected.view(torch.int32).as_strided((c, n, 2), (2 * n, 2, 1), 2 * c * n)
    alpha = projected.as_strided((c, h, w, 1), (h * w, w, 1, 1), 4 * c * n)
    color = block.as_strided((c, h, w, 3), (3 * h * w, 3 * w, 3, 1))
    returned = (color, alpha)
    if depths:
        returned += tuple(block.as_strided((c, h, w), (h * w, w, 1), k * c * h * w) for k in (3, 4))
    if means2d_grad and sink is None:
        sink = Means2dSink(means2d.requires_grad_(True), absgrad_owner=means2d if settings.absgrad else None,
                           attached=True)
    sink_tensor = None if sink is None or sink.attached else sink.tensor()
    # saved by the node: the state's memory, the radii (in `projected`), the depths (the expected depth's backward)
    saved = (projected.detach(), *state.owners) + ((block.detach(),) if depths else ())
    if surfaces is not None:  # the backward reads both
        saved += tuple(t.detach() for t in surfaces)
        inputs += (surfaces[0],)
    out = _RenderGaussians.apply((returned, context, renderer, state, saved), sink, sink_tensor, *inputs)
    if not depths:
        out = (*out, None, None)
    return BatchRender(*out, means2d, radii, status)
