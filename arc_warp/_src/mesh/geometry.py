"""Validated geometry of one rasterize/interpolate/antialias call: positions, triangles, batching."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp._src.mesh.common import check_workspace, device_constant, float_array, host_int32, int_array, view


@dataclass(frozen=True)
class Geometry:
    """Clip-space positions and triangles in the layouts the kernels read.

    ``pos`` is (B, V) vec4 in instanced mode, (1, V) in range mode; ``tri`` is (F,) vec3i;
    ``ranges`` (B,) vec2i holds each image's (first triangle, count): (0, F) for every
    image in instanced mode. ``instanced`` is 1 or 0 (vertex batch stride factor);
    ``max_count`` is the largest count (host-side, so launches need no readback);
    ``workspace`` the checked ``arc_warp.Workspace`` of the call, or None."""

    pos: wp.array
    tri: wp.array
    ranges: wp.array
    instanced: int
    batch: int
    max_count: int
    workspace: object = None

    @property
    def num_vertices(self) -> int:
        return self.pos.shape[1]


def check_tri(tri, device, workspace=None) -> wp.array:
    """(F,) vec3i view of an int32 [F, 3] triangle array (cached by ``workspace`` if given)."""
    tri = int_array(tri, "tri", (2,), 3, device)
    return view(workspace, tri, wp.vec3i, tri.shape[:1])


@functools.lru_cache(maxsize=64)
def _whole_ranges(num_tri: int, batch: int, device: str) -> wp.array:
    """(batch,) vec2i (0, num_tri): the ranges table of instanced mode, made once per size."""
    return device_constant([(0, num_tri)] * batch, wp.vec2i, device)


def geometry(pos, tri, ranges=None, workspace=None) -> Geometry:
    """Checks ``pos`` ([V, 4] or [B, V, 4] float32), ``tri`` ([F, 3] int32 on pos's device) and
    ``ranges`` ([B, 2] int32 (start, count), range mode only; host data, as nvdiffrast).
    ``workspace`` (None or an ``arc_warp.Workspace`` on pos's device) caches the views."""
    pos = float_array(pos, "pos", (2, 3), 4)
    device = pos.device
    workspace = check_workspace(workspace, device)
    tri_v = check_tri(tri, device, workspace)
    num_tri = tri_v.shape[0]
    if pos.ndim == 3:
        batch = pos.shape[0]
        if batch < 1:
            raise ValueError(f"pos: expected a minibatch of at least 1, got shape {tuple(pos.shape)}")
        table = _whole_ranges(num_tri, batch, device.alias)
        return Geometry(view(workspace, pos, wp.vec4, pos.shape[:2]), tri_v, table, 1, batch, num_tri, workspace)
    if ranges is None:
        raise ValueError("ranges: pos is [V, 4] (range mode), so ranges [B, 2] (start, count) is required")
    table = host_int32(ranges, "ranges", 2)
    if len(table) < 1:
        raise ValueError("ranges: expected at least one (start, count) row, got none")
    bad = (table[:, 0] < 0) | (table[:, 1] < 0) | (table[:, 0].astype(np.int64) + table[:, 1] > num_tri)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"ranges: row {row} = {tuple(table[row])} is outside the {num_tri} triangles of tri")
    pos_v = view(workspace, pos, wp.vec4, (1, pos.shape[0]))
    return Geometry(pos_v, tri_v, wp.array(table, dtype=wp.vec2i, device=device), 0, len(table),
                    int(table[:, 1].max()), workspace)
