"""A newton model's shapes as :class:`BodyMeshes` (needs newton).

:func:`model_mesh_shapes` gathers the model's mesh shapes, and tessellates its boxes and
spheres, into one vertex / triangle buffer in body frames, so that
:func:`render_body_meshes` with ``State.body_q`` draws the model as newton poses it.
"""

from __future__ import annotations

import numpy as np

import arc_warp.mesh as dr
import newton

from .convert_ops import _shape_to_body
from .mesh_render_ops import BodyMeshes

_MESH_TYPES = (int(newton.GeoType.MESH), int(newton.GeoType.CONVEX_MESH))


def _shape_mesh(shape_type: int, source, scale: np.ndarray, sphere_rings: int,
                sphere_segments: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(points (V, 3) in the shape frame, tri (F, 3)) of one shape, or None if not drawn."""
    if shape_type in _MESH_TYPES:
        # newton scales mesh vertices per axis in the shape frame
        return np.asarray(source.vertices, np.float64) * scale, np.asarray(source.indices).reshape(-1, 3)
    if shape_type == int(newton.GeoType.BOX):
        points, _, tri, _ = dr.cube(2.0)  # +-1: times the half extents below
        return points * scale, tri
    if shape_type == int(newton.GeoType.SPHERE):
        points, _, tri = dr.uv_sphere(sphere_rings, sphere_segments, float(scale[0]))
        return points, tri
    return None


def model_mesh_shapes(model, colors=None, *, primitives: bool = True, sphere_rings: int = 12,
                      sphere_segments: int = 24, skip_unsupported: bool = False) -> BodyMeshes:
    """The triangle meshes of a newton model's shapes, in body frames.

    Mesh shapes (``GeoType.MESH`` / ``CONVEX_MESH``) keep their vertices and triangles
    (scaled by ``model.shape_scale``); with ``primitives`` boxes become 12-triangle cubes
    and spheres UV spheres of ``sphere_rings`` x ``sphere_segments``. Every shape's
    ``model.shape_transform`` is applied, so the points are in its body's frame
    (world frame for static shapes, body -1). Planes are skipped (infinite); other
    shape types raise ValueError unless ``skip_unsupported``. Without ``primitives`` boxes
    and spheres are left out.

    ``colors``: None (each shape's ``model.shape_color``), an RGB triple for all shapes,
    or (S, 3) one per shape; per-vertex colours: :meth:`BodyMeshes.with_colors`.
    Returns :class:`BodyMeshes` on ``model.device``.
    """
    if not isinstance(model, newton.Model):
        raise TypeError(f"model must be a newton.Model, got {type(model).__name__}")
    types = model.shape_type.numpy()
    if types.size == 0:
        raise ValueError("model has no shapes to render")
    scales = model.shape_scale.numpy().astype(np.float64)
    xforms = model.shape_transform.numpy()
    bodies = model.shape_body.numpy()
    palette = model.shape_color.numpy() if colors is None else np.asarray(colors, np.float32)
    try:
        palette = np.broadcast_to(palette, (types.size, 3))
    except ValueError:
        raise ValueError(f"colors must be an RGB triple or ({types.size}, 3), got shape {np.shape(colors)}") from None
    primitive_types = (int(newton.GeoType.BOX), int(newton.GeoType.SPHERE))
    parts = []
    for s, t in enumerate(types):
        t = int(t)
        if t == int(newton.GeoType.PLANE) or (t in primitive_types and not primitives):
            continue
        mesh = _shape_mesh(t, model.shape_source[s], scales[s], sphere_rings, sphere_segments)
        if mesh is None:
            if skip_unsupported:
                continue
            raise ValueError(f"shape {s} has type {newton.GeoType(t).name}; only MESH, CONVEX_MESH, BOX and "
                             "SPHERE shapes are drawn (pass skip_unsupported=True to leave others out)")
        points, tri = mesh
        parts.append(BodyMeshes.from_numpy(_shape_to_body(points, xforms[s]), tri, int(bodies[s]), palette[s],
                                           model.device))
    if not parts:
        what = "mesh, box or sphere" if primitives else "mesh"
        raise ValueError(f"model has no {what} shapes to render")
    return parts[0] if len(parts) == 1 else BodyMeshes.concat(parts)
