"""Rigid-body meshes -> images through ``arc_warp.mesh``, differentiable in the body poses.

- :class:`BodyMeshes`: triangle meshes fixed in body frames, gathered into one vertex /
  triangle buffer (build with :meth:`BodyMeshes.from_numpy`, :meth:`BodyMeshes.concat`, or
  from a newton model with ``model_mesh_shapes``).
- :func:`camera_clip_matrix`: the clip-space projection of an ``arc_warp.Camera``.
- :func:`body_meshes_to_clip`: vertices moved by ``body_q`` into every camera's clip space.
- :func:`render_body_meshes`: rasterize + interpolate (+ antialias) of those vertices.

Everything is recorded on an active ``wp.Tape``, so ``tape.backward`` of an image loss
fills ``body_q.grad`` (through the antialiased silhouettes and the interpolated
colours) and, when the simulation that produced ``body_q`` was recorded too, its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

import arc_warp.mesh as dr
from arc_warp import Camera
from arc_warp.validate import check_array

from .mesh_render_kernels import body_vertices_to_clip_kernel


@dataclass
class BodyMeshes:
    """Triangle meshes fixed in rigid-body frames, as one buffer.

    points (V,) wp.vec3 body-frame positions, world units (world positions where the
    body is -1); body (V,) wp.int32 index into ``body_q`` (-1 = static, world frame);
    tri (F, 3) wp.int32 vertex indices; colors (V, 3) float32 linear RGB in [0, 1],
    interpolated over the triangles; topology: the edge adjacency ``dr.antialias``
    needs, built once. Meshes should be welded (neighbouring triangles share vertex
    indices): antialiasing treats an edge without a neighbour as a silhouette.
    """

    points: wp.array
    body: wp.array
    tri: wp.array
    colors: wp.array
    topology: dr.TopologyHash
    max_body: int  # largest body index used (-1: all static), checked against body_q

    @property
    def num_vertices(self) -> int:
        return self.points.shape[0]

    @property
    def num_triangles(self) -> int:
        return self.tri.shape[0]

    @classmethod
    def from_numpy(cls, points, tri, body, colors, device=None) -> BodyMeshes:
        """points (V, 3); tri (F, 3) ints in [0, V); body an int or (V,) ints >= -1;
        colors (3,) or (V, 3) RGB."""
        points = np.asarray(points, dtype=np.float32)
        if points.ndim != 2 or points.shape[1] != 3 or points.shape[0] == 0 or not np.all(np.isfinite(points)):
            raise ValueError(f"points must be finite (V, 3) with V >= 1, got shape {points.shape}")
        v = points.shape[0]
        tri = np.asarray(tri)
        if tri.ndim != 2 or tri.shape[1] != 3 or tri.shape[0] == 0 or not np.issubdtype(tri.dtype, np.integer):
            raise ValueError(f"tri must be (F, 3) integers with F >= 1, got {tri.dtype} {tri.shape}")
        if tri.min() < 0 or tri.max() >= v:
            raise ValueError(f"tri indexes vertices {tri.min()}..{tri.max()}, outside the {v} points")
        body = np.broadcast_to(np.asarray(body, dtype=np.int32), (v,))
        if body.min() < -1:
            raise ValueError(f"body indices must be >= -1, got {body.min()}")
        try:
            colors = np.broadcast_to(np.asarray(colors, dtype=np.float32), (v, 3))
        except ValueError:
            raise ValueError(f"colors must broadcast to {(v, 3)}, got shape {np.shape(colors)}") from None
        if not np.all(np.isfinite(colors)):
            raise ValueError("colors must be finite")
        tri_wp = wp.array(tri.astype(np.int32), dtype=wp.int32, device=device)
        return cls(
            wp.array(points, dtype=wp.vec3, device=device),
            wp.array(np.ascontiguousarray(body), dtype=wp.int32, device=device),
            tri_wp,
            wp.array(np.ascontiguousarray(colors), dtype=wp.float32, device=device),
            dr.antialias_construct_topology_hash(tri_wp),
            int(body.max()),
        )

    @classmethod
    def concat(cls, parts) -> BodyMeshes:
        """One buffer holding every mesh of ``parts`` (triangle indices shifted)."""
        parts = list(parts)
        if not parts:
            raise ValueError("concat needs at least one BodyMeshes")
        device = parts[0].points.device
        if any(p.points.device != device for p in parts):
            raise ValueError("concat needs all BodyMeshes on one device")
        starts = np.cumsum([0] + [p.num_vertices for p in parts[:-1]])
        return cls.from_numpy(
            np.concatenate([p.points.numpy() for p in parts]),
            np.concatenate([p.tri.numpy() + s for p, s in zip(parts, starts)]),
            np.concatenate([p.body.numpy() for p in parts]),
            np.concatenate([p.colors.numpy() for p in parts]),
            device,
        )

    def with_colors(self, colors) -> BodyMeshes:
        """The same meshes with new per-vertex colours ((3,) or (V, 3) RGB, or a (V, 3)
        float32 wp.array, kept as is so that it may carry ``requires_grad``)."""
        if isinstance(colors, wp.array):
            check_array(colors, "colors", wp.float32, 2, (self.num_vertices, 3), self.points.device)
        else:
            colors = np.broadcast_to(np.asarray(colors, dtype=np.float32), (self.num_vertices, 3))
            if not np.all(np.isfinite(colors)):
                raise ValueError("colors must be finite")
            colors = wp.array(np.ascontiguousarray(colors), dtype=wp.float32, device=self.points.device)
        return BodyMeshes(self.points, self.body, self.tri, colors, self.topology, self.max_body)


def camera_clip_matrix(camera: Camera) -> np.ndarray:
    """(4, 4) float64 matrix from homogeneous world points to ``arc_warp.mesh`` clip space.

    Pixel (u, v) of the camera (OpenCV axes, centre at +0.5, row 0 at the top) lands on
    rasterised pixel (u, v): NDC x = 2u/W - 1 and NDC y = 2v/H - 1, so the rasteriser's
    row 0 (NDC y = -1) is the camera image's top row and images need no flip. w is the
    camera depth; z/w runs from -1 at ``camera.near`` to 1 at ``camera.far``.
    """
    if not isinstance(camera, Camera):
        raise TypeError(f"camera must be an arc_warp.Camera, got {type(camera).__name__}")
    w, h, n, f = camera.width, camera.height, camera.near, camera.far
    proj = np.array([
        [2.0 * camera.fx / w, 0.0, 2.0 * camera.cx / w - 1.0, 0.0],
        [0.0, 2.0 * camera.fy / h, 2.0 * camera.cy / h - 1.0, 0.0],
        [0.0, 0.0, (f + n) / (f - n), -2.0 * f * n / (f - n)],
        [0.0, 0.0, 1.0, 0.0],
    ])
    return proj @ camera.world_to_camera


def _camera_list(cameras) -> list[Camera]:
    cams = [cameras] if isinstance(cameras, Camera) else list(cameras)
    if not cams:
        raise ValueError("need at least one camera")
    for i, cam in enumerate(cams):
        if not isinstance(cam, Camera):
            raise TypeError(f"cameras[{i}] must be an arc_warp.Camera, got {type(cam).__name__}")
        if (cam.width, cam.height) != (cams[0].width, cams[0].height):
            raise ValueError(f"cameras[{i}] is {cam.width}x{cam.height}, cameras[0] "
                             f"{cams[0].width}x{cams[0].height}: one batch has one resolution")
    return cams


def body_meshes_to_clip(body_q: wp.array, meshes: BodyMeshes, cameras) -> wp.array:
    """Clip-space positions of ``meshes`` at poses ``body_q`` seen by ``cameras``.

    body_q: (B,) wp.transform (p, q xyzw), world from body, e.g. newton ``State.body_q``;
    cameras: an ``arc_warp.Camera`` or a sequence of C of one resolution. Returns float32
    (C, V, 4), the ``pos`` of ``arc_warp.mesh`` in its instanced mode; recorded on an
    active ``wp.Tape`` (``requires_grad`` follows ``body_q``).
    """
    check_array(body_q, "body_q", wp.transform, 1)
    if not isinstance(meshes, BodyMeshes):
        raise TypeError(f"meshes must be BodyMeshes, got {type(meshes).__name__}")
    device = body_q.device
    if meshes.points.device != device:
        raise ValueError(f"meshes are on {meshes.points.device}, body_q on {device}")
    if meshes.max_body >= body_q.shape[0]:
        raise ValueError(f"meshes use body {meshes.max_body} but body_q has only {body_q.shape[0]} bodies")
    cams = _camera_list(cameras)
    mats = wp.array(np.stack([camera_clip_matrix(c) for c in cams]).astype(np.float32), dtype=wp.mat44,
                    device=device)
    clip = wp.empty((len(cams), meshes.num_vertices, 4), dtype=wp.float32, device=device,
                    requires_grad=body_q.requires_grad)
    wp.launch(body_vertices_to_clip_kernel, dim=(len(cams), meshes.num_vertices),
              inputs=[body_q, meshes.body, meshes.points, mats], outputs=[clip.view(wp.vec4)], device=device)
    return clip


@dataclass
class MeshRender:
    """Images of :func:`render_body_meshes`, one per camera.

    color (C, H, W, 3) float32 RGB, row 0 = the image's top row, 0 where no triangle
    covers a pixel (before antialiasing blends the silhouettes); rast (C, H, W, 4) as
    ``arc_warp.mesh.rasterize``; clip (C, V, 4) the clip-space vertices.
    """

    color: wp.array
    rast: wp.array
    clip: wp.array

    @property
    def images(self) -> list[wp.array]:
        """The C images as (H, W) wp.vec3 views sharing ``color`` and its gradient
        (the inputs of ``arc_warp_newton.fit_ops.image_mse``)."""
        rgb = self.color.view(wp.vec3)
        return [rgb[c] for c in range(rgb.shape[0])]


def render_body_meshes(
    body_q: wp.array,  # (B,) wp.transform, world from body
    meshes: BodyMeshes,
    cameras,  # arc_warp.Camera or a sequence of C of one resolution
    *,
    antialias: bool = True,
    reduce: str = "arc",
    threshold: int | None = None,
) -> MeshRender:
    """Renders ``meshes`` at poses ``body_q`` from each camera (vertex colours, no lighting).

    ``arc_warp.mesh.rasterize`` then ``interpolate`` of ``meshes.colors`` then, with
    ``antialias`` (the default), ``arc_warp.mesh.antialias``: without it the image is
    piecewise constant in visibility, so silhouettes give the pose no gradient and only
    the colour gradient inside the shapes is left. ``reduce``/``threshold`` select the
    accumulator of the mesh ops' backwards (``atomic``/``warp``/``serial``/``arc``).

    Recorded on an active ``wp.Tape``: ``tape.backward`` of a loss on ``color`` adds into
    ``body_q.grad`` (and ``meshes.colors.grad`` if it requires grad).
    """
    clip = body_meshes_to_clip(body_q, meshes, cameras)
    cams = _camera_list(cameras)
    resolution = (cams[0].height, cams[0].width)
    rast, _ = dr.rasterize(clip, meshes.tri, resolution, grad_db=False, reduce=reduce, threshold=threshold)
    color, _ = dr.interpolate(meshes.colors, rast, meshes.tri, reduce=reduce, threshold=threshold)
    if antialias:
        color = dr.antialias(color, rast, clip, meshes.tri, topology_hash=meshes.topology, reduce=reduce,
                             threshold=threshold)
    return MeshRender(color, rast, clip)
