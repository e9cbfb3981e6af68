"""Launches of attribute interpolation (forward with derivatives, ARC backward)."""

from __future__ import annotations

import functools

import numpy as np
import warp as wp

from arc_warp._src.mesh.common import (
    BLOCK,
    absent,
    check_shape,
    check_workspace,
    chunking,
    device_constant,
    cotangent,
    flat_view,
    float_array,
    grad_of,
    grad_or_new,
    output,
    vector_view,
    vec4_view,
    view,
    record,
    reduce_settings,
    tiled_dim,
    zeros_once,
)
from arc_warp._src.mesh.geometry import check_tri
from arc_warp._src.mesh.interp_kernels import make_interp_bwd, make_interp_fwd
from arc_warp._src.mesh.plan import Plan, pair, prepared


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


def _diff_links(diff_attrs, num_attr: int) -> np.ndarray:
    """The kernels' link table of ``diff_attrs`` (``interp_kernels``' docstring): A + D
    int32 (first slot per attribute, then next slot per slot; -1 ends a chain), empty
    without derivatives."""
    idx = _diff_indices(diff_attrs, num_attr)
    if idx.size == 0:
        return idx
    links = np.full(num_attr + idx.size, -1, np.int32)
    for q in range(idx.size - 1, -1, -1):  # prepended, so each chain runs in slot order
        links[num_attr + q] = links[idx[q]]
        links[idx[q]] = q
    return links


@functools.lru_cache(maxsize=64)
def _named_diff_table(diff_attrs: str | None, num_attr: int, device: str) -> wp.array:
    return device_constant(_diff_links(diff_attrs, num_attr), wp.int32, device)


def _diff_table(diff_attrs, num_attr: int, device) -> tuple[int, wp.array]:
    """(D, links): the number of derivative outputs and :func:`_diff_links` as a device
    constant (None and 'all' looked up without rebuilding it)."""
    if diff_attrs is None or isinstance(diff_attrs, str):
        links = _named_diff_table(diff_attrs, num_attr, device.alias)
    else:
        links = device_constant(_diff_links(diff_attrs, num_attr), wp.int32, device)
    return (links.shape[0] - num_attr if links.shape[0] else 0), links


def _inputs(attr, rast, tri, rast_db, diff_attrs, workspace):
    rast = float_array(rast, "rast", (4,), 4)
    device = rast.device
    ws = check_workspace(workspace, device)
    attr = float_array(attr, "attr", (2, 3), device=device)
    attr3 = view(ws, attr, wp.float32, (1, *attr.shape)) if attr.ndim == 2 else attr
    if attr3.shape[0] not in (1, rast.shape[0]):
        raise ValueError(f"attr: expected a minibatch of 1 or {rast.shape[0]} (that of rast), got {attr3.shape[0]}")
    num_diff, links = _diff_table(diff_attrs, attr3.shape[2], device)
    if num_diff and rast_db is None:
        raise ValueError("rast_db: diff_attrs asks for attribute derivatives, which need rast_db")
    if rast_db is not None:
        rast_db = check_shape(float_array(rast_db, "rast_db", (4,), 4, device), "rast_db", rast.shape)
    return attr3, rast, check_tri(tri, device, ws), rast_db, num_diff, links, ws


def interpolate(
    attr: wp.array,  # [V, A] or [B or 1, V, A] float32
    rast: wp.array,  # [B, H, W, 4] from rasterize
    tri: wp.array,  # [F, 3] int32
    rast_db: wp.array | None = None,  # [B, H, W, 4] from rasterize, for derivatives
    diff_attrs=None,  # None, 'all' or a list of attribute indices
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace: launches kept across calls
    out: tuple[wp.array, wp.array] | None = None,  # (out, out_da) to write instead of new arrays
) -> tuple[wp.array, wp.array]:
    """Interpolates vertex attributes over the rasterised triangles (nvdiffrast semantics).

    ``out = u a0 + v a1 + (1 - u - v) a2`` with (u, v) the perspective-correct barycentrics
    of ``rast``; pixels without a triangle (or whose triangle/vertex ids are out of range)
    get 0. A minibatch of 1 in ``attr`` is broadcast.

    Returns:
        ``(out, out_da)``: float32 [B, H, W, A] and [B, H, W, 2 len(diff_attrs)] with
        (dA/dX, dA/dY) per selected attribute in pixel units ([B, H, W, 0] without
        ``diff_attrs``). Recorded on an active ``wp.Tape`` (gradients into ``attr``,
        ``rast`` and ``rast_db``); ``reduce``/``threshold`` select the backward's accumulator.
    """
    given = (None, None) if out is None else out
    plan, reused = prepared(workspace, "interpolate", (attr, rast, tri, rast_db), pair(given),
                            (diff_attrs, reduce, threshold),
                            lambda plan: _plan_forward(plan, attr, rast, tri, rast_db, diff_attrs, reduce, threshold,
                                                       given))
    plan.run()
    out, out_da = given if reused else plan.result
    mode, ws = plan.mode, workspace  # as checked by the build

    def backward():
        interpolate_backward(attr, rast, tri, out.grad, rast_db, out_da.grad if out_da.shape[3] else None, diff_attrs,
                             grad_attr=grad_of(attr), grad_rast=grad_of(rast), grad_rast_db=grad_of(rast_db),
                             reduce=mode, threshold=threshold, workspace=ws, attr_grad=attr.requires_grad)

    inputs = [attr, rast] + ([rast_db] if rast_db is not None else [])
    record(inputs, [out, out_da], backward)
    return out, out_da


def _plan_forward(plan: Plan, attr, rast, tri, rast_db, diff_attrs, reduce, threshold, out) -> None:
    """Checks an interpolate call and queues its work; ``plan.result`` = (out, out_da)."""
    attr3, rast_c, tri_v, rast_db_c, num_diff, links, ws = _inputs(attr, rast, tri, rast_db, diff_attrs,
                                                                   plan.workspace)
    plan.mode, _ = reduce_settings(reduce, threshold, rast.device, ws)
    b, h, w, _ = rast_c.shape
    device = rast_c.device
    ba, num_v, num_a = attr3.shape
    out_a = output(out[0], "out[0] (out)", (b, h, w, num_a), device)
    out_da = output(out[1], "out[1] (out_da)", (b, h, w, 2 * num_diff), device)
    plan.result = out_a, out_da
    if num_a == 0 or b * h * w == 0:
        return
    k, chunks = chunking(num_a)
    plan.launch(make_interp_fwd(k, chunks, num_diff > 0), b * h * w,
                [vector_view(ws, attr3, k), num_v, ba, h * w, vec4_view(ws, rast_c, True),
                 flat_view(ws, rast_db_c if num_diff else None, wp.vec4, device), tri_v, links,
                 vector_view(ws, out_a, k), flat_view(ws, out_da if num_diff else None, float, device)], device)


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
    plan, reused = prepared(workspace, "interpolate_backward", (attr, rast, tri, grad_out, rast_db, grad_out_da),
                            (grad_rast, *((grad_attr,) if attr_grad else ()),
                             *((grad_rast_db,) if rast_db is not None else ())),
                            (diff_attrs, reduce, threshold, attr_grad),
                            lambda plan: _plan_backward(plan, attr, rast, tri, grad_out, rast_db, grad_out_da,
                                                        diff_attrs, grad_attr, grad_rast, grad_rast_db, reduce,
                                                        threshold, attr_grad))
    plan.run()
    if reused:
        return grad_attr if attr_grad else None, grad_rast, grad_rast_db if rast_db is not None else None
    return plan.result


def _plan_backward(plan: Plan, attr, rast, tri, grad_out, rast_db, grad_out_da, diff_attrs, grad_attr, grad_rast,
                   grad_rast_db, reduce, threshold, attr_grad) -> None:
    """Checks an interpolate_backward call and queues its work; ``plan.result`` = the gradients."""
    attr3, rast_c, tri_v, rast_db_c, num_diff, links, ws = _inputs(attr, rast, tri, rast_db, diff_attrs,
                                                                   plan.workspace)
    device = rast_c.device
    b, h, w, _ = rast_c.shape
    ba, num_v, num_a = attr3.shape
    grad_attr = grad_or_new(grad_attr, "grad_attr", attr) if attr_grad else None
    grad_rast = grad_or_new(grad_rast, "grad_rast", rast)
    if rast_db is not None:
        grad_rast_db = grad_or_new(grad_rast_db, "grad_rast_db", rast_db)
    plan.result = grad_attr, grad_rast, grad_rast_db
    go = cotangent(grad_out, "grad_out", (b, h, w, num_a), device)
    gda = cotangent(grad_out_da, "grad_out_da", (b, h, w, 2 * num_diff), device)
    if (go is None and gda is None) or num_a == 0 or b * h * w == 0:
        return
    go = go if go is not None else zeros_once(ws, "mesh_zero_grad_out", (b, h, w, num_a), wp.float32, device)
    with_da = gda is not None and num_diff > 0  # else no term of the derivatives: a kernel without them
    mode, t = reduce_settings(reduce, threshold, device, ws)
    k, chunks = chunking(num_a)
    plan.launch(make_interp_bwd(mode, k, chunks, with_da), tiled_dim(b, h, w),
                [vector_view(ws, attr3, k), num_v, ba, vec4_view(ws, rast_c, True),
                 flat_view(ws, rast_db_c if with_da else None, wp.vec4, device), tri_v,
                 links if with_da else absent(ws, wp.int32, device), vector_view(ws, go, k),
                 flat_view(ws, gda if with_da else None, float, device), w, h, t,
                 vector_view(ws, grad_attr, k) if attr_grad else absent(ws, wp.types.vector(k, wp.float32), device),
                 vec4_view(ws, grad_rast, True),
                 flat_view(ws, grad_rast_db if with_da else None, wp.vec4, device)], device, block_dim=BLOCK)
