"""torch.autograd.Functions over arc_warp.mesh (the drop-in in :mod:`arc_warp_torch.mesh` wraps them).

Tensors cross into Warp without copies (cached non-owning views, ``RenderContext.view``) and
every launch runs on torch's current stream of the inputs' device (``RenderContext.stream``),
so no synchronisation is needed. Inputs arrive float32/int32, contiguous, with the ranks
nvdiffrast takes. Per call nothing is allocated on the Warp side: outputs, gradients and
a mip stack the backward reads are torch tensors (torch's caching allocator) that the
ops write into (``out=``), and scratch buffers and prepared launches live in the
context's ``Workspace``.
"""

from __future__ import annotations

import torch
import warp as wp

import arc_warp.mesh as core
from arc_warp_torch._autograd import default_context, view


def to_warp(t: torch.Tensor | None):
    """Zero-copy Warp view (no Warp-side gradient buffers) of a contiguous tensor, or None.

    Made from the pointer, so a size-1 axis whose torch stride is not the packed one (torch
    ignores it, Warp's contiguity check does not) still gives a contiguous Warp array. The
    view holds the tensor it reads (a contiguous copy where ``t`` was not contiguous)."""
    if t is None:
        return None
    wp.init()  # idempotent
    t = t.detach().contiguous()
    if t.numel() == 0:
        return wp.from_torch(t, requires_grad=False)
    a = wp.array(ptr=t.data_ptr(), dtype=wp.dtype_from_torch(t.dtype), shape=tuple(t.shape),
                 device=wp.device_from_torch(t.device))
    a._tensor = t  # the view keeps its (possibly copied) tensor alive, as wp.from_torch's do
    return a


def _view(context, t: torch.Tensor | None, dtype=wp.float32):
    """Non-owning Warp view, of the same shape, of a contiguous float32 (or, with
    ``dtype=wp.int32``, int32) tensor, or None (``context``: the caller's, unused)."""
    return None if t is None else view(t, dtype, tuple(t.shape))


def _workspace(context):
    """The ``workspace=`` of the core mesh ops: None for now, so each call plans afresh.
    The mesh plans (``arc_warp/_src/mesh/plan.py``) still read the old workspace's replay
    state, which the renderer-based ``Workspace`` no longer has; ``context.workspace`` goes
    back here once they are ported."""
    return None


def _dense(g: torch.Tensor | None) -> torch.Tensor | None:
    """An upstream gradient as a contiguous float32 tensor (a copy where torch handed an
    expanded or strided one, as ``out.sum().backward()`` does), or None. The caller keeps
    the result in a local until the launches that read it are queued: a Warp view does not
    keep its tensor alive."""
    return None if g is None else g.to(torch.float32).contiguous()


def _padded(t: torch.Tensor) -> int:
    return -(-t.numel() // 16) * 16


def _zeros(*like: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Zeroed float32 gradient buffers (the core ops add into them) shaped like each tensor
    of ``like`` (None for None). Those of non-leaf tensors (per-pixel intermediates) are cut
    from one ``torch.zeros``, one fill instead of one per buffer, each on a 64-byte
    boundary (vector views stay aligned); a leaf's gets its own, since it becomes the
    leaf's ``.grad`` and must not hold the others' memory."""
    shared = [t for t in like if t is not None and not t.is_leaf]
    flat = None
    if len(shared) > 1:
        flat = torch.zeros(sum(map(_padded, shared)), dtype=torch.float32, device=shared[0].device)
    out, start = [], 0
    for t in like:
        if t is None or flat is None or t.is_leaf:
            out.append(None if t is None else torch.zeros_like(t))
        else:
            out.append(flat[start:start + t.numel()].view(t.shape))
            start += _padded(t)
    return out


class Rasterize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pos, tri, resolution, ranges, grad_db, reduce):
        context = default_context(pos.device)
        h, w = resolution
        # range mode: a batch per ranges row (none without ranges: the core then says what is missing)
        batch = pos.shape[0] if pos.dim() == 3 else (0 if ranges is None else len(ranges))
        rast, rast_db = (pos.new_empty((batch, h, w, 4)) for _ in range(2))
        with context.stream():
            core.rasterize(_view(context, pos), _view(context, tri, wp.int32), resolution, ranges=ranges,
                           grad_db=grad_db, reduce=reduce, workspace=_workspace(context),
                           out=(_view(context, rast), _view(context, rast_db)))
        ctx.save_for_backward(pos, tri, rast)
        ctx.settings = ranges, grad_db, reduce
        if not grad_db:
            ctx.mark_non_differentiable(rast_db)
        return rast, rast_db

    @staticmethod
    def backward(ctx, g_rast, g_db):
        pos, tri, rast = ctx.saved_tensors
        ranges, grad_db, reduce = ctx.settings
        context = default_context(pos.device)
        # held in locals: the Warp views below do not keep a contiguous copy alive
        g_rast = _dense(g_rast)
        g_db = _dense(g_db) if grad_db else None
        grad, = _zeros(pos)
        with context.stream():
            core.rasterize_backward(_view(context, pos), _view(context, tri, wp.int32), _view(context, rast),
                                    _view(context, g_rast), _view(context, g_db), ranges=ranges,
                                    grad_pos=_view(context, grad), reduce=reduce, workspace=_workspace(context))
        return grad, None, None, None, None, None


class Interpolate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attr, rast, tri, rast_db, diff_attrs, reduce):
        context = default_context(attr.device)
        num_a = attr.shape[-1]
        num_d = 0 if diff_attrs is None else num_a if isinstance(diff_attrs, str) else len(diff_attrs)
        out = attr.new_empty((*rast.shape[:3], num_a))
        out_da = attr.new_empty((*rast.shape[:3], 2 * num_d))
        with context.stream():
            core.interpolate(_view(context, attr), _view(context, rast), _view(context, tri, wp.int32),
                             _view(context, rast_db), diff_attrs, reduce=reduce, workspace=_workspace(context),
                             out=(_view(context, out), _view(context, out_da)))
        ctx.save_for_backward(attr, rast, tri, rast_db)
        ctx.settings = diff_attrs, reduce
        return out, out_da

    @staticmethod
    def backward(ctx, g_out, g_da):
        attr, rast, tri, rast_db = ctx.saved_tensors
        diff_attrs, reduce = ctx.settings
        context = default_context(attr.device)
        attr_grad = ctx.needs_input_grad[0]  # e.g. fixed uvs: no scatter into them
        grads = _zeros(attr if attr_grad else None, rast, rast_db)
        g_out = _dense(g_out)
        g_da = _dense(g_da) if g_da is not None and g_da.numel() else None
        with context.stream():
            core.interpolate_backward(
                _view(context, attr), _view(context, rast), _view(context, tri, wp.int32),
                _view(context, g_out), _view(context, rast_db), _view(context, g_da), diff_attrs,
                *(_view(context, g) for g in grads), reduce=reduce, workspace=_workspace(context), attr_grad=attr_grad)
        return grads[0], grads[1], None, grads[2], None, None


class Texture(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tex, uv, uv_da, bias, mip, filter_mode, boundary_mode, max_mip_level, reduce):
        context = default_context(tex.device)
        w = [_view(context, t) for t in (tex, uv, uv_da, bias)]
        ctx.mip_data = None  # the memory of a mip stack built here, which the backward reads
        out = tex.new_empty((*uv.shape[:3], tex.shape[-1]))
        with context.stream():
            if mip is None and "mipmap" in core.resolve_filter_mode(filter_mode, uv_da is not None, bias is not None):
                ctx.mip_data = tex.new_empty(core.mip_shape(tex.shape, max_mip_level))
                mip = core.build_mip(w[0], max_mip_level, out=_view(context, ctx.mip_data),
                                     workspace=_workspace(context))
            core.texture(*w, mip=mip, filter_mode=filter_mode, boundary_mode=boundary_mode,
                         max_mip_level=max_mip_level, reduce=reduce, workspace=_workspace(context),
                         out=_view(context, out))
        ctx.save_for_backward(tex, uv, uv_da, bias)
        ctx.settings = mip, filter_mode, boundary_mode, max_mip_level, reduce
        return out

    @staticmethod
    def backward(ctx, g_out):
        tex, uv, uv_da, bias = ctx.saved_tensors
        mip, filter_mode, boundary_mode, max_mip_level, reduce = ctx.settings
        context = default_context(tex.device)
        tex_grad = ctx.needs_input_grad[0]  # e.g. a fixed texture: no texel scatter, no fold
        grads = _zeros(tex if tex_grad else None, uv, uv_da, bias)
        g_out = _dense(g_out)
        with context.stream():
            core.texture_backward(_view(context, tex), _view(context, uv), _view(context, g_out),
                                  _view(context, uv_da), _view(context, bias), mip, filter_mode, boundary_mode,
                                  max_mip_level, *(_view(context, g) for g in grads), reduce=reduce,
                                  workspace=_workspace(context), tex_grad=tex_grad)
        return (*grads, None, None, None, None, None)


class Antialias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, color, rast, pos, tri, topology_hash, pos_gradient_boost, reduce):
        context = default_context(color.device)
        out = torch.empty_like(color)
        with context.stream():
            if topology_hash is None:
                topology_hash = core.antialias_construct_topology_hash(to_warp(tri))
            core.antialias(_view(context, color), _view(context, rast), _view(context, pos),
                           _view(context, tri, wp.int32), topology_hash, pos_gradient_boost, reduce=reduce,
                           workspace=_workspace(context), out=_view(context, out))
        ctx.save_for_backward(color, rast, pos, tri)
        ctx.settings = topology_hash, pos_gradient_boost, reduce
        return out

    @staticmethod
    def backward(ctx, g_out):
        color, rast, pos, tri = ctx.saved_tensors
        topology_hash, boost, reduce = ctx.settings
        context = default_context(color.device)
        grad_color, grad_pos = _zeros(color, pos)
        g_out = _dense(g_out)
        with context.stream():
            core.antialias_backward(_view(context, color), _view(context, rast), _view(context, pos),
                                    _view(context, tri, wp.int32), _view(context, g_out), topology_hash,
                                    boost, grad_color=_view(context, grad_color), grad_pos=_view(context, grad_pos),
                                    reduce=reduce, workspace=_workspace(context))
        return grad_color, None, grad_pos, None, None, None, None
