"""The rasteriser: :class:`Rasterizer` and the functional rasterize / rasterize_backward on it."""

from __future__ import annotations

import numpy as np
import warp as wp

from arc_warp._src.launches import View, ptr
from arc_warp._src.mesh.common import (BLOCK, MeshOp, array, exact, given, output, positions, record,
                                       tiled_dim, triangles)
from arc_warp._src.mesh.raster_kernels import (EMPTY_KEY, make_raster_bwd, raster_big, raster_depth, raster_resolve,
                                               viewport_tile)
from arc_warp._src.validate import check_resolution


def _batch(pos: wp.array, ranges, num_tri: int) -> tuple[np.ndarray | None, int, int]:
    """(table, B, largest count): for [B, V, 4] positions no table and F triangles per
    image; for [V, 4] (range mode) the checked [B, 2] int32 host table of ``ranges``."""
    if pos.ndim == 3:
        if pos.shape[0] < 1:
            raise ValueError(f"pos: expected a minibatch of at least 1, got shape {tuple(pos.shape)}")
        return None, pos.shape[0], num_tri
    if ranges is None:
        raise ValueError("ranges: pos is [V, 4] (range mode), so ranges [B, 2] (start, count) is required")
    table = ranges.numpy() if isinstance(ranges, wp.array) else np.asarray(ranges)
    if table.ndim != 2 or table.shape[1] != 2 or not np.issubdtype(table.dtype, np.integer) or len(table) < 1:
        raise ValueError(f"ranges: expected an integer array [B >= 1, 2], got {table.dtype} {table.shape}")
    table = table.astype(np.int32)
    bad = (table[:, 0] < 0) | (table[:, 1] < 0) | (table[:, 0].astype(np.int64) + table[:, 1] > num_tri)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"ranges: row {row} = {tuple(table[row])} is outside the {num_tri} triangles of tri")
    return table, len(table), int(table[:, 1].max())


class Rasterizer(MeshOp):
    """Rasterises F triangles into B images of H x W (:func:`rasterize` gives the semantics
    and the arguments), with its scratch (depth keys, big-triangle queue) made once.
    Args: ``resolution`` (height, width); ``batch``, B, the images of a call (of [B, V, 4]
    positions, or the rows of ``ranges``); ``triangles``, F; the rest as :class:`MeshOp`'s.
    """

    def __init__(self, resolution, batch: int, triangles: int, reduce: str = "arc", threshold: int | None = None,
                 device=None, record: bool = True):
        super().__init__(reduce, threshold, device, record, "rasterize")
        self.height, self.width = h, w = check_resolution(resolution)
        self.batch, self.num_triangles = batch, triangles
        d = self.device
        self._keys = wp.full((batch, h, w), EMPTY_KEY, dtype=wp.int64, device=d)
        self._big_count = wp.zeros(1, dtype=wp.int32, device=d)
        self._cleared = True  # the keys and count as raster_resolve leaves them
        self._big = wp.empty(batch * triangles, dtype=wp.vec4i, device=d)
        self._big_box = wp.empty(batch * triangles, dtype=wp.vec4i, device=d)
        self._whole = wp.array(np.tile(np.int32([0, triangles]), (batch, 1)), dtype=wp.vec2i, device=d)
        self._ranges, self._host_ranges = wp.empty(batch, dtype=wp.vec2i, device=d), None
        self._tile = wp.vec2i(viewport_tile(w), viewport_tile(h))
        f = np.float32  # NDC of pixel centre x is xs * x + xo, rounded to float32 as nvdiffrast
        self._grid = (float(f(2.0) / f(w)), float(f(1.0) / f(w) - f(1.0)), float(f(2.0) / f(h)),
                      float(f(1.0) / f(h) - f(1.0)))

    def forward(self, pos, tri, ranges=None, out=None, check: bool | None = None) -> tuple[wp.array, wp.array]:
        """``(rast, rast_db)``, written into ``out`` if given. ``check``: read the triangle
        check before returning (None: on the CPU; else at the next forward, or :meth:`check`)."""
        pos_v, instanced = positions(pos, self.device)
        tri = triangles(tri, self.device)
        table, batch, count = _batch(pos, ranges, tri.shape[0])
        if (batch, tri.shape[0]) != (self.batch, self.num_triangles):
            raise ValueError(f"Rasterizer: made for {self.batch} images of {self.num_triangles} triangles, got "
                             f"{batch} of {tri.shape[0]}; use another Rasterizer")
        shape, out = (batch, self.height, self.width, 4), (None, None) if out is None else out
        rast = output(out[0], "out[0] (rast)", shape, self.device)
        rast_db = output(out[1], "out[1] (rast_db)", shape, self.device)
        if table is not None and (self._host_ranges is None or not np.array_equal(table, self._host_ranges)):
            wp.copy(self._ranges, wp.array(table, dtype=wp.vec2i, device="cpu"))
            self._host_ranges = table
        ranges = self._whole if table is None else self._ranges
        if not self._cleared:  # an earlier forward stopped before its resolve
            self._keys.fill_(EMPTY_KEY)
            self._big_count.zero_()
        h, w, launches = self.height, self.width, self._launches

        def body():
            if count > 0:
                # triangles with big pixel boxes are queued and tested per pixel (no host readback)
                launches.launch(raster_depth, (batch, count), [pos_v, tri, ranges, instanced, w, h, self._tile,
                                                               self._keys, self._big, self._big_box, self._big_count])
                launches.launch(raster_big, (batch, h, w), [pos_v, tri, instanced, w, h, self._tile, self._big,
                                                            self._big_box, self._big_count, self._keys])
            launches.launch(raster_resolve, (batch, h, w), [self._keys, pos_v, tri, instanced, *self._grid,
                                                            View(rast, wp.vec4, shape[:3]),
                                                            View(rast_db, wp.vec4, shape[:3]), self._big_count])

        self._cleared = False
        check = self._checked(("forward", pos.ptr, pos_v.shape, ranges.ptr, count, rast.ptr, rast_db.ptr), tri,
                              pos_v.shape[1], "pos", check, body)
        self._cleared = True
        if check:
            self.check(previous=False)
        return rast, rast_db

    def backward(self, pos, tri, rast, grad_rast, grad_rast_db=None, grad_pos=None) -> wp.array:
        """dL/dpos added into ``grad_pos`` (a new zeroed array if None), which it returns."""
        pos_v, instanced = positions(pos, self.device)
        tri = triangles(tri, self.device)
        b, h, w = self.batch, self.height, self.width
        shape = exact(rast, "rast", (b, h, w, 4), self.device).shape
        g = given(grad_rast, "grad_rast", shape, self.device)
        gdb = given(grad_rast_db, "grad_rast_db", shape, self.device)
        grad_pos = output(grad_pos, "grad_pos", pos.shape, self.device, zero=True)
        if g is None and gdb is None:
            return grad_pos
        if g is None:  # a backward given only dL/drast_db
            g = self._zeros(shape)

        def body():
            self._launches.launch(make_raster_bwd(self.mode), tiled_dim(b, h, w),
                                  [self._flat(rast, wp.vec4), self._flat(g, wp.vec4), self._flat(gdb, wp.vec4), pos_v,
                                   tri, instanced, w, h, *self._grid, self.threshold, self._flat(grad_pos, wp.vec4)],
                                  block_dim=BLOCK)

        self._bindings.run(("backward", pos.ptr, pos_v.shape, tri.array.ptr, rast.ptr, g.ptr, ptr(gdb), grad_pos.ptr),
                           body)
        return grad_pos


def rasterize(
    pos: wp.array,  # [V, 4] (range mode) or [B, V, 4] float32, clip space
    tri: wp.array,  # [F, 3] int32
    resolution,  # (height, width)
    ranges=None,  # [B, 2] int32 (start, count) into tri, range mode only
    grad_db: bool = True,
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace: its Rasterizer of this size is reused
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
    area after snapping, all w <= 0, or any non-finite coordinate are not drawn and get
    no gradient.

    ``grad_db``: propagate gradients of ``rast_db`` into ``pos`` (tape and
    :func:`rasterize_backward`); ``reduce``, ``threshold`` and ``workspace`` as
    ``arc_warp.mesh``'s notes say; ``out``: arrays to write ``rast`` and ``rast_db`` into.

    Returns:
        ``(rast, rast_db)``, float32 [B, H, W, 4]: (u, v, z/w, triangle_id + 1; all 0 where
        empty; in range mode ids index the whole ``tri``) and (du/dX, du/dY, dv/dX, dv/dY)
        in pixel units. Recorded on an active ``wp.Tape`` when ``pos.requires_grad``.
    """
    pos = array(pos, "pos", (2, 3), 4)
    num_tri = array(tri, "tri", 2, 3, pos.device, wp.int32).shape[0]
    op = Rasterizer.of(workspace, pos.device, check_resolution(resolution), _batch(pos, ranges, num_tri)[1], num_tri,
                       reduce=reduce, threshold=threshold)
    rast, rast_db = op.forward(pos, tri, ranges, out, check=True)
    record([pos], [rast, rast_db],
           lambda: op.backward(pos, tri, rast, rast.grad, rast_db.grad if grad_db else None, pos.grad))
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
    workspace=None,  # arc_warp.Workspace (see rasterize)
) -> wp.array:
    """Gradient of a loss w.r.t. ``pos`` through the barycentrics (and their pixel derivatives).

    Only (u, v) and ``rast_db`` carry gradients, as in nvdiffrast (z/w and the triangle id
    are not differentiable; visibility changes are :func:`antialias`'s job). They are
    those of the forward's u, v, clamped to the triangle (unlike nvdiffrast's backward,
    which differentiates the unclamped ones); the clamp acts where snapped coverage puts
    a pixel centre outside its exact triangle. The per-pixel contributions to the three
    vertices of each pixel's triangle are summed with the ``reduce`` accumulator. Returns
    ``grad_pos`` (new if None), shaped like pos: x, y, w components; z gets none.
    """
    pos = array(pos, "pos", (2, 3), 4)
    num_tri = array(tri, "tri", 2, 3, pos.device, wp.int32).shape[0]
    rast = array(rast, "rast", 4, 4, pos.device)
    op = Rasterizer.of(workspace, pos.device, tuple(rast.shape[1:3]), _batch(pos, ranges, num_tri)[1], num_tri,
                       reduce=reduce, threshold=threshold)
    return op.backward(pos, tri, rast, grad_rast, grad_rast_db, grad_pos)
