"""torch.autograd.Functions over arc_warp.mesh's op objects (the drop-in in
:mod:`arc_warp_torch.mesh` wraps them).

Each thread holds one ``arc_warp.Workspace`` per device (:func:`workspace`), whose op
objects (``Rasterizer``, ``Interpolator``, ...) the ops of that thread reuse: ops issued
from several threads each get their own objects. Tensors cross into Warp without copies
(non-owning views made at each call, :func:`_view`; the tensors are held through the
launches that read them), and every launch runs on torch's current stream of the
tensors' device, so no synchronisation is needed. Outputs, gradients and a mip stack the
backward reads are torch tensors (torch's caching allocator) that the ops write into;
scratch buffers and prepared launches live in the op objects, so calls of one size
allocate no Warp memory. A forward's check of the triangle indices is read at once on
the CPU and, on CUDA, by the op object's next forward (``arc_warp.mesh``'s notes).
"""

from __future__ import annotations

import contextlib
import threading

import torch
import warp as wp

import arc_warp
import arc_warp.mesh as core

_DTYPES = {torch.float32: wp.float32, torch.int32: wp.int32}
_local = threading.local()  # .spaces: torch device -> this thread's arc_warp.Workspace


def workspace(device: torch.device) -> arc_warp.Workspace:
    """This thread's workspace on ``device`` (made on first use; on a GPU never calibrated
    its ARC threshold is calibrated then, once)."""
    spaces = getattr(_local, "spaces", None)
    if spaces is None:
        spaces = _local.spaces = {}
    ws = spaces.get(device)
    if ws is None:
        ws = spaces[device] = arc_warp.Workspace(wp.device_from_torch(device))
    return ws


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


def _stream(device: torch.device):
    """Warp's launches on torch's current stream of ``device`` for a block (no wait on
    Warp's previous stream: torch orders the work); nothing to do on the CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return wp.ScopedStream(wp.stream_from_torch(device), sync_enter=False)


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
        ws = workspace(pos.device)
        # range mode: a batch per ranges row (none without ranges: the core then says what is missing)
        batch = pos.shape[0] if pos.dim() == 3 else (0 if ranges is None else len(ranges))
        op = core.Rasterizer.of(ws, ws.device, resolution, batch, tri.shape[0], reduce=reduce)
        rast, rast_db = (pos.new_empty((batch, op.height, op.width, 4)) for _ in range(2))
        # the forward's views serve its backward too (the saved tensors hold their memory)
        ctx.views = _view(pos, ws.device), _view(tri, ws.device), _view(rast, ws.device)
        with _stream(pos.device):
            op.forward(ctx.views[0], ctx.views[1], ranges, (ctx.views[2], _view(rast_db, ws.device)))
        ctx.save_for_backward(pos, tri, rast)
        ctx.op, ctx.grad_db = op, grad_db
        if not grad_db:
            ctx.mark_non_differentiable(rast_db)
        return rast, rast_db

    @staticmethod
    def backward(ctx, g_rast, g_db):
        pos, tri, rast = ctx.saved_tensors
        device = ctx.op.device
        # held in locals: the Warp views below do not keep a contiguous copy alive
        g_rast = _dense(g_rast)
        g_db = _dense(g_db) if ctx.grad_db else None
        grad, = _zeros(pos)
        with _stream(pos.device):
            ctx.op.backward(*ctx.views, _view(g_rast, device), _view(g_db, device), _view(grad, device))
        return grad, None, None, None, None, None


class Interpolate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attr, rast, tri, rast_db, diff_attrs, reduce):
        ws = workspace(attr.device)
        op = core.Interpolator.of(ws, ws.device, *rast.shape[:3], attr.shape[-1], diff_attrs, reduce=reduce)
        out = attr.new_empty((*rast.shape[:3], op.num_attributes))
        out_da = attr.new_empty((*rast.shape[:3], 2 * op.num_diff))
        ctx.views = [_view(t, ws.device) for t in (attr, rast, tri, rast_db)]
        with _stream(attr.device):
            op.forward(*ctx.views, (_view(out, ws.device), _view(out_da, ws.device)))
        ctx.save_for_backward(attr, rast, tri, rast_db)
        ctx.op = op
        return out, out_da

    @staticmethod
    def backward(ctx, g_out, g_da):
        attr, rast, tri, rast_db = ctx.saved_tensors
        device = ctx.op.device
        attr_grad = ctx.needs_input_grad[0]  # e.g. fixed uvs: no scatter into them
        grads = _zeros(attr if attr_grad else None, rast, rast_db)
        g_out = _dense(g_out)
        g_da = _dense(g_da) if g_da is not None and g_da.numel() else None
        a, r, t, db = ctx.views
        with _stream(attr.device):
            ctx.op.backward(a, r, t, _view(g_out, device), db, _view(g_da, device),
                            *(_view(g, device) for g in grads), attr_grad=attr_grad)
        return grads[0], grads[1], None, grads[2], None, None


class Texture(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tex, uv, uv_da, bias, mip, filter_mode, boundary_mode, max_mip_level, reduce):
        ws = workspace(tex.device)
        mode = core.resolve_filter_mode(filter_mode, uv_da is not None, bias is not None)
        op = core.TextureSampler.of(ws, ws.device, *uv.shape[:3], tuple(tex.shape), mode, boundary_mode,
                                    max_mip_level, reduce=reduce)
        ctx.views = [_view(t, ws.device) for t in (tex, uv, uv_da, bias)]
        ctx.mip_data = None  # the memory of a mip stack built here, which the backward reads
        out = tex.new_empty((*uv.shape[:3], tex.shape[-1]))
        t, u, da, b = ctx.views
        with _stream(tex.device):
            if op.mip is not None and mip is None:
                ctx.mip_data = tex.new_empty(op.mip.shape)
                mip = op.mip.build(t, _view(ctx.mip_data, ws.device))
            op.forward(t, u, da, b, mip, _view(out, ws.device))
        ctx.save_for_backward(tex, uv, uv_da, bias)
        ctx.op, ctx.mip = op, mip
        return out

    @staticmethod
    def backward(ctx, g_out):
        tex, uv, uv_da, bias = ctx.saved_tensors
        device = ctx.op.device
        tex_grad = ctx.needs_input_grad[0]  # e.g. a fixed texture: no texel scatter, no fold
        grads = _zeros(tex if tex_grad else None, uv, uv_da, bias)
        g_out = _dense(g_out)
        t, u, da, b = ctx.views
        with _stream(tex.device):
            ctx.op.backward(t, u, _view(g_out, device), da, b, ctx.mip, *(_view(g, device) for g in grads),
                            tex_grad=tex_grad)
        return (*grads, None, None, None, None, None)


class Antialias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, color, rast, pos, tri, topology_hash, pos_gradient_boost, reduce):
        ws = workspace(color.device)
        op = core.Antialiaser.of(ws, ws.device, *color.shape, reduce=reduce)
        out = torch.empty_like(color)
        ctx.views = [_view(t, ws.device) for t in (color, rast, pos, tri)]
        with _stream(color.device):
            if topology_hash is None:
                topology_hash = core.antialias_construct_topology_hash(ctx.views[3])
            op.forward(*ctx.views, topology_hash, _view(out, ws.device))
        ctx.save_for_backward(color, rast, pos, tri)
        ctx.op, ctx.settings = op, (topology_hash, pos_gradient_boost)
        return out

    @staticmethod
    def backward(ctx, g_out):
        color, rast, pos, tri = ctx.saved_tensors
        device = ctx.op.device
        topology_hash, boost = ctx.settings
        grad_color, grad_pos = _zeros(color, pos)
        g_out = _dense(g_out)
        with _stream(color.device):
            ctx.op.backward(*ctx.views, _view(g_out, device), topology_hash, boost, _view(grad_color, device),
                            _view(grad_pos, device))
        return grad_color, None, grad_pos, None, None, None, None
