"""Launches of analytic antialiasing, and the topology hash (edge -> opposite vertices)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp._src.mesh.antialias_kernels import aa_fwd, make_aa_bwd
from arc_warp._src.mesh.common import (
    BLOCK,
    check_shape,
    check_workspace,
    cotangent,
    float_array,
    grad_of,
    grad_or_new,
    output,
    record,
    reduce_settings,
    tiled_dim,
    vec4_view,
    view,
)
from arc_warp._src.mesh.geometry import check_tri, geometry
from arc_warp._src.mesh.plan import Plan, prepared
from arc_warp._src.mesh.util_kernels import copy_into


@dataclass(frozen=True)
class TopologyHash:
    """For each triangle edge (the one opposite vertex i), the vertex across it in the
    neighbouring triangle, or -1 on a boundary: ``opposite`` (F,) vec3i on the device.
    Built once per topology by :func:`antialias_construct_topology_hash`."""

    opposite: wp.array
    num_triangles: int


def antialias_construct_topology_hash(tri: wp.array) -> TopologyHash:  # [F, 3] int32
    """Edge adjacency of ``tri`` (host-side numpy pass; copies ``tri`` to the host once).

    Each undirected edge records the opposite vertices of its first two triangles (in
    triangle order; triangles with repeated or negative vertices are ignored), as
    nvdiffrast's hash does; a third triangle on a non-manifold edge sees -1."""
    check_tri(tri, tri.device)
    f = tri.numpy().astype(np.int64)
    n = len(f)
    opposite = np.full((n, 3), -1, np.int32)
    ok = (f >= 0).all(1) & (f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 2] != f[:, 0])
    if ok.any():
        tris = np.nonzero(ok)[0]
        a = np.concatenate([f[tris, 1], f[tris, 2], f[tris, 0]])
        b = np.concatenate([f[tris, 2], f[tris, 0], f[tris, 1]])
        opp = np.concatenate([f[tris, 0], f[tris, 1], f[tris, 2]])
        owner = np.concatenate([tris, tris, tris])
        slot = np.repeat(np.arange(3), len(tris))
        key = np.minimum(a, b) * (f.max() + 1) + np.maximum(a, b)
        order = np.lexsort((owner, key))
        key, opp, owner, slot = key[order], opp[order], owner[order], slot[order]
        start = np.r_[True, key[1:] != key[:-1]]
        group = np.cumsum(start) - 1
        first = opp[start][group]
        # second recorded vertex: the first in the group that differs from the first
        pos = np.arange(len(key))
        cand = np.where(opp != first, pos, len(key))
        second_pos = np.minimum.reduceat(cand, np.nonzero(start)[0])[group]
        second = np.where(second_pos < len(key), opp[np.minimum(second_pos, len(key) - 1)], -1)
        other = np.where(first == opp, second, np.where(second == opp, first, -1))
        opposite[owner, slot] = other
    return TopologyHash(wp.array(opposite, dtype=wp.vec3i, device=tri.device), n)


def _setup(plan: Plan, color, rast, pos, tri, topology_hash):
    rast = float_array(rast, "rast", (4,), 4)
    device = rast.device
    ws = check_workspace(plan.workspace, device)
    color = float_array(color, "color", (4,), device=device)
    check_shape(color, "color", (*rast.shape[:3], color.shape[3]))
    num_tri = check_tri(tri, device, ws).shape[0]
    # [V, 4] positions serve every image, as in nvdiffrast's range mode
    ranges = np.tile([[0, num_tri]], (rast.shape[0], 1)) if getattr(pos, "ndim", 0) == 2 else None
    geom = geometry(pos, tri, ranges, ws)
    if geom.batch != rast.shape[0]:
        raise ValueError(f"pos: expected a minibatch of {rast.shape[0]} (that of rast), got {geom.batch}")
    if topology_hash is None:
        plan.reusable = False  # built from tri's values, which the signature does not hold
        topology_hash = antialias_construct_topology_hash(tri)
    elif not isinstance(topology_hash, TopologyHash):
        raise TypeError(f"topology_hash: expected a TopologyHash, got {type(topology_hash).__name__}")
    elif topology_hash.num_triangles != geom.tri.shape[0]:
        raise ValueError(f"topology_hash: built for {topology_hash.num_triangles} triangles, tri has "
                         f"{geom.tri.shape[0]}")
    return color, rast, geom, topology_hash, ws


def antialias(
    color: wp.array,  # [B, H, W, C] float32
    rast: wp.array,  # [B, H, W, 4] from rasterize
    pos: wp.array,  # [V, 4] or [B, V, 4], as given to rasterize
    tri: wp.array,  # [F, 3] int32
    topology_hash: TopologyHash | None = None,
    pos_gradient_boost: float = 1.0,
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace: launches kept across calls
    out: wp.array | None = None,  # [B, H, W, C] float32 to write instead of a new array
) -> wp.array:
    """Blends colours across silhouette edges by their coverage of each pixel pair
    (nvdiffrast 0.4 semantics; see antialias_kernels). ``topology_hash`` (from
    :func:`antialias_construct_topology_hash`) saves rebuilding it each call.

    Returns:
        [B, H, W, C] float32. Recorded on an active ``wp.Tape``: gradients into ``color``
        and, through the silhouette edges, into ``pos`` (times ``pos_gradient_boost``).
    """
    plan, reused = prepared(workspace, "antialias", (color, rast, pos, tri, *_topology_arrays(topology_hash)), (out,),
                            (_topology_option(topology_hash), reduce, threshold),
                            lambda plan: _plan_forward(plan, color, rast, pos, tri, topology_hash, reduce, threshold,
                                                       out))
    plan.run()
    out, topo = (out, topology_hash) if reused else plan.result
    mode, ws = plan.mode, workspace  # as checked by the build

    def backward():
        antialias_backward(color, rast, pos, tri, out.grad, topo, pos_gradient_boost, grad_color=grad_of(color),
                           grad_pos=grad_of(pos), reduce=mode, threshold=threshold, workspace=ws)

    record([color, pos], [out], backward)
    return out


def _topology_arrays(topology_hash) -> tuple:
    """The arrays of a ``topology_hash=`` argument in a plan's signature."""
    return (topology_hash.opposite,) if isinstance(topology_hash, TopologyHash) else ()


def _topology_option(topology_hash):
    """The rest of a ``topology_hash=`` argument in a plan's signature."""
    return topology_hash.num_triangles if isinstance(topology_hash, TopologyHash) else topology_hash


def _plan_forward(plan: Plan, color, rast, pos, tri, topology_hash, reduce, threshold, out) -> None:
    """Checks an antialias call and queues its work; ``plan.result`` = (out, topology hash)."""
    color_c, rast_c, geom, topo, ws = _setup(plan, color, rast, pos, tri, topology_hash)
    device = rast_c.device
    plan.mode, _ = reduce_settings(reduce, threshold, device, ws)
    out = output(out, "out", tuple(color_c.shape), device)
    b, h, w, _ = rast_c.shape
    flat = (out.size,)
    # aa_fwd adds the blends into the copy
    plan.launch(copy_into, flat[0], [view(ws, color_c, wp.float32, flat), view(ws, out, wp.float32, flat)], device)
    plan.launch(aa_fwd, (b, h, w),
                [color_c, vec4_view(ws, rast_c), geom.pos, geom.tri, topo.opposite, geom.instanced, out], device)
    plan.result = out, topo


def antialias_backward(
    color: wp.array,
    rast: wp.array,
    pos: wp.array,
    tri: wp.array,
    grad_out: wp.array | None,  # [B, H, W, C]
    topology_hash: TopologyHash | None = None,
    pos_gradient_boost: float = 1.0,
    grad_color: wp.array | None = None,  # added into if given
    grad_pos: wp.array | None = None,  # added into if given
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace (see antialias)
) -> tuple[wp.array, wp.array]:
    """Gradients of :func:`antialias` into ``(color, pos)``. The pair analysis is recomputed
    from the inputs (deterministic, so it matches the forward). As in nvdiffrast, a
    crossing clamped to a pixel centre (|alpha| = 0.5) passes no position gradient."""
    plan, reused = prepared(workspace, "antialias_backward",
                            (color, rast, pos, tri, grad_out, *_topology_arrays(topology_hash)), (grad_color, grad_pos),
                            (_topology_option(topology_hash), pos_gradient_boost, reduce, threshold),
                            lambda plan: _plan_backward(plan, color, rast, pos, tri, grad_out, topology_hash,
                                                        pos_gradient_boost, grad_color, grad_pos, reduce, threshold))
    plan.run()
    return (grad_color, grad_pos) if reused else plan.result


def _plan_backward(plan: Plan, color, rast, pos, tri, grad_out, topology_hash, pos_gradient_boost, grad_color,
                   grad_pos, reduce, threshold) -> None:
    """Checks an antialias_backward call and queues its work; ``plan.result`` = (grad_color, grad_pos)."""
    color_c, rast_c, geom, topo, ws = _setup(plan, color, rast, pos, tri, topology_hash)
    device = rast_c.device
    grad_color = grad_or_new(grad_color, "grad_color", color)
    grad_pos = grad_or_new(grad_pos, "grad_pos", pos)
    plan.result = grad_color, grad_pos
    go = cotangent(grad_out, "grad_out", color_c.shape, device)
    if go is None:
        return
    mode, t = reduce_settings(reduce, threshold, device, ws)
    b, h, w, _ = rast_c.shape
    plan.launch(make_aa_bwd(mode), tiled_dim(b, h, w),
                [color_c, vec4_view(ws, rast_c), geom.pos, geom.tri, topo.opposite, geom.instanced, go,
                 float(pos_gradient_boost), t, grad_color, vec4_view(ws, grad_pos, True)], device, block_dim=BLOCK)
