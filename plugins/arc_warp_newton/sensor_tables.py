"""What :class:`SensorHybridCamera` reads of a newton model, gathered once (needs newton):
the vertex table of its mesh-like shapes, the parameter table of its Gaussian assets, and
per view the vertices, triangles and Gaussians of the view's world.

Worlds: a view of world ``w`` sees the shapes whose ``Model.shape_world`` is ``w`` or -1
(global shapes, such as a ground plane, are in every world), in shape order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

import arc_warp.mesh as dr
import newton

from .mesh_shapes import shape_template

SKIPPED_TYPES = (int(newton.GeoType.PLANE),)  # infinite: not drawn


@dataclass
class SensorGaussians:
    """The Gaussian assets of a model's ``GeoType.GAUSSIAN`` shapes, one row per Gaussian of
    each distinct asset (shapes that share a ``newton.Gaussian``, as replicated worlds do,
    share its rows): the sensor's differentiable Gaussian parameters, read by every update.

    positions (P,) wp.vec3 asset-frame centres (m, before the shape's scale); rotations (P,)
    wp.quat xyzw; scales (P,) wp.vec3 std-devs (m, before the shape's scale); opacities (P,)
    float32 in [0, 1]; sh_dc (P,) wp.vec3 the degree-0 SH coefficients (newton's
    ``sh_coeffs[:, :3]``): colour = max(SH_C0 sh_dc + 0.5, 0), as newton renders them.
    """

    positions: wp.array
    rotations: wp.array
    scales: wp.array
    opacities: wp.array
    sh_dc: wp.array

    @property
    def arrays(self) -> tuple[wp.array, ...]:
        return (self.positions, self.rotations, self.scales, self.opacities, self.sh_dc)


@dataclass
class ModelTables:
    """Host and device tables of one model.

    Vertex table (Vm rows, the drawn mesh-like shapes' vertices, per shape a block):
    ``vertex_shape``, ``vertex_a`` / ``_b`` / ``_c`` (:mod:`shape_templates`), ``colors``
    (the shapes' ``shape_color``, differentiable). ``meshes[s]`` = (first vertex, vertex
    count, triangles (F, 3) local to the block) of each drawn shape; ``splats[s]`` = (first
    row, count) of each Gaussian shape's asset in ``gaussians``; ``world_shapes[w]`` the
    shapes a view of world ``w`` draws."""

    vertex_shape: wp.array
    vertex_a: wp.array
    vertex_b: wp.array
    vertex_c: wp.array
    colors: wp.array
    gaussians: SensorGaussians
    meshes: dict
    splats: dict
    world_shapes: list


def gather(model, sphere_rings: int, sphere_segments: int, skip_unsupported: bool) -> ModelTables:
    """The tables of ``model``'s visible shapes (``ShapeFlags.VISIBLE``); ValueError for a
    visible shape type that is not drawn, unless ``skip_unsupported``."""
    types = model.shape_type.numpy()
    flags = model.shape_flags.numpy()
    worlds = model.shape_world.numpy()
    palette = model.shape_color.numpy()
    device, grad = model.device, model.requires_grad
    a, b, c, shape_of, colors = [], [], [], [], []
    meshes, splats, assets = {}, {}, {}
    params = [[] for _ in range(5)]
    count = 0
    for s, t in enumerate(int(t) for t in types):
        if not flags[s] & int(newton.ShapeFlags.VISIBLE) or t in SKIPPED_TYPES:
            continue
        source = model.shape_source[s]
        if t == int(newton.GeoType.GAUSSIAN):
            if id(source) not in assets:
                assets[id(source)] = (sum(len(p) for p in params[0]), source.count)
                params[0].append(source.positions)
                params[1].append(source.rotations)
                params[2].append(source.scales)
                params[3].append(source.opacities)
                params[4].append(source.sh_coeffs[:, :3])
            splats[s] = assets[id(source)]
            continue
        template = shape_template(t, source, sphere_rings, sphere_segments)
        if template is None:
            if skip_unsupported:
                continue
            raise ValueError(f"shape {s} has type {newton.GeoType(t).name}; the sensor draws MESH, CONVEX_MESH, BOX, "
                             "SPHERE, ELLIPSOID, CAPSULE and GAUSSIAN shapes (pass skip_unsupported=True to leave "
                             "others out)")
        v = len(template.a)
        meshes[s] = (count, v, template.tri)
        count += v
        a.append(template.a)
        b.append(template.b)
        c.append(template.c)
        shape_of.append(np.full(v, s, np.int32))
        colors.append(np.broadcast_to(palette[s], (v, 3)))
    if not meshes and not splats:
        raise ValueError("model has no visible mesh, box, sphere, ellipsoid, capsule or Gaussian shape to render")

    def table(parts, dtype, width=3, requires_grad=False):
        rows = np.concatenate(parts) if parts else np.zeros((0, width), np.float32)
        return wp.array(np.ascontiguousarray(rows, np.float32), dtype=dtype, device=device, requires_grad=requires_grad)

    gaussians = SensorGaussians(table(params[0], wp.vec3, requires_grad=grad),
                                table(params[1], wp.quat, 4, requires_grad=grad),
                                table(params[2], wp.vec3, requires_grad=grad),
                                wp.array(np.concatenate(params[3]) if params[3] else np.zeros(0), dtype=wp.float32,
                                         device=device, requires_grad=grad),
                                table(params[4], wp.vec3, requires_grad=grad))
    drawn = sorted((*meshes, *splats))
    world_shapes = [[s for s in drawn if worlds[s] in (w, -1)] for w in range(max(model.world_count, 1))]
    return ModelTables(wp.array(np.concatenate(shape_of) if shape_of else np.zeros(0, np.int32), dtype=wp.int32,
                                device=device),
                       table(a, wp.vec3), table(b, wp.vec3), table(c, wp.vec3), table(colors, wp.vec3,
                                                                                       requires_grad=grad),
                       gaussians, meshes, splats, world_shapes)


@dataclass
class ViewLayout:
    """The views of one ``world_indices``: per view vertex the model vertex and view
    (``vertex``, ``vertex_view``), the triangles of all views over those vertices (``tri``,
    view ``v``'s at ``ranges[v]``, host int32 (V, 2), as range mode takes them) and their
    antialiasing ``topology``; per view Gaussian its parameter row, shape and view, view
    ``v``'s at ``gaussian_offsets[v]:gaussian_offsets[v + 1]``."""

    vertex: wp.array
    vertex_view: wp.array
    tri: wp.array
    ranges: np.ndarray
    topology: object
    gaussian: wp.array
    gaussian_shape: wp.array
    gaussian_view: wp.array
    gaussian_offsets: list

    @property
    def has_meshes(self) -> bool:
        return self.tri.shape[0] > 0


def layout(tables: ModelTables, world_indices: tuple, device) -> ViewLayout:
    """The :class:`ViewLayout` of views of worlds ``world_indices`` (one per view)."""
    vertex, vertex_view, tri, ranges = [], [], [], []
    gaussian, gaussian_shape, gaussian_view, offsets = [], [], [], [0]
    vertices = triangles = splats = 0
    for v, w in enumerate(world_indices):
        first = triangles
        for s in tables.world_shapes[w]:
            if s in tables.meshes:
                start, n, local = tables.meshes[s]
                vertex.append(np.arange(start, start + n, dtype=np.int32))
                vertex_view.append(np.full(n, v, np.int32))
                tri.append(local + vertices)
                vertices, triangles = vertices + n, triangles + len(local)
            else:
                start, n = tables.splats[s]
                gaussian.append(np.arange(start, start + n, dtype=np.int32))
                gaussian_shape.append(np.full(n, s, np.int32))
                gaussian_view.append(np.full(n, v, np.int32))
                splats += n
        ranges.append((first, triangles - first))
        offsets.append(splats)

    def ints(parts, width=None):
        rows = np.concatenate(parts) if parts else np.zeros((0,) if width is None else (0, width), np.int32)
        return wp.array(np.ascontiguousarray(rows, np.int32), dtype=wp.int32, device=device)

    tri_array = ints(tri, 3)
    topology = dr.antialias_construct_topology_hash(tri_array) if tri_array.shape[0] else None
    return ViewLayout(ints(vertex), ints(vertex_view), tri_array, np.asarray(ranges, np.int32),
                      topology, ints(gaussian), ints(gaussian_shape), ints(gaussian_view), offsets)
