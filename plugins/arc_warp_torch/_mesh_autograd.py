"""torch.autograd.Functions over arc_warp.mesh's op objects (the drop-in in
:mod:`arc_warp_torch.mesh` wraps them).

The op objects (``Rasterizer``, ``Interpolator``, ...) are those of the workspace of the
thread's default ``RenderContext`` on the tensors' device (``default_context(device)``,
the one the splat path renders with), so ops issued from several threads each get
their own. Tensors cross into Warp without copies: non-owning views, bound in the op
object by the tensors' pointers and shapes (``op.bound``), so a call on memory it saw
before makes none, and the op replays the launches it recorded for that memory. The
tensors are held through the launches that read them, and every launch runs on
torch's current stream of the tensors' device (``RenderContext.stream``), so no
synchronisation is needed. Outputs, gradients, contiguous copies of cotangents and a
mip stack the backward reads are torch tensors the ops write into
(``RenderContext.empty``: torch's caching allocator on CUDA, blocks kept for the next
call on the CPU, so a repeated call gets its memory back on both); scratch buffers live
in the op objects, so calls of one size allocate no Warp memory. A forward's check of
the triangle indices is read at once on the CPU and, on CUDA, by the op object's next
forward (``arc_warp.mesh``'s notes).
"""

from __future__ import annotations

import torch
import warp as wp

import arc_warp.mesh as core
from arc_warp_torch._autograd import default_context

_DTYPES = {torch.float32: wp.float32, torch.int32: wp.int32}


def to_warp(t: torch.Tensor | None):
    """Zero-copy Warp view (no Warp-side gradient buffers) of a float32 or int32 tensor, or
    None; the view holds the tensor it reads (a contiguous copy where ``t`` was not
    contiguous)."""
    if t is None:
        return None
    wp.init()  # idempotent
    t = t.detach().contiguous()
    a = _view(t, wp.device_from_torch(t.device))
    a._tensor = t
    return a


def _view(t: torch.Tensor | None, device) -> wp.array | None:
    """Non-owning Warp view of a contiguous float32/int32 tensor of the same shape, or None.

    Made from the pointer, so a size-1 axis whose torch stride is not the packed one (torch
    ignores it, Warp's contiguity check does not) still gives a contiguous Warp array. The
    caller keeps ``t`` alive until the launches that read it are queued."""
    if t is None:
        return None
    return wp.array(ptr=t.data_ptr(), dtype=_DTYPES[t.dtype], shape=t.shape, device=device)


def _views(op, kind: str, *tensors: torch.Tensor | None) -> list:
    """Warp views of ``tensors`` (None for None), made once per memory in ``op``'s
    bindings (key: ``kind`` and each tensor's pointer and shape; each argument of a call
    has one dtype)."""
    key = (kind, *(None if t is None else (t.data_ptr(), t.shape) for t in tensors))
    return op.bound(key, lambda: [_view(t, op.device) for t in tensors])


def _dense(context, g: torch.Tensor | None) -> torch.Tensor | None:
    """An upstream gradient as a contiguous float32 tensor (a copy, in the context's memory,
    where torch handed an expanded or strided one, as ``out.sum().backward()`` does), or
    None. The caller keeps the result in a local until the launches that read it are
    queued: a Warp view does not keep its tensor alive."""
    if g is None or (g.dtype is torch.float32 and g.is_contiguous()):
        return g
    return context.empty(g.shape).copy_(g)


def _padded(t: torch.Tensor) -> int:
    return -(-t.numel() // 16) * 16


def _zeros(context, *like: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Zeroed float32 gradient buffers (the core ops add into them) shaped like each tensor
    of ``like`` (None for None). Those of non-leaf tensors (per-pixel intermediates) are cut
    from one allocation, one fill instead of one per buffer, each on a 64-byte boundary
    (vector views stay aligned); a leaf's gets its own, since it becomes the leaf's
    ``.grad`` and must not hold the others' memory."""
    shared = [t for t in like if t is not None and not t.is_leaf]
    flat = None
    if len(shared) > 1:
        flat = context.empty(sum(map(_padded, shared))).zero_()
    out, start = [], 0
    for t in like:
        if t is None or flat is None or t.is_leaf:
            out.append(None if t is None else context.empty(t.shape).zero_())
        else:
            out.append(flat[start:start + t.numel()].view(t.shape))
            start += _padded(t)
    return out


class Rasterize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pos, tri, resolution, ranges, grad_db, reduce):
        context = default_context(pos.device)
        # range mode: a batch per ranges row (none without ranges: the core then says what is missing)
        batch = pos.shape[0] if pos.dim() == 3 else (0 if ranges is None else len(ranges))
        op = core.Rasterizer.of(context.workspace, context.wp_device, resolution, batch, tri.shape[0], reduce=reduce)
        rast, rast_db = (context.empty((batch, op.height, op.width, 4)) for _ in range(2))
        views = _views(op, "forward", pos, tri, rast, rast_db)
        with context.stream():
            op.forward(views[0], views[1], ranges, views[2:])
        ctx.save_for_backward(pos, tri, rast)
        ctx.context, ctx.op, ctx.views, ctx.grad_db = context, op, views[:3], grad_db  # (the backward's views too)
        if not grad_db:
            ctx.mark_non_differentiable(rast_db)
        return rast, rast_db

    @staticmethod
    def backward(ctx, g_rast, g_db):
        pos, tri, rast = ctx.saved_tensors
        context = ctx.context
        # held in locals: the Warp views below do not keep a contiguous copy alive
        g_rast = _dense(context, g_rast)
        g_db = _dense(context, g_db) if ctx.grad_db else None
        grad, = _zeros(context, pos)
        with context.stream():
            ctx.op.backward(*ctx.views, *_views(ctx.op, "backward", g_rast, g_db, grad))
        return grad, None, None, None, None, None


class Interpolate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attr, rast, tri, rast_db, diff_attrs, reduce):
        context = default_context(attr.device)
        op = core.Interpolator.of(context.workspace, context.wp_device, *rast.shape[:3], attr.shape[-1], diff_attrs,
                                  reduce=reduce)
        out = context.empty((*rast.shape[:3], op.num_attributes))
        out_da = context.empty((*rast.shape[:3], 2 * op.num_diff))
        views = _views(op, "forward", attr, rast, tri, rast_db, out, out_da)
        with context.stream():
            op.forward(*views[:4], views[4:])
        ctx.save_for_backward(attr, rast, tri, rast_db)
        ctx.context, ctx.op, ctx.views = context, op, views[:4]
        return out, out_da

    @staticmethod
    def backward(ctx, g_out, g_da):
        attr, rast, tri, rast_db = ctx.saved_tensors
        context = ctx.context
        attr_grad = ctx.needs_input_grad[0]  # e.g. fixed uvs: no scatter into them
        grads = _zeros(context, attr if attr_grad else None, rast, rast_db)
        g_out = _dense(context, g_out)
        g_da = _dense(context, g_da) if g_da is not None and g_da.numel() else None
        a, r, t, db = ctx.views
        go, gda, *gs = _views(ctx.op, "backward", g_out, g_da, *grads)
        with context.stream():
            ctx.op.backward(a, r, t, go, db, gda, *gs, attr_grad=attr_grad)
        return grads[0], grads[1], None, grads[2], None, None


class Texture(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tex, uv, uv_da, bias, mip, filter_mode, boundary_mode, max_mip_level, reduce):
        context = default_context(tex.device)
        mode = core.resolve_filter_mode(filter_mode, uv_da is not None, bias is not None)
        op = core.TextureSampler.of(context.workspace, context.wp_device, *uv.shape[:3], tuple(tex.shape), mode,
                                    boundary_mode, max_mip_level, reduce=reduce)
        out = context.empty((*uv.shape[:3], tex.shape[-1]))
        ctx.mip_data = None  # the memory of a mip stack built here, which the backward reads
        if op.mip is not None and mip is None:
            ctx.mip_data = context.empty(op.mip.shape)
        views = _views(op, "forward", tex, uv, uv_da, bias, out, ctx.mip_data)
        t, u, da, b, o, stack = views
        with context.stream():
            if stack is not None:
                mip = op.mip.build(t, stack)
            op.forward(t, u, da, b, mip, o)
        ctx.save_for_backward(tex, uv, uv_da, bias)
        ctx.context, ctx.op, ctx.mip, ctx.views = context, op, mip, views[:4]
        return out

    @staticmethod
    def backward(ctx, g_out):
        tex, uv, uv_da, bias = ctx.saved_tensors
        context = ctx.context
        tex_grad = ctx.needs_input_grad[0]  # e.g. a fixed texture: no texel scatter, no fold
        grads = _zeros(context, tex if tex_grad else None, uv, uv_da, bias)
        g_out = _dense(context, g_out)
        t, u, da, b = ctx.views
        go, *gs = _views(ctx.op, "backward", g_out, *grads)
        with context.stream():
            ctx.op.backward(t, u, go, da, b, ctx.mip, *gs, tex_grad=tex_grad)
        return (*grads, None, None, None, None, None)


class Antialias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, color, rast, pos, tri, topology_hash, pos_gradient_boost, reduce):
        context = default_context(color.device)
        op = core.Antialiaser.of(context.workspace, context.wp_device, *color.shape, reduce=reduce)
        out = context.empty(color.shape)
        views = _views(op, "forward", color, rast, pos, tri, out)
        with context.stream():
            if topology_hash is None:
                topology_hash = core.antialias_construct_topology_hash(views[3])
            op.forward(*views[:4], topology_hash, views[4])
        ctx.save_for_backward(color, rast, pos, tri)
        ctx.context, ctx.op, ctx.views = context, op, views[:4]
        ctx.settings = topology_hash, pos_gradient_boost
        return out

    @staticmethod
    def backward(ctx, g_out):
        color, rast, pos, tri = ctx.saved_tensors
        context = ctx.context
        topology_hash, boost = ctx.settings
        grad_color, grad_pos = _zeros(context, color, pos)
        g_out = _dense(context, g_out)
        go, gc, gp = _views(ctx.op, "backward", g_out, grad_color, grad_pos)
        with context.stream():
            ctx.op.backward(*ctx.views, go, topology_hash, boost, gc, gp)
        return grad_color, None, grad_pos, None, None, None, None
