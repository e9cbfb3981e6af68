"""torch.autograd.Functions over arc_warp.mesh (the drop-in in :mod:`arc_warp_torch.mesh` wraps them).

Tensors cross into Warp without copies (``wp.from_torch`` / ``wp.to_torch``) and every
launch runs on torch's current stream of the inputs' device (``RenderContext.stream``), so no
synchronisation is needed. Inputs arrive float32/int32 and contiguous.
"""

from __future__ import annotations

import torch
import warp as wp

import arc_warp.mesh as core
from arc_warp_torch._autograd import default_context


def to_warp(t: torch.Tensor | None):
    """Zero-copy Warp view (no Warp-side gradient buffers) of a contiguous tensor, or None.

    Made from the pointer, so a size-1 axis whose torch stride is not the packed one (torch
    ignores it, Warp's contiguity check does not) still gives a contiguous Warp array. The
    view does not keep ``t`` alive; the autograd Function holds it for the call."""
    if t is None:
        return None
    wp.init()  # idempotent
    t = t.detach().contiguous()
    if t.numel() == 0:
        return wp.from_torch(t, requires_grad=False)
    return wp.array(ptr=t.data_ptr(), dtype=wp.dtype_from_torch(t.dtype), shape=tuple(t.shape),
                    device=wp.device_from_torch(t.device))


def to_torch(a) -> torch.Tensor | None:
    return None if a is None else wp.to_torch(a, requires_grad=False)


class Rasterize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pos, tri, resolution, ranges, grad_db, reduce):
        with default_context(pos.device).stream():
            rast, rast_db = core.rasterize(to_warp(pos), to_warp(tri), resolution, ranges=ranges, grad_db=grad_db,
                                           reduce=reduce)
        out, out_db = to_torch(rast), to_torch(rast_db)
        ctx.save_for_backward(pos, tri, out)
        ctx.settings = ranges, grad_db, reduce
        if not grad_db:
            ctx.mark_non_differentiable(out_db)
        return out, out_db

    @staticmethod
    def backward(ctx, g_rast, g_db):
        pos, tri, rast = ctx.saved_tensors
        ranges, grad_db, reduce = ctx.settings
        g_db = g_db.contiguous() if grad_db and g_db is not None else None
        with default_context(pos.device).stream():
            grad = core.rasterize_backward(to_warp(pos), to_warp(tri), to_warp(rast), to_warp(g_rast.contiguous()),
                                           to_warp(g_db), ranges=ranges, reduce=reduce)
        return to_torch(grad), None, None, None, None, None


class Interpolate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attr, rast, tri, rast_db, diff_attrs, reduce):
        with default_context(attr.device).stream():
            out, out_da = core.interpolate(to_warp(attr), to_warp(rast), to_warp(tri), to_warp(rast_db), diff_attrs,
                                           reduce=reduce)
        ctx.save_for_backward(attr, rast, tri, rast_db)
        ctx.settings = diff_attrs, reduce
        return to_torch(out), to_torch(out_da)

    @staticmethod
    def backward(ctx, g_out, g_da):
        attr, rast, tri, rast_db = ctx.saved_tensors
        diff_attrs, reduce = ctx.settings
        with default_context(attr.device).stream():
            ga, gr, gdb = core.interpolate_backward(
                to_warp(attr), to_warp(rast), to_warp(tri), to_warp(g_out.contiguous()), to_warp(rast_db),
                to_warp(g_da.contiguous()) if g_da is not None and g_da.numel() else None, diff_attrs, reduce=reduce)
        return to_torch(ga), to_torch(gr), None, to_torch(gdb), None, None


class Texture(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tex, uv, uv_da, bias, mip, filter_mode, boundary_mode, max_mip_level, reduce):
        w = [to_warp(t) for t in (tex, uv, uv_da, bias)]
        with default_context(tex.device).stream():
            if mip is None and "mipmap" in core.resolve_filter_mode(filter_mode, uv_da is not None, bias is not None):
                mip = core.build_mip(w[0], max_mip_level)  # kept for the backward
            out = core.texture(*w, mip=mip, filter_mode=filter_mode, boundary_mode=boundary_mode,
                               max_mip_level=max_mip_level, reduce=reduce)
        ctx.save_for_backward(tex, uv, uv_da, bias)
        ctx.settings = mip, filter_mode, boundary_mode, max_mip_level, reduce
        return to_torch(out)

    @staticmethod
    def backward(ctx, g_out):
        tex, uv, uv_da, bias = ctx.saved_tensors
        mip, filter_mode, boundary_mode, max_mip_level, reduce = ctx.settings
        with default_context(tex.device).stream():
            grads = core.texture_backward(to_warp(tex), to_warp(uv), to_warp(g_out.contiguous()), to_warp(uv_da),
                                          to_warp(bias), mip, filter_mode, boundary_mode, max_mip_level,
                                          reduce=reduce)
        return (*(to_torch(g) for g in grads), None, None, None, None, None)


class Antialias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, color, rast, pos, tri, topology_hash, pos_gradient_boost, reduce):
        with default_context(color.device).stream():
            if topology_hash is None:
                topology_hash = core.antialias_construct_topology_hash(to_warp(tri))
            out = core.antialias(to_warp(color), to_warp(rast), to_warp(pos), to_warp(tri), topology_hash,
                                 pos_gradient_boost, reduce=reduce)
        ctx.save_for_backward(color, rast, pos, tri)
        ctx.settings = topology_hash, pos_gradient_boost, reduce
        return to_torch(out)

    @staticmethod
    def backward(ctx, g_out):
        color, rast, pos, tri = ctx.saved_tensors
        topology_hash, boost, reduce = ctx.settings
        with default_context(color.device).stream():
            gc, gp = core.antialias_backward(to_warp(color), to_warp(rast), to_warp(pos), to_warp(tri),
                                             to_warp(g_out.contiguous()), topology_hash, boost, reduce=reduce)
        return to_torch(gc), None, to_torch(gp), None, None, None, None
