"""The torch.autograd bridge: one camera through `arc_warp.render_gaussians`.

Tensors cross into Warp without copies (`wp.from_torch` / `wp.to_torch`) and every Warp
launch runs on torch's current stream of the tensors' device, so torch and Warp work stays
ordered without synchronisation. Callers (`rasterization`, `GaussianRasterizer`) validate
and convert their inputs first; this module assumes float32, contiguous, same-device tensors.
"""

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import warp as wp

from arc_warp import (Camera, GaussianGrads, RenderSettings, render_gaussians,
                      render_gaussians_backward)


# CUDA devices whose Warp memory pool this module has configured (once per device).
_pool_configured: set = set()

POOL_RELEASE_FRACTION = 0.5
"""Share of device memory Warp's stream-ordered pool keeps after a synchronize.

CUDA's default (0) hands every freed block back at each sync, and each training step
syncs once (to size the tile sort), so every step would re-allocate its buffers from the
driver. Torch's caching allocator keeps memory the same way. Applied on first CUDA use,
only if the pool is still at CUDA's default; set your own with
``wp.set_mempool_release_threshold`` beforehand to override."""


def warp_stream(device: torch.device):
    """Context that makes Warp launch on torch's current stream of `device` (no-op on CPU).

    Also initialises Warp (idempotent), which wp.from_torch needs, and on first use of a
    CUDA device sets its pool release threshold (see POOL_RELEASE_FRACTION)."""
    wp.init()
    if device.type != "cuda":
        return contextlib.nullcontext()
    wdev = wp.device_from_torch(device)
    if wdev.alias not in _pool_configured:
        _pool_configured.add(wdev.alias)
        if wdev.is_mempool_supported and wp.get_mempool_release_threshold(wdev) == 0:
            wp.set_mempool_release_threshold(wdev, POOL_RELEASE_FRACTION)
    return wp.ScopedStream(wp.stream_from_torch(device))


def check_tensor(name: str, t, shape: tuple, device: Optional[torch.device] = None) -> torch.Tensor:
    """Validate a public tensor argument and return it as float32, contiguous.

    `shape` holds ints (exact size), None (any size) or str (a named size that must agree
    across arguments is checked by the caller). Raises TypeError for non-tensors and
    non-floating dtypes, ValueError for wrong shapes or devices. The dtype cast and the
    contiguity copy are autograd-tracked and happen only when needed.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and not isinstance(s, str) and s != d
                                    for s, d in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected a cpu or cuda tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device} (that of `means`), got {t.device}")
    if t.dtype != torch.float32:
        t = t.to(torch.float32)
    return t.contiguous()


@dataclass
class Means2dSink:
    """Where the screen-space gradient of the projected means goes in backward.

    `tensor` (N, D>=2) is passed to the autograd function as an input, so torch adds
    dL/d(means2d) (pixels, times `scale` per axis) into its .grad; columns past 2 get 0.
    If `absgrad_owner` is given, the per-Gaussian |dL/d(means2d)| summed over pixels is
    added into `absgrad_owner.absgrad[absgrad_index]` (created on first use).
    """

    tensor: torch.Tensor
    scale: Tuple[float, float] = (1.0, 1.0)
    absgrad_owner: Optional[torch.Tensor] = None
    absgrad_index: Optional[int] = None


@dataclass
class CameraRender:
    """Torch views of one camera's `RenderOutput` (float32 unless noted, on the input device)."""

    color: torch.Tensor  # [H, W, 3] without background
    alpha: torch.Tensor  # [H, W]
    depth: torch.Tensor  # [H, W] sum of w_i z_i
    expected_depth: torch.Tensor  # [H, W] depth / alpha, 0 where alpha == 0
    means2d: torch.Tensor  # [N, 2] pixels, not differentiable (see Means2dSink)
    radii: torch.Tensor  # [N, 2] int32 pixels, (0, 0) = culled


# Warp element types of (means, quats, scales, opacities, colors), vectors on the last axis.
INPUT_DTYPES = (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3)


def _to_warp(t: torch.Tensor, dtype) -> wp.array:
    """Zero-copy Warp view of a float32 contiguous tensor whose last axis packs `dtype`.

    requires_grad=False: gradients come from render_gaussians_backward, and Warp must not
    attach .grad buffers to the caller's tensors."""
    return wp.from_torch(t, dtype=dtype, requires_grad=False)


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
    """(means, quats, scales, opacities, colors) -> (color, alpha, depth, expected_depth,
    means2d, radii) for one camera; backward calls render_gaussians_backward."""

    @staticmethod
    def forward(ctx, camera, settings, sink, sink_tensor, means, quats, scales, opacities, colors):
        ctx.set_materialize_grads(False)
        with warp_stream(means.device):
            inputs = (means, quats, scales, opacities, colors)
            out = render_gaussians(*(_to_warp(t, dt) for t, dt in zip(inputs, INPUT_DTYPES)),
                                   camera, settings)
        color = wp.to_torch(out.color, requires_grad=False)
        alpha = wp.to_torch(out.alpha, requires_grad=False)
        depth = wp.to_torch(out.depth, requires_grad=False)
        expected_depth = wp.to_torch(out.expected_depth, requires_grad=False)
        means2d = wp.to_torch(out.means2d, requires_grad=False)
        radii = wp.to_torch(out.radii, requires_grad=False)
        ctx.mark_non_differentiable(means2d, radii)
        # Saved only so torch raises if anything the Warp backward reads was modified in place.
        ctx.save_for_backward(means, quats, scales, opacities, colors, color, alpha, depth,
                              expected_depth)
        ctx.out, ctx.sink = out, sink
        return color, alpha, depth, expected_depth, means2d, radii

    @staticmethod
    def backward(ctx, g_color, g_alpha, g_depth, g_expected_depth, _g_means2d, _g_radii):
        saved = ctx.saved_tensors
        # Under create_graph=True, hand back grads whose own backward raises (as
        # torch's once_differentiable does, with a message naming this renderer).
        guard = torch.is_grad_enabled() and any(g is not None and g.requires_grad for g in
                                                (g_color, g_alpha, g_depth, g_expected_depth))

        def wrap(g):
            return _RaiseOnDoubleBackward.apply(g.detach().requires_grad_(True)) if guard else g

        with torch.no_grad():
            grads, means2d_grad = _warp_backward(ctx.out, saved[:5], ctx.sink,
                                                 (g_color, g_alpha, g_depth, g_expected_depth))
        result = [None, None, None, None]
        if ctx.sink is not None and ctx.needs_input_grad[3]:
            result[3] = wrap(means2d_grad)
        for i, g in enumerate(grads):
            result.append(wrap(g) if ctx.needs_input_grad[4 + i] else None)
        return tuple(result)


def _warp_backward(out, inputs, sink, output_grads):
    """Run render_gaussians_backward on torch cotangents; return torch grads shaped like
    `inputs` and the sink's means2d gradient (None without a sink)."""
    device = inputs[0].device
    out_dtypes = (wp.vec3, wp.float32, wp.float32, wp.float32)
    # torch owns the gradient memory (its allocator, its stream); Warp adds into it.
    torch_grads = tuple(torch.zeros_like(t) for t in inputs)
    with warp_stream(device):
        wg = [None if g is None else _to_warp(g.to(torch.float32).contiguous(), dt)
              for g, dt in zip(output_grads, out_dtypes)]
        # The renderer accumulates into these; a second backward (retain_graph) starts at 0.
        for buf in (out.means2d_grad, out.means2d_absgrad):
            if buf is not None:
                buf.zero_()
        into = GaussianGrads(*(_to_warp(g, dt) for g, dt in zip(torch_grads, INPUT_DTYPES)))
        render_gaussians_backward(out, *wg, grads=into)
    if sink is None:
        return torch_grads, None
    scale = torch.tensor(sink.scale, dtype=torch.float32, device=device)
    m2d = wp.to_torch(out.means2d_grad, requires_grad=False) * scale
    target = sink.tensor
    if target.shape[-1] > 2:
        m2d = torch.cat([m2d, m2d.new_zeros(m2d.shape[0], target.shape[-1] - 2)], dim=-1)
    m2d = m2d.to(target.dtype)
    if sink.absgrad_owner is not None:
        absgrad = wp.to_torch(out.means2d_absgrad, requires_grad=False) * scale
        owner = sink.absgrad_owner
        if getattr(owner, "absgrad", None) is None:
            owner.absgrad = torch.zeros_like(owner, requires_grad=False)
        owner.absgrad[sink.absgrad_index] += absgrad.to(owner.dtype)
    return torch_grads, m2d


def render_camera(means: torch.Tensor,  # [N, 3] float32
                  quats: torch.Tensor,  # [N, 4] float32 wxyz
                  scales: torch.Tensor,  # [N, 3] float32 linear
                  opacities: torch.Tensor,  # [N] float32 in [0, 1]
                  colors: torch.Tensor,  # [N, 3] RGB or [N, K, 3] SH, float32
                  camera: Camera,
                  settings: RenderSettings,
                  sink: Optional[Means2dSink] = None) -> CameraRender:
    """Differentiable render of one camera; inputs must be float32, contiguous, on one
    cpu/cuda device (use `check_tensor`). `settings.absgrad` must be True when the sink
    has an `absgrad_owner`. Under `torch.use_deterministic_algorithms(True)` the backward
    reduces with `reduce="deterministic"` whatever `settings.reduce` says."""
    if torch.are_deterministic_algorithms_enabled() and settings.reduce != "deterministic":
        settings = dataclasses.replace(settings, reduce="deterministic")
    sink_tensor = None if sink is None else sink.tensor
    color, alpha, depth, expected_depth, means2d, radii = _RenderGaussians.apply(
        camera, settings, sink, sink_tensor, means, quats, scales, opacities, colors)
    return CameraRender(color, alpha, depth, expected_depth, means2d, radii)
