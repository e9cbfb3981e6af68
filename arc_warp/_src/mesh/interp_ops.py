"""Attribute interpolation: :class:`Interpolator` and interpolate / interpolate_backward on it."""

from __future__ import annotations

import numpy as np
import warp as wp

from arc_warp._src.launches import ptr
from arc_warp._src.mesh.common import (BLOCK, MeshOp, array, chunking, exact, given, grad_of, output, record,
                                       tiled_dim, triangles)
from arc_warp._src.mesh.interp_kernels import make_interp_bwd, make_interp_fwd


def _diff_indices(diff_attrs, num_attr: int) -> np.ndarray:
    """int32 attribute indices of ``diff_attrs`` (None, 'all' or a list; negatives count from the end)."""
    if diff_attrs is None:
        return np.zeros(0, np.int32)
    if isinstance(diff_attrs, str):
        if diff_attrs != "all":
            raise ValueError(f"diff_attrs: expected None, 'all' or a list of indices, got {diff_attrs!r}")
        return np.arange(num_attr, dtype=np.int32)
    idx = np.asarray(diff_attrs).reshape(-1)
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"diff_attrs: expected integer indices, got dtype {idx.dtype}")
    if ((idx < -num_attr) | (idx >= num_attr)).any():
        raise ValueError(f"diff_attrs: indices must lie in [-{num_attr}, {num_attr}), got {idx.tolist()}")
    return np.where(idx < 0, idx + num_attr, idx).astype(np.int32)


def _diff_links(idx: np.ndarray, num_attr: int) -> np.ndarray:
    """The kernels' link table of the derivative indices ``idx`` (``interp_kernels``'
    docstring): A + D int32 (first slot per attribute, then next slot per slot; -1 ends a
    chain), empty without derivatives."""
    if idx.size == 0:
        return idx
    links = np.full(num_attr + idx.size, -1, np.int32)
    for q in range(idx.size - 1, -1, -1):  # prepended, so each chain runs in slot order
        links[num_attr + q] = links[idx[q]]
        links[idx[q]] = q
    return links


class Interpolator(MeshOp):
    """Interpolates A vertex attributes over B rasterised images of H x W, with the pixel
    derivatives of ``diff_attrs`` (:func:`interpolate` gives the semantics and the
    arguments), the derivatives' link table made once. Args: ``batch``, ``height``,
    ``width`` of the [B, H, W, 4] ``rast`` it reads; ``attributes``, A, the last axis of
    ``attr``; ``diff_attrs``: None, 'all' or a list of attribute indices (negatives count
    from the end); the rest as :class:`MeshOp`'s."""

    def __init__(self, batch: int, height: int, width: int, attributes: int, diff_attrs=None, reduce: str = "arc",
                 threshold: int | None = None, device=None, record: bool = True):
        super().__init__(reduce, threshold, device, record, "interpolate")
        idx = _diff_indices(diff_attrs, attributes)
        self.batch, self.height, self.width, self.num_attributes = batch, height, width, attributes
        self.diff_attrs, self.num_diff = tuple(idx.tolist()), idx.size
        self._links = wp.array(_diff_links(idx, attributes), dtype=wp.int32, device=self.device)
        self.k, self.chunks = chunking(attributes)
        self._vec = wp.types.vector(self.k, wp.float32)  # k attributes at a time

    def _inputs(self, attr, rast, tri, rast_db) -> tuple:
        """Checks the inputs: (Ba, V) of attr, tri, and rast_db (None unless derivatives use it)."""
        shape = (self.batch, self.height, self.width, 4)
        attr = array(attr, "attr", (2, 3), None, self.device)
        images, vertices = (1, attr.shape[0]) if attr.ndim == 2 else attr.shape[:2]
        if images not in (1, self.batch):
            raise ValueError(f"attr: expected a minibatch of 1 or {self.batch} (that of rast), got {images}")
        if attr.shape[-1] != self.num_attributes:
            raise ValueError(f"Interpolator: made for {self.num_attributes} attributes, attr has {attr.shape[-1]}")
        exact(rast, "rast", shape, self.device)
        if self.num_diff and rast_db is None:
            raise ValueError("rast_db: diff_attrs asks for attribute derivatives, which need rast_db")
        given(rast_db, "rast_db", shape, self.device)
        return images, vertices, triangles(tri, self.device), rast_db if self.num_diff else None

    def forward(self, attr, rast, tri, rast_db=None, out=None, check: bool | None = None) -> tuple:
        """``(out, out_da)``, written into ``out`` if given. ``check``: as :meth:`Rasterizer.forward`."""
        images, vertices, tri, rast_db = self._inputs(attr, rast, tri, rast_db)
        b, h, w, a = self.batch, self.height, self.width, self.num_attributes
        out = (None, None) if out is None else out
        out, out_da = (output(out[0], "out[0] (out)", (b, h, w, a), self.device),
                       output(out[1], "out[1] (out_da)", (b, h, w, 2 * self.num_diff), self.device))

        def body():
            if a and b * h * w:
                self._launches.launch(
                    make_interp_fwd(self.k, self.chunks, self.num_diff > 0), b * h * w,
                    [self._flat(attr, self._vec), vertices, images, h * w, self._flat(rast, wp.vec4),
                     self._flat(rast_db, wp.vec4), tri, self._links, self._flat(out, self._vec),
                     self._flat(out_da if self.num_diff else None, wp.float32)])

        check = self._checked(("forward", attr.ptr, attr.shape, rast.ptr, ptr(rast_db), out.ptr, out_da.ptr), tri,
                              vertices, "attr", check, body)
        if check:
            self.check(previous=False)
        return out, out_da

    def backward(self, attr, rast, tri, grad_out, rast_db=None, grad_out_da=None, grad_attr=None, grad_rast=None,
                 grad_rast_db=None, attr_grad: bool = True) -> tuple:
        """``(grad_attr, grad_rast, grad_rast_db)`` added into the arrays given (new zeroed
        ones for None; ``grad_rast_db`` None without ``rast_db``, ``grad_attr`` None with
        ``attr_grad=False``)."""
        images, vertices, tri, rast_db_d = self._inputs(attr, rast, tri, rast_db)
        b, h, w, a = self.batch, self.height, self.width, self.num_attributes
        go = given(grad_out, "grad_out", (b, h, w, a), self.device)
        gda = given(grad_out_da, "grad_out_da", (b, h, w, 2 * self.num_diff), self.device)
        grad_attr = output(grad_attr, "grad_attr", attr.shape, self.device, zero=True) if attr_grad else None
        grad_rast = output(grad_rast, "grad_rast", (b, h, w, 4), self.device, zero=True)
        if rast_db is not None:
            grad_rast_db = output(grad_rast_db, "grad_rast_db", (b, h, w, 4), self.device, zero=True)
        if (go is None and gda is None) or a == 0 or b * h * w == 0:
            return grad_attr, grad_rast, grad_rast_db
        if go is None:  # a backward given only dL/dout_da
            go = self._zeros((b, h, w, a))
        da = gda is not None and self.num_diff > 0  # else no term of the derivatives: a kernel without them

        def body():
            self._launches.launch(
                make_interp_bwd(self.mode, self.k, self.chunks, da), tiled_dim(b, h, w),
                [self._flat(attr, self._vec), vertices, images, self._flat(rast, wp.vec4),
                 self._flat(rast_db_d if da else None, wp.vec4), tri, self._links if da else self._flat(None, wp.int32),
                 self._flat(go, self._vec), self._flat(gda if da else None, wp.float32), w, h, self.threshold,
                 self._flat(grad_attr, self._vec), self._flat(grad_rast, wp.vec4),
                 self._flat(grad_rast_db if da else None, wp.vec4)], block_dim=BLOCK)

        self._bindings.run(("backward", attr.ptr, attr.shape, rast.ptr, tri.array.ptr, tri.shape[0], da,
                            ptr(rast_db_d), go.ptr, ptr(gda), ptr(grad_attr), grad_rast.ptr, ptr(grad_rast_db)), body)
        return grad_attr, grad_rast, grad_rast_db


def _interpolator(workspace, attr, rast, diff_attrs, reduce, threshold) -> Interpolator:
    """The :class:`Interpolator` of a call."""
    rast = array(rast, "rast", 4, 4)
    num_a = array(attr, "attr", (2, 3), None, rast.device).shape[-1]
    if diff_attrs is not None and not isinstance(diff_attrs, str):
        diff_attrs = tuple(_diff_indices(diff_attrs, num_a).tolist())
    return Interpolator.of(workspace, rast.device, *rast.shape[:3], num_a, diff_attrs, reduce=reduce,
                           threshold=threshold)


def interpolate(
    attr: wp.array,  # [V, A] or [B or 1, V, A] float32
    rast: wp.array,  # [B, H, W, 4] from rasterize
    tri: wp.array,  # [F, 3] int32
    rast_db: wp.array | None = None,  # [B, H, W, 4] from rasterize, for derivatives
    diff_attrs=None,  # None, 'all' or a list of attribute indices
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace: its Interpolator of this size is reused
    out: tuple[wp.array, wp.array] | None = None,  # (out, out_da) to write instead of new arrays
) -> tuple[wp.array, wp.array]:
    """Interpolates vertex attributes over the rasterised triangles (nvdiffrast semantics).

    ``out = u a0 + v a1 + (1 - u - v) a2`` with (u, v) the perspective-correct barycentrics
    of ``rast``; pixels without a triangle (or whose triangle id is out of range) get 0. A
    minibatch of 1 in ``attr`` is broadcast.

    Returns:
        ``(out, out_da)``: float32 [B, H, W, A] and [B, H, W, 2 len(diff_attrs)] with
        (dA/dX, dA/dY) per selected attribute in pixel units ([B, H, W, 0] without
        ``diff_attrs``). Recorded on an active ``wp.Tape`` (gradients into ``attr``,
        ``rast`` and ``rast_db``).
    """
    op = _interpolator(workspace, attr, rast, diff_attrs, reduce, threshold)
    out, out_da = op.forward(attr, rast, tri, rast_db, out, check=True)
    record([attr, rast, rast_db], [out, out_da],
           lambda: op.backward(attr, rast, tri, out.grad, rast_db, out_da.grad if op.num_diff else None, grad_of(attr),
                               grad_of(rast), grad_of(rast_db), attr.requires_grad))
    return out, out_da


def interpolate_backward(
    attr: wp.array,
    rast: wp.array,
    tri: wp.array,
    grad_out: wp.array | None,  # [B, H, W, A]
    rast_db: wp.array | None = None,
    grad_out_da: wp.array | None = None,  # [B, H, W, 2D]
    diff_attrs=None,
    grad_attr: wp.array | None = None,  # added into if given
    grad_rast: wp.array | None = None,  # added into if given
    grad_rast_db: wp.array | None = None,  # added into if given
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace (see interpolate)
    attr_grad: bool = True,  # False: attr's gradient is not wanted (skips its scatter)
) -> tuple[wp.array | None, wp.array, wp.array | None]:
    """Gradients of :func:`interpolate` into ``attr`` (ARC scatter into each pixel's three
    vertices), ``rast`` (u, v) and ``rast_db``. Returns ``(grad_attr, grad_rast,
    grad_rast_db)`` shaped like the inputs (``grad_rast_db`` None without ``rast_db``;
    ``grad_attr`` None with ``attr_grad=False``)."""
    return _interpolator(workspace, attr, rast, diff_attrs, reduce, threshold).backward(
        attr, rast, tri, grad_out, rast_db, grad_out_da, grad_attr, grad_rast, grad_rast_db, attr_grad)
