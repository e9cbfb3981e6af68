"""Launches of the rasteriser: forward (depth test + resolve) and the ARC backward into positions."""

from __future__ import annotations

import functools

import numpy as np
import warp as wp

from arc_warp._src.mesh.common import (
    BLOCK,
    absent,
    check_shape,
    float_array,
    cotangent,
    grad_or_new,
    output,
    record,
    reduce_settings,
    scratch,
    tiled_dim,
    vec4_view,
    zeros_once,
)
from arc_warp._src.mesh.geometry import geometry
from arc_warp._src.mesh.plan import Plan, pair, prepared
from arc_warp._src.validate import check_resolution
from arc_warp._src.mesh.raster_kernels import (
    EMPTY_KEY,
    make_raster_bwd,
    raster_big,
    raster_depth,
    raster_resolve,
    viewport_tile,
)


@functools.lru_cache(maxsize=64)
def _pixel_grid(height: int, width: int) -> tuple[float, float, float, float]:
    """(xs, xo, ys, yo): NDC of pixel centre x is xs * x + xo, rounded to float32 as nvdiffrast."""
    f = np.float32
    return (float(f(2.0) / f(width)), float(f(1.0) / f(width) - f(1.0)),
            float(f(2.0) / f(height)), float(f(1.0) / f(height) - f(1.0)))


def rasterize(
    pos: wp.array,  # [V, 4] (range mode) or [B, V, 4] float32, clip space
    tri: wp.array,  # [F, 3] int32
    resolution,  # (height, width)
    ranges=None,  # [B, 2] int32 (start, count) into tri, range mode only
    grad_db: bool = True,
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace: scratch buffers and launches kept across calls
    out: tuple[wp.array, wp.array] | None = None,  # (rast, rast_db) [B, H, W, 4] float32 to write
) -> tuple[wp.array, wp.array]:
    """Rasterises triangles with nvdiffrast 0.4 semantics.

    Conventions: pixel (x, y) has its centre at NDC ((2x + 1)/W - 1, (2y + 1)/H - 1), so
    image row 0 is at NDC y = -1 (nvdiffrast's bottom-up memory order). Barycentrics are
    perspective-correct; u weights vertex 0 and v vertex 1. Both faces are drawn.

    Coverage and depth test are nvdiffrast's CUDA rasteriser's, so each pixel gets the
    triangle nvdiffrast gives it: triangles are clipped to the view frustum
    (|x|, |y|, |z| <= w) and their vertices snapped to a 1/16-pixel grid; a pixel is
    covered when its centre is inside the snapped triangle (exact integer edge tests; a
    centre on a shared edge belongs to exactly one of the two triangles). The nearest
    depth wins, in nvdiffrast's 32-bit fixed point of z/w; ties go to the later
    triangle. It is a 64-bit (depth | id) atomic min, so ``rast`` has the same bits on
    every run. u, v and z/w are then computed from the unsnapped positions (u, v stay
    relative to the original triangle, also where it was clipped). Triangles with zero
    area after snapping, all w <= 0, any vertex index outside [0, V), or any
    non-finite coordinate are not drawn and get no gradient.

    Args:
        grad_db: propagate gradients of ``rast_db`` into ``pos`` (tape and
            :func:`rasterize_backward`).
        reduce: accumulation mode of the backward (``atomic``/``warp``/``serial``/``arc``/``floor``).
        threshold: ARC threshold override (default: the workspace's, else calibrated per GPU).
        workspace: keeps the depth keys and the big-triangle queue, and the prepared
            launches, across calls (the backward of the tape uses it too).
        out: arrays to write ``rast`` and ``rast_db`` into instead of new ones.

    Returns:
        ``(rast, rast_db)``, float32 [B, H, W, 4]: (u, v, z/w, triangle_id + 1; all 0 where
        empty) and (du/dX, du/dY, dv/dX, dv/dY) in pixel units. In range mode
        triangle ids index the whole ``tri``. Recorded on an active ``wp.Tape`` when
        ``pos.requires_grad``.
    """
    given = (None, None) if out is None else out
    plan, reused = prepared(workspace, "rasterize", (pos, tri), pair(given),
                            (resolution, ranges, reduce, threshold),
                            lambda plan: _plan_forward(plan, pos, tri, resolution, ranges, reduce, threshold, given))
    plan.run()
    rast, rast_db = given if reused else plan.result
    mode, ws = plan.mode, workspace  # as checked by the build

    def backward():
        rasterize_backward(pos, tri, rast, rast.grad, rast_db.grad if grad_db else None,
                           ranges=ranges, grad_pos=pos.grad, reduce=mode, threshold=threshold, workspace=ws)

    record([pos], [rast, rast_db], backward)
    return rast, rast_db


def _plan_forward(plan: Plan, pos, tri, resolution, ranges, reduce, threshold, out) -> None:
    """Checks a rasterize call and queues its work; ``plan.result`` = (rast, rast_db),
    ``plan.mode`` the backward's accumulation mode."""
    geom = geometry(pos, tri, ranges, plan.workspace)
    ws = geom.workspace
    height, width = check_resolution(resolution)
    plan.mode, _ = reduce_settings(reduce, threshold, pos.device, ws)
    shape = (geom.batch, height, width, 4)
    rast = output(out[0], "out[0] (rast)", shape, pos.device)
    rast_db = output(out[1], "out[1] (rast_db)", shape, pos.device)
    device = geom.pos.device
    b = geom.batch
    keys = scratch(ws, "mesh_raster_keys", (b, height, width), wp.int64, device)
    big_count = scratch(ws, "mesh_raster_big_count", 1, wp.int32, device)
    plan.step(functools.partial(_clear, keys, big_count))
    xs, xo, ys, yo = _pixel_grid(height, width)
    if geom.max_count > 0:
        # triangles with big pixel boxes are queued and tested per pixel (no host readback)
        big = scratch(ws, "mesh_raster_big", b * geom.max_count, wp.vec4i, device)
        big_box = scratch(ws, "mesh_raster_big_box", b * geom.max_count, wp.vec4i, device)
        tile = wp.vec2i(viewport_tile(width), viewport_tile(height))
        plan.launch(raster_depth, (b, geom.max_count), [geom.pos, geom.tri, geom.ranges, geom.instanced, width,
                                                        height, tile, keys, big, big_box, big_count], device)
        plan.launch(raster_big, (b, height, width), [geom.pos, geom.tri, geom.instanced, width, height, tile, big,
                                                     big_box, big_count, keys], device)
    plan.launch(raster_resolve, (b, height, width), [keys, geom.pos, geom.tri, geom.instanced, xs, xo, ys, yo,
                                                      vec4_view(ws, rast), vec4_view(ws, rast_db), big_count], device)
    plan.step(functools.partial(setattr, keys, "mesh_cleared", big_count))
    plan.result = rast, rast_db


def _clear(keys: wp.array, big_count: wp.array) -> None:
    """Leaves the (B, H, W) int64 depth keys all EMPTY_KEY and the (1,) int32 big-triangle
    count 0. raster_resolve leaves them so, so a workspace's pair is filled only when new
    (or when the last call did not reach the resolve); the mark is the keys'
    ``mesh_cleared`` attribute, naming the count it was cleared with, set again once the
    resolve is queued."""
    if getattr(keys, "mesh_cleared", None) is not big_count:
        keys.fill_(EMPTY_KEY)
        big_count.zero_()
    keys.mesh_cleared = None


def rasterize_backward(
    pos: wp.array,  # as given to rasterize
    tri: wp.array,
    rast: wp.array,  # [B, H, W, 4] from rasterize
    grad_rast: wp.array | None,  # [B, H, W, 4] dL/drast (channels 0, 1 are used)
    grad_rast_db: wp.array | None = None,  # [B, H, W, 4] dL/drast_db, None = zero
    ranges=None,
    grad_pos: wp.array | None = None,  # adds into this ([V, 4] / [B, V, 4]) if given
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace (see rasterize)
) -> wp.array:
    """Gradient of a loss w.r.t. ``pos`` through the barycentrics (and their pixel derivatives).

    Only (u, v) and ``rast_db`` carry gradients, as in nvdiffrast (z/w and the triangle id
    are not differentiable; visibility changes are :func:`antialias`'s job). They are
    those of the forward's u, v, clamped to the triangle (unlike nvdiffrast's backward,
    which differentiates the unclamped ones); the clamp acts where snapped coverage puts
    a pixel centre outside its exact triangle. The
    per-pixel contributions to the three vertices of each pixel's triangle are summed
    with the ``reduce`` accumulator. Returns ``grad_pos`` (new if None), shaped like pos:
    x, y, w components; z gets none.
    """
    plan, reused = prepared(workspace, "rasterize_backward", (pos, tri, rast, grad_rast, grad_rast_db), (grad_pos,),
                            (ranges, reduce, threshold),
                            lambda plan: _plan_backward(plan, pos, tri, rast, grad_rast, grad_rast_db, ranges,
                                                        grad_pos, reduce, threshold))
    plan.run()
    return grad_pos if reused else plan.result


def _plan_backward(plan: Plan, pos, tri, rast, grad_rast, grad_rast_db, ranges, grad_pos, reduce, threshold) -> None:
    """Checks a rasterize_backward call and queues its work; ``plan.result`` = grad_pos."""
    geom = geometry(pos, tri, ranges, plan.workspace)
    ws = geom.workspace
    device = pos.device
    rast = float_array(rast, "rast", (4,), 4, device)
    b, height, width = geom.batch, rast.shape[1], rast.shape[2]
    shape = (b, height, width, 4)
    check_shape(rast, "rast", shape)
    plan.result = grad_pos = grad_or_new(grad_pos, "grad_pos", pos)
    if grad_rast is None and grad_rast_db is None:
        return
    mode, t = reduce_settings(reduce, threshold, device, ws)
    g = cotangent(grad_rast, "grad_rast", shape, device)
    g = g if g is not None else zeros_once(ws, "mesh_zero_grad_rast", shape, wp.float32, device)
    gdb = cotangent(grad_rast_db, "grad_rast_db", shape, device)
    gdb_flat = vec4_view(ws, gdb, True) if gdb is not None else absent(ws, wp.vec4, device)
    xs, xo, ys, yo = _pixel_grid(height, width)
    plan.launch(make_raster_bwd(mode), tiled_dim(b, height, width),
                [vec4_view(ws, rast, True), vec4_view(ws, g, True), gdb_flat, geom.pos, geom.tri, geom.instanced,
                 width, height, xs, xo, ys, yo, t, vec4_view(ws, grad_pos, True)], device, block_dim=BLOCK)
