"""Launches of the rasteriser: forward (depth test + resolve) and the ARC backward into positions."""

from __future__ import annotations

import numpy as np
import warp as wp

from arc_warp._src.mesh.common import (
    BLOCK,
    check_resolution,
    check_shape,
    float_array,
    cotangent,
    grad_or_new,
    record,
    reduce_settings,
    tiled_dim,
)
from arc_warp._src.mesh.geometry import Geometry, geometry
from arc_warp._src.mesh.raster_kernels import EMPTY_KEY, make_raster_bwd, raster_big, raster_depth, raster_resolve


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
) -> tuple[wp.array, wp.array]:
    """Rasterises triangles with nvdiffrast 0.4 semantics.

    Conventions: pixel (x, y) has its centre at NDC ((2x + 1)/W - 1, (2y + 1)/H - 1), so
    image row 0 is at NDC y = -1 (nvdiffrast's bottom-up memory order). Barycentrics are
    perspective-correct; u weights vertex 0 and v vertex 1. Both faces are drawn.

    Clipping and culling: a pixel is covered when its centre is inside the triangle's
    projection, the surface point there is in front of the eye (w > 0), and
    -1 <= z/w <= 1. Triangles crossing the near plane are therefore clipped exactly per
    pixel (no geometric clipping; u, v stay relative to the original triangle).
    Triangles with all w <= 0, zero (homogeneous) area, any vertex index outside
    [0, V), or any non-finite coordinate are not drawn and get no gradient.

    Depth test: the nearest z/w wins, ties go to the lowest triangle id; it is a 64-bit
    (depth | id) atomic min, so ``rast`` has the same bits on every run. Pixel centres
    exactly on a shared edge belong to exactly one of the two triangles.

    Args:
        grad_db: propagate gradients of ``rast_db`` into ``pos`` (tape and
            :func:`rasterize_backward`).
        reduce: accumulation mode of the backward (``atomic``/``warp``/``serial``/``arc``/``floor``).
        threshold: ARC threshold override (default: calibrated per GPU).

    Returns:
        ``(rast, rast_db)``, float32 [B, H, W, 4]: (u, v, z/w, triangle_id + 1; all 0 where
        empty) and (du/dX, du/dY, dv/dX, dv/dY) in pixel units. In range mode
        triangle ids index the whole ``tri``. Recorded on an active ``wp.Tape`` when
        ``pos.requires_grad``.
    """
    geom = geometry(pos, tri, ranges)
    height, width = check_resolution(resolution)
    mode, _ = reduce_settings(reduce, threshold, pos.device)
    rast, rast_db = _forward(geom, height, width)

    def backward():
        rasterize_backward(pos, tri, rast, rast.grad, rast_db.grad if grad_db else None,
                           ranges=ranges, grad_pos=pos.grad, reduce=mode, threshold=threshold)

    record([pos], [rast, rast_db], backward)
    return rast, rast_db


def _forward(geom: Geometry, height: int, width: int) -> tuple[wp.array, wp.array]:
    device = geom.pos.device
    b = geom.batch
    keys = wp.full((b, height, width), EMPTY_KEY, dtype=wp.int64, device=device)
    xs, xo, ys, yo = _pixel_grid(height, width)
    if geom.max_count > 0:
        # triangles with big pixel boxes are queued and tested per pixel (no host readback)
        big = wp.empty(b * geom.max_count, dtype=wp.vec4i, device=device)
        big_box = wp.empty(b * geom.max_count, dtype=wp.vec4i, device=device)
        big_count = wp.zeros(1, dtype=wp.int32, device=device)
        wp.launch(raster_depth, dim=(b, geom.max_count), device=device, record_tape=False,
                  inputs=[geom.pos, geom.tri, geom.ranges, geom.instanced, width, height, xs, xo, ys, yo],
                  outputs=[keys, big, big_box, big_count])
        wp.launch(raster_big, dim=(b, height, width), device=device, record_tape=False,
                  inputs=[geom.pos, geom.tri, geom.instanced, xs, xo, ys, yo, big, big_box, big_count],
                  outputs=[keys])
    rast = wp.empty((b, height, width, 4), dtype=wp.float32, device=device)
    rast_db = wp.empty((b, height, width, 4), dtype=wp.float32, device=device)
    wp.launch(raster_resolve, dim=(b, height, width), device=device, record_tape=False,
              inputs=[keys, geom.pos, geom.tri, geom.instanced, xs, xo, ys, yo],
              outputs=[rast.view(wp.vec4), rast_db.view(wp.vec4)])
    return rast, rast_db


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
) -> wp.array:
    """Gradient of a loss w.r.t. ``pos`` through the barycentrics (and their pixel derivatives).

    Only (u, v) and ``rast_db`` carry gradients, as in nvdiffrast (z/w and the triangle id
    are not differentiable; visibility changes are :func:`antialias`'s job). The
    per-pixel contributions to the three vertices of each pixel's triangle are summed
    with the ``reduce`` accumulator. Returns ``grad_pos`` (new if None), shaped like pos:
    x, y, w components; z gets none.
    """
    geom = geometry(pos, tri, ranges)
    device = pos.device
    rast = float_array(rast, "rast", (4,), 4, device)
    b, height, width = geom.batch, rast.shape[1], rast.shape[2]
    shape = (b, height, width, 4)
    check_shape(rast, "rast", shape)
    grad_pos = grad_or_new(grad_pos, "grad_pos", pos)
    if grad_rast is None and grad_rast_db is None:
        return grad_pos
    mode, t = reduce_settings(reduce, threshold, device)
    g = cotangent(grad_rast, "grad_rast", shape, device)
    g = g if g is not None else wp.zeros(shape, dtype=wp.float32, device=device)
    gdb = cotangent(grad_rast_db, "grad_rast_db", shape, device)
    gdb_flat = gdb.view(wp.vec4).flatten() if gdb is not None else wp.empty(0, dtype=wp.vec4, device=device)
    xs, xo, ys, yo = _pixel_grid(height, width)
    wp.launch(make_raster_bwd(mode), dim=tiled_dim(b, height, width), block_dim=BLOCK, device=device,
              record_tape=False,
              inputs=[rast.view(wp.vec4).flatten(), g.view(wp.vec4).flatten(), gdb_flat, geom.pos, geom.tri,
                      geom.instanced, width, height, xs, xo, ys, yo, t],
              outputs=[grad_pos.view(wp.vec4).flatten()])
    return grad_pos

