"""Analytic antialiasing: :class:`Antialiaser`, antialias / antialias_backward, the topology hash."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp._src.launches import View
from arc_warp._src.mesh.antialias_kernels import aa_fwd, make_aa_bwd
from arc_warp._src.mesh.common import (BLOCK, MeshOp, array, exact, grad_of, output, positions, record, tiled_dim,
                                       triangles)
from arc_warp._src.mesh.util_kernels import copy_into


@dataclass(frozen=True)
class TopologyHash:
    """For each triangle edge (the one opposite vertex i), the vertex across it in the
    neighbouring triangle, or -1 on a boundary: ``opposite`` (F,) vec3i on the device.
    Built once per topology by :func:`antialias_construct_topology_hash`."""

    opposite: wp.array
    num_triangles: int


def antialias_construct_topology_hash(tri: wp.array) -> TopologyHash:  # [F, 3] int32
    """Edge adjacency of ``tri`` (host-side numpy pass; copies ``tri`` to the host once):
    each undirected edge records the opposite vertices of its first two triangles (in
    triangle order; triangles with repeated or negative vertices are ignored), as
    nvdiffrast's hash does; a third triangle on a non-manifold edge sees -1."""
    f = array(tri, "tri", 2, 3, None, wp.int32).numpy().astype(np.int64)
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


class Antialiaser(MeshOp):
    """Antialiases B images of H x W with C channels (:func:`antialias` gives the semantics
    and the arguments). Args: ``batch``, ``height``, ``width``, ``channels`` of the
    [B, H, W, C] colour it blends; the rest as :class:`MeshOp`'s."""

    def __init__(self, batch: int, height: int, width: int, channels: int, reduce: str = "arc",
                 threshold: int | None = None, device=None, record: bool = True):
        super().__init__(reduce, threshold, device, record, "antialias")
        self.batch, self.height, self.width, self.num_channels = batch, height, width, channels

    def _inputs(self, color, rast, pos, tri, topology_hash) -> tuple:
        """Checks the inputs; returns (pos view, instanced, tri view, rast view)."""
        b, h, w = self.batch, self.height, self.width
        exact(color, "color", (b, h, w, self.num_channels), self.device)
        exact(rast, "rast", (b, h, w, 4), self.device)
        pos_v, instanced = positions(pos, self.device)
        if instanced and pos_v.shape[0] != b:
            raise ValueError(f"pos: expected a minibatch of {b} (that of rast), got {pos_v.shape[0]}")
        tri = triangles(tri, self.device)
        if not isinstance(topology_hash, TopologyHash):
            raise TypeError(f"topology_hash: expected a TopologyHash, got {type(topology_hash).__name__}")
        if topology_hash.num_triangles != tri.shape[0]:
            raise ValueError(f"topology_hash: built for {topology_hash.num_triangles} triangles, tri has "
                             f"{tri.shape[0]}")
        return pos_v, instanced, tri, View(rast, wp.vec4, (b, h, w))

    def forward(self, color, rast, pos, tri, topology_hash: TopologyHash, out=None,
                check: bool | None = None) -> wp.array:
        """The antialiased colour, written into ``out`` if given. ``check``: as :meth:`Rasterizer.forward`."""
        pos_v, instanced, tri, rast_v = self._inputs(color, rast, pos, tri, topology_hash)
        out = output(out, "out", color.shape, self.device)

        def body():
            # aa_fwd adds the blends into the copy
            self._launches.launch(copy_into, color.size, [self._flat(color, wp.float32), self._flat(out, wp.float32)])
            self._launches.launch(aa_fwd, (self.batch, self.height, self.width),
                                  [color, rast_v, pos_v, tri, topology_hash.opposite, instanced, out])

        check = self._checked(("forward", color.ptr, rast.ptr, pos.ptr, pos_v.shape, topology_hash.opposite.ptr,
                               out.ptr), tri, pos_v.shape[1], "pos", check, body)
        if check:
            self.check(previous=False)
        return out

    def backward(self, color, rast, pos, tri, grad_out, topology_hash: TopologyHash, pos_gradient_boost: float = 1.0,
                 grad_color=None, grad_pos=None) -> tuple[wp.array, wp.array]:
        """``(grad_color, grad_pos)`` added into the arrays given (new zeroed ones for None)."""
        pos_v, instanced, tri, rast_v = self._inputs(color, rast, pos, tri, topology_hash)
        grad_color = output(grad_color, "grad_color", color.shape, self.device, zero=True)
        grad_pos = output(grad_pos, "grad_pos", pos.shape, self.device, zero=True)
        if grad_out is not None:
            exact(grad_out, "grad_out", color.shape, self.device)
            boost = float(pos_gradient_boost)
            self._bindings.run(
                ("backward", color.ptr, rast.ptr, pos.ptr, pos_v.shape, tri.array.ptr, topology_hash.opposite.ptr,
                 grad_out.ptr, boost, grad_color.ptr, grad_pos.ptr),
                lambda: self._launches.launch(
                    make_aa_bwd(self.mode), tiled_dim(self.batch, self.height, self.width),
                    [color, rast_v, pos_v, tri, topology_hash.opposite, instanced, grad_out, boost, self.threshold,
                     grad_color, self._flat(grad_pos, wp.vec4)], block_dim=BLOCK))
        return grad_color, grad_pos


def _antialiaser(workspace, color, rast, tri, topology_hash, reduce, threshold) -> tuple[Antialiaser, TopologyHash]:
    """The :class:`Antialiaser` of a call and the topology hash (built when not given)."""
    rast = array(rast, "rast", 4, 4)
    color = array(color, "color", 4, None, rast.device)
    if color.shape[:3] != rast.shape[:3]:
        raise ValueError(f"color: expected shape {(*rast.shape[:3], color.shape[3])}, got {tuple(color.shape)}")
    if topology_hash is None:
        topology_hash = antialias_construct_topology_hash(tri)
    return Antialiaser.of(workspace, rast.device, *color.shape, reduce=reduce, threshold=threshold), topology_hash


def antialias(
    color: wp.array,  # [B, H, W, C] float32
    rast: wp.array,  # [B, H, W, 4] from rasterize
    pos: wp.array,  # [V, 4] or [B, V, 4], as given to rasterize
    tri: wp.array,  # [F, 3] int32
    topology_hash: TopologyHash | None = None,
    pos_gradient_boost: float = 1.0,
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace: its Antialiaser of this size is reused
    out: wp.array | None = None,  # [B, H, W, C] float32 to write instead of a new array
) -> wp.array:
    """Blends colours across silhouette edges by their coverage of each pixel pair
    (nvdiffrast 0.4 semantics; see antialias_kernels). ``topology_hash`` (from
    :func:`antialias_construct_topology_hash`) saves rebuilding it each call.

    Returns:
        [B, H, W, C] float32. Recorded on an active ``wp.Tape``: gradients into ``color``
        and, through the silhouette edges, into ``pos`` (times ``pos_gradient_boost``).
    """
    op, topo = _antialiaser(workspace, color, rast, tri, topology_hash, reduce, threshold)
    out = op.forward(color, rast, pos, tri, topo, out, check=True)
    record([color, pos], [out], lambda: op.backward(color, rast, pos, tri, out.grad, topo, pos_gradient_boost,
                                                    grad_of(color), grad_of(pos)))
    return out


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
    op, topo = _antialiaser(workspace, color, rast, tri, topology_hash, reduce, threshold)
    return op.backward(color, rast, pos, tri, grad_out, topo, pos_gradient_boost, grad_color, grad_pos)
