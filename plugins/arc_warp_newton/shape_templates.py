"""Triangle templates of newton's shapes whose points follow the shape's scale (numpy only).

A template's vertex k sits at ``a[k] * scale + b[k] * scale[0] + c[k] * scale[1]`` in the
shape frame (``scale`` is newton's ``Model.shape_scale`` row), so one affine formula covers
every supported shape and is differentiable in the scale:

- mesh (and convex mesh): ``a`` = the vertices (newton scales them per axis);
- box: ``a`` = the corners of [-1, 1]^3 (scale = half extents);
- sphere: ``b`` = a unit UV sphere (scale[0] = radius);
- ellipsoid: ``a`` = a unit UV sphere (scale = semi-axes);
- capsule: ``b`` = unit hemispheres and ``c`` = (0, 0, +-1) (scale = (radius, half height),
  axis along local z).

Meshes are welded (neighbouring triangles share vertex indices), as antialiasing needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import arc_warp.mesh as dr


@dataclass(frozen=True)
class ShapeTemplate:
    """Vertex terms ``a``, ``b``, ``c`` (V, 3) float32 and triangles ``tri`` (F, 3) int32."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    tri: np.ndarray

    def points(self, scale) -> np.ndarray:
        """(V, 3) float64 shape-frame points at ``scale`` ((3,) newton shape scale)."""
        s = np.asarray(scale, np.float64)
        return self.a * s + self.b * s[0] + self.c * s[1]


def _template(a=None, b=None, c=None, tri=None) -> ShapeTemplate:
    v = next(x for x in (a, b, c) if x is not None).shape[0]
    zero = np.zeros((v, 3), np.float32)
    terms = [zero if x is None else np.ascontiguousarray(x, np.float32) for x in (a, b, c)]
    return ShapeTemplate(*terms, np.ascontiguousarray(tri, np.int32))


def mesh_template(vertices, indices) -> ShapeTemplate:
    """A newton ``Mesh``'s vertices (V, 3) and flat or (F, 3) triangle indices."""
    return _template(a=np.asarray(vertices, np.float32).reshape(-1, 3), tri=np.asarray(indices).reshape(-1, 3))


def box_template() -> ShapeTemplate:
    points, _, tri, _ = dr.cube(2.0)
    return _template(a=points, tri=tri)


def sphere_template(rings: int, segments: int) -> ShapeTemplate:
    points, _, tri = dr.uv_sphere(rings, segments, 1.0)
    return _template(b=points, tri=tri)


def ellipsoid_template(rings: int, segments: int) -> ShapeTemplate:
    points, _, tri = dr.uv_sphere(rings, segments, 1.0)
    return _template(a=points, tri=tri)


def capsule_template(rings: int, segments: int) -> ShapeTemplate:
    """Two unit hemispheres about local z, ``rings`` latitude bands each, joined at their
    equators by a band of quads (the cylinder), with one vertex at each pole."""
    if rings < 1 or segments < 3:
        raise ValueError(f"capsule_template: expected rings >= 1 and segments >= 3, got {rings}, {segments}")
    # latitude rows (radius, z, offset) from the north pole to the top equator (offset +1),
    # then from the bottom equator to the south pole (offset -1)
    t = np.linspace(0.0, 0.5 * math.pi, rings + 1)
    rows = [(math.sin(x), math.cos(x), 1.0) for x in t] + [(math.sin(x), -math.cos(x), -1.0) for x in t[::-1]]
    phi = 2.0 * math.pi * np.arange(segments) / segments
    b, c, index = [], [], []
    for r, z, offset in rows:
        if r == 0.0:  # a pole: one vertex
            index.append([len(b)] * segments)
            b.append((0.0, 0.0, z))
            c.append((0.0, 0.0, offset))
            continue
        index.append(list(range(len(b), len(b) + segments)))
        b.extend((r * math.cos(p), r * math.sin(p), z) for p in phi)
        c.extend((0.0, 0.0, offset) for _ in phi)
    tri = []
    for top, bottom in zip(index[:-1], index[1:]):
        for s in range(segments):
            q = (top[s], top[(s + 1) % segments], bottom[(s + 1) % segments], bottom[s])
            for face in ((q[0], q[1], q[2]), (q[0], q[2], q[3])):
                if len(set(face)) == 3:  # the pole rows' quads are triangles
                    tri.append(face)
    return _template(b=np.array(b), c=np.array(c), tri=np.array(tri))
