"""A newton model's shapes as :class:`BodyMeshes` (needs newton).

:func:`model_mesh_shapes` gathers the model's mesh shapes, and tessellates its boxes,
spheres, ellipsoids and capsules, into one vertex / triangle buffer in body frames, so that
:func:`render_body_meshes` with ``State.body_q`` draws the model as newton poses it.
:func:`shape_template` is the tessellation of one shape (also the sensor's).
"""

from __future__ import annotations

import numpy as np

import newton

from .convert_ops import _shape_to_body
from .mesh_render_ops import BodyMeshes
from .shape_templates import (ShapeTemplate, box_template, capsule_template, ellipsoid_template, mesh_template,
                              sphere_template)

_MESH_TYPES = (int(newton.GeoType.MESH), int(newton.GeoType.CONVEX_MESH))
PRIMITIVE_TYPES = tuple(int(t) for t in (newton.GeoType.BOX, newton.GeoType.SPHERE, newton.GeoType.ELLIPSOID,
                                         newton.GeoType.CAPSULE))


def shape_template(shape_type: int, source, sphere_rings: int, sphere_segments: int) -> ShapeTemplate | None:
    """The :class:`ShapeTemplate` of a shape of ``shape_type`` (newton ``GeoType``) with
    ``source`` (``Model.shape_source``; a ``newton.Mesh`` for meshes), or None for a type
    that is not drawn. Round shapes get ``sphere_rings`` x ``sphere_segments`` (a capsule's
    hemispheres half the rings each)."""
    if shape_type in _MESH_TYPES:
        return mesh_template(source.vertices, source.indices)
    if shape_type == int(newton.GeoType.BOX):
        return box_template()
    if shape_type == int(newton.GeoType.SPHERE):
        return sphere_template(sphere_rings, sphere_segments)
    if shape_type == int(newton.GeoType.ELLIPSOID):
        return ellipsoid_template(sphere_rings, sphere_segments)
    if shape_type == int(newton.GeoType.CAPSULE):
        return capsule_template(max(1, sphere_rings // 2), sphere_segments)
    return None


def model_mesh_shapes(model, colors=None, *, primitives: bool = True, sphere_rings: int = 12,
                      sphere_segments: int = 24, skip_unsupported: bool = False) -> BodyMeshes:
    """The triangle meshes of a newton model's shapes, in body frames.

    Mesh shapes (``GeoType.MESH`` / ``CONVEX_MESH``) keep their vertices and triangles
    (scaled by ``model.shape_scale``); with ``primitives`` boxes become 12-triangle cubes,
    spheres and ellipsoids UV spheres of ``sphere_rings`` x ``sphere_segments``, capsules
    two hemispheres and a cylinder (:func:`shape_template`). Every shape's
    ``model.shape_transform`` is applied, so the points are in its body's frame
    (world frame for static shapes, body -1). Planes (infinite) and Gaussian shapes (no
    triangles: :class:`SensorHybridCamera` draws them) are skipped; other shape types raise
    ValueError unless ``skip_unsupported``. Without ``primitives`` only
    the mesh shapes are drawn.

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
    parts = []
    for s, t in enumerate(types):
        t = int(t)
        if t in (int(newton.GeoType.PLANE), int(newton.GeoType.GAUSSIAN)) or (t in PRIMITIVE_TYPES and not primitives):
            continue
        template = shape_template(t, model.shape_source[s], sphere_rings, sphere_segments)
        if template is None:
            if skip_unsupported:
                continue
            raise ValueError(f"shape {s} has type {newton.GeoType(t).name}; only MESH, CONVEX_MESH, BOX, SPHERE, "
                             "ELLIPSOID and CAPSULE shapes are drawn (pass skip_unsupported=True to leave others out)")
        points = _shape_to_body(template.points(scales[s]), xforms[s])
        parts.append(BodyMeshes.from_numpy(points, template.tri, int(bodies[s]), palette[s], model.device))
    if not parts:
        what = "mesh, box, sphere, ellipsoid or capsule" if primitives else "mesh"
        raise ValueError(f"model has no {what} shapes to render")
    return parts[0] if len(parts) == 1 else BodyMeshes.concat(parts)
