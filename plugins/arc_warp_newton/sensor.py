"""SensorHybridCamera: a newton model's meshes and Gaussians, every world and camera in one
call, differentiable under ``wp.Tape`` together with the simulation (needs newton).

Per view (a camera in a world) the model's mesh-like shapes (meshes, convex meshes, boxes,
spheres, ellipsoids, capsules) are rasterised with ``arc_warp.mesh`` and composited, as an
opaque surface, behind the Gaussians of its ``GeoType.GAUSSIAN`` shapes
(``arc_warp.render_gaussians(surface_colors=, surface_depths=)``); then the shapes'
silhouettes are antialiased over the composite, so an edge blends with the Gaussians or
background beside it and its gradient sees the colours the loss sees (antialiasing the
mesh image alone blends edges with black, which biased pose fits near their optimum).

How the views are batched. Every vertex of every view goes through one kernel into its
view's clip space, and the mesh ops run once over all views (range mode: view ``v``'s
triangles are ``ranges[v]`` of one triangle list), so the mesh part of W x C views costs one
launch per op. The splat renderer takes one set of Gaussians for C cameras, but here the
Gaussians of a view are placed in its camera's frame (below), so each view is one
``render_gaussians`` call over its own Gaussians, all of them made by one kernel launch.
(That call reads its checks before it returns: on CUDA a wait per view. A renderer held
per view, whose checks wait for the next call, would need the enclosing tape to record its
backward on, which Warp has no public getter for; ``benchmarks/bench_sensor.py`` measures
what the waits cost.)

Why the camera frame. The splat renderer's cameras carry no gradient. Here every vertex
and Gaussian is moved into its view's camera frame by Warp kernels with generated
adjoints, and rendered by a camera at the origin, so ``wp.Tape`` differentiates the camera
transforms like any other input (and the bodies, shapes and Gaussians through the same
kernels), at the price of one copy of a view's Gaussians per view (56 B per Gaussian).
"""

from __future__ import annotations

import math

import numpy as np
import warp as wp

import arc_warp.mesh as dr
import newton
from arc_warp import Camera, RenderSettings, Workspace, render_gaussians
from arc_warp.validate import check_array
from arc_warp.splat import surface_from_mesh

from .mesh_render_ops import camera_clip_matrix
from .sensor_kernels import gaussians_to_camera, shape_vertices_to_clip
from .sensor_tables import SensorGaussians, ViewLayout, gather, layout


def look_at_transform(eye, target, up=(0.0, 0.0, 1.0)) -> wp.transform:
    """newton's camera transform (world from camera; the camera looks along its -Z, +Y
    up) of a camera at ``eye`` looking at ``target`` with ``up`` towards the image's top."""
    eye, target, up = (np.asarray(v, np.float64) for v in (eye, target, up))
    forward = target - eye
    right = np.cross(forward, up)
    if np.linalg.norm(forward) == 0.0 or np.linalg.norm(right) < 1e-12 * np.linalg.norm(forward):
        raise ValueError(f"look_at_transform needs target != eye and up not along the view, got {eye}, {target}, {up}")
    forward, right = forward / np.linalg.norm(forward), right / np.linalg.norm(right)
    rotation = np.stack([right, np.cross(right, forward), -forward], axis=1)  # columns: camera x, y, z
    return wp.transform(wp.vec3(*eye), wp.quat_from_matrix(wp.mat33(*rotation.ravel())))


class SensorHybridCamera:
    """Renders a newton model's state for all worlds and cameras in one :meth:`update`.

    Conventions follow newton's ``SensorCamera``: :meth:`update` takes the ``State`` and one
    camera transform per view (world from camera, the camera looking along its local -Z with
    +Y up and +X right), views of world ``world_indices[v]`` (default: view ``v`` shows world
    ``v``), and writes images of shape (views, height, width). Where it differs, and why:

    - the images are linear RGB ``wp.vec3`` (unlit shape colours and Gaussian colours, the
      background where nothing is), not packed ``uint32`` RGBA: they are what a loss reads
      and what gradients flow back through;
    - there is no ``camera_rays`` argument: a rasteriser needs a pinhole camera, given once
      here (``camera_fov`` as in ``SensorCamera.compute_camera_rays_pinhole``, or pixel
      ``intrinsics``) for every view;
    - a Gaussian's colour is its degree-0 SH term (``SH_C0 * c + 0.5``, clamped at 0), as
      newton's ray tracer renders it, without colour-space conversion; the shapes show
      ``Model.shape_color`` unlit; particles and planes are not drawn.

    Gradients: inside ``with tape:`` an :meth:`update` records everything it launches, so
    ``tape.backward`` of a loss on the image adds into the ``.grad`` of ``state.body_q`` (and
    through newton's solver into the inputs of the simulation), ``camera_transforms``,
    ``model.shape_transform`` and ``model.shape_scale``, :attr:`mesh_colors` and the
    Gaussian parameters :attr:`gaussians`, for those that require grad (the sensor's own
    tables require grad when the model was finalized with ``requires_grad=True``). The
    shape scale of a Gaussian shape scales its centres per axis and its extents by the mean
    factor (exact for a uniform scale, the only kind newton's Gaussians are meant for).

    Args:
        model: a ``newton.Model``; its visible mesh, convex mesh, box, sphere, ellipsoid,
            capsule and Gaussian shapes are drawn (planes are skipped; other visible
            types raise ValueError unless ``skip_unsupported``).
        width, height: image size in pixels.
        camera_fov: vertical field of view in radians (principal point at the centre), or
        intrinsics: (fx, fy, cx, cy) in pixels (OpenCV's: x right, y down; pixel centres at
            +0.5).
        near, far: depth range, m: Gaussians outside are culled, triangles clipped.
        settings: ``arc_warp.RenderSettings`` of the splat renders (its ``background`` shows
            where nothing is drawn; ``reduce`` selects the splat backward's accumulator).
        antialias: antialias the shapes' silhouettes (``arc_warp.mesh.antialias`` over the
            composite image, so an edge blends with the Gaussians or background beside it):
            without it silhouettes give the poses no gradient.
        mesh_reduce: accumulator of the mesh ops' backwards.
        sphere_rings, sphere_segments: tessellation of spheres, ellipsoids and capsules.
    """

    def __init__(self, model, width: int, height: int, *, camera_fov: float | None = None, intrinsics=None,
                 near: float = 0.01, far: float = 1000.0, settings: RenderSettings | None = None,
                 antialias: bool = True, mesh_reduce: str = "arc", sphere_rings: int = 12, sphere_segments: int = 24,
                 skip_unsupported: bool = False):
        if not isinstance(model, newton.Model):
            raise TypeError(f"model must be a newton.Model, got {type(model).__name__}")
        if (camera_fov is None) == (intrinsics is None):
            raise ValueError("give camera_fov (vertical, radians) or intrinsics (fx, fy, cx, cy), not both")
        if camera_fov is not None:
            if not 0.0 < float(camera_fov) < math.pi:
                raise ValueError(f"camera_fov must be in (0, pi) radians, got {camera_fov!r}")
            camera = Camera.from_fov(math.degrees(camera_fov), width, height, near=near, far=far)
        else:
            try:
                fx, fy, cx, cy = (float(v) for v in intrinsics)
            except (TypeError, ValueError):
                raise ValueError(f"intrinsics must be (fx, fy, cx, cy) in pixels, got {intrinsics!r}") from None
            camera = Camera(fx, fy, cx, cy, width, height, near=near, far=far)
        if settings is None:
            settings = RenderSettings()
        elif not isinstance(settings, RenderSettings):
            raise TypeError(f"settings must be an arc_warp.RenderSettings, got {type(settings).__name__}")
        self.model = model
        self.device = model.device
        self.camera = camera  # at the origin: each view's geometry comes in its camera frame
        self.width, self.height = camera.width, camera.height
        self.settings = settings
        self.antialias = bool(antialias)
        self.mesh_reduce = mesh_reduce
        self._projection = wp.mat44(*camera_clip_matrix(camera).astype(np.float32).ravel())
        self._tables = gather(model, sphere_rings, sphere_segments, skip_unsupported)
        self._layouts: dict[tuple, ViewLayout] = {}
        self.workspace = Workspace(self.device)  # the splat renderers, reused by every update

    @property
    def gaussians(self) -> SensorGaussians:
        """The Gaussian parameters every update reads (see :class:`SensorGaussians`)."""
        return self._tables.gaussians

    @property
    def mesh_colors(self) -> wp.array:
        """(Vm,) wp.vec3 RGB of the drawn shapes' vertices, block by block in shape order
        (:meth:`mesh_vertices`), initialised from ``Model.shape_color``."""
        return self._tables.colors

    def mesh_vertices(self, shape: int) -> tuple[int, int]:
        """(first row, count) of shape ``shape``'s vertices in :attr:`mesh_colors`."""
        if shape not in self._tables.meshes:
            raise ValueError(f"shape {shape} is not a drawn mesh-like shape")
        return self._tables.meshes[shape][:2]

    def gaussian_rows(self, shape: int) -> tuple[int, int]:
        """(first row, count) of Gaussian shape ``shape``'s asset in :attr:`gaussians`."""
        if shape not in self._tables.splats:
            raise ValueError(f"shape {shape} is not a drawn Gaussian shape")
        return self._tables.splats[shape]

    def allocate_image_color(self, view_count: int, requires_grad: bool = False) -> wp.array:
        """Zeroed (view_count, height, width) wp.vec3 on the model's device."""
        return wp.zeros((int(view_count), self.height, self.width), dtype=wp.vec3, device=self.device,
                        requires_grad=requires_grad)

    def update(self, state, camera_transforms: wp.array, *, color_image: wp.array | None = None,
               world_indices=None) -> wp.array:
        """Renders ``state`` from every view into ``color_image`` and returns it.

        Args:
            state: a ``newton.State`` of the model (``body_q`` poses the bodies).
            camera_transforms: (V,) wp.transform, world from camera of each view (newton's
                convention: the camera looks along local -Z, +Y up), on the model's device.
            color_image: (V, H, W) wp.vec3 to write (:meth:`allocate_image_color`), or None
                for a new one. Gets ``requires_grad`` when an input requires grad.
            world_indices: the world of each view (V ints, or a wp.array of int32, read on the
                host); None: view ``v`` shows world ``v``. A world shows its own shapes and
                the global ones (``shape_world`` -1).

        Bad input raises TypeError / ValueError before anything is launched; non-finite
        values reach the splat renders' device checks (ValueError naming means or quats).
        """
        body_q, views, worlds = self._check(state, camera_transforms, color_image, world_indices)
        lay = self._layout(worlds)
        t = self._tables
        grad = any(a.requires_grad for a in (body_q, camera_transforms, self.model.shape_transform,
                                             self.model.shape_scale, t.colors, *t.gaussians.arrays))
        if color_image is None:
            color_image = self.allocate_image_color(views, grad)
        elif grad and not color_image.requires_grad:
            color_image.requires_grad = True  # before the per-view views below share its .grad
        clip, vertex_colors, splats = self._place(lay, body_q, camera_transforms, grad)
        composite, surface_colors, surface_depths, rast = color_image, None, None, None
        if lay.has_meshes:
            rast, surface_colors, surface_depths = self._surfaces(lay, clip, vertex_colors)
            if self.antialias:  # the composite goes through antialias into color_image
                composite = wp.empty_like(color_image, requires_grad=grad)
        for v in range(views):
            lo, hi = lay.gaussian_offsets[v], lay.gaussian_offsets[v + 1]
            own = [a[lo:hi] if hi > lo else wp.empty(0, dtype=a.dtype, device=self.device) for a in splats]
            surface = {} if surface_colors is None else {"surface_colors": surface_colors[v],
                                                         "surface_depths": surface_depths[v]}
            render_gaussians(*own, self.camera, self.settings, workspace=self.workspace,
                             outputs={"color": composite[v]}, **surface)
        if composite is not color_image:
            # the silhouettes blend with what the composite shows beside them (Gaussians or
            # background), so their gradients see the colours the loss sees
            dr.antialias(composite.view(wp.float32), rast, clip, lay.tri, topology_hash=lay.topology,
                         reduce=self.mesh_reduce, out=color_image.view(wp.float32))
        return color_image

    def _layout(self, worlds: tuple) -> ViewLayout:
        """The layout of views of ``worlds`` (made on first use)."""
        lay = self._layouts.get(worlds)
        if lay is None:
            lay = self._layouts[worlds] = layout(self._tables, worlds, self.device)
        return lay

    def _place(self, lay: ViewLayout, body_q: wp.array, camera_transforms: wp.array, grad: bool) -> tuple:
        """Every view's vertices in clip space ((Vt, 4) float32, w = camera z) with their
        colours ((Vt, 3) float32), and its Gaussians in its camera frame (means, quats wxyz,
        scales, opacities, RGB; (Gt,) each, view ``v``'s at ``lay.gaussian_offsets[v]``)."""
        t, device = self._tables, self.device
        common = (self.model.shape_body, self.model.shape_transform, self.model.shape_scale, body_q,
                  camera_transforms)
        count = lay.vertex.shape[0]
        clip = wp.empty((count, 4), dtype=wp.float32, device=device, requires_grad=grad)
        colors = wp.empty((count, 3), dtype=wp.float32, device=device, requires_grad=grad)
        if count:
            wp.launch(shape_vertices_to_clip, dim=count,
                      inputs=[lay.vertex, lay.vertex_view, t.vertex_shape, t.vertex_a, t.vertex_b, t.vertex_c,
                              t.colors, *common, self._projection], outputs=[clip.view(wp.vec4), colors.view(wp.vec3)],
                      device=device)
        n = lay.gaussian.shape[0]
        splats = [wp.empty(n, dtype=dt, device=device, requires_grad=grad)
                  for dt in (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3)]
        if n:
            wp.launch(gaussians_to_camera, dim=n, inputs=[lay.gaussian, lay.gaussian_shape, lay.gaussian_view,
                                                          *t.gaussians.arrays, *common], outputs=splats, device=device)
        return clip, colors, splats

    def _surfaces(self, lay: ViewLayout, clip: wp.array, colors: wp.array) -> tuple[wp.array, wp.array, wp.array]:
        """Every view's rasterised shapes: ``rast`` (V, H, W, 4) and the (V, H, W) surface
        colours (interpolated vertex colours) and camera depths."""
        reduce = self.mesh_reduce
        rast, _ = dr.rasterize(clip, lay.tri, (self.height, self.width), ranges=lay.ranges, grad_db=False,
                               reduce=reduce)
        image, _ = dr.interpolate(colors, rast, lay.tri, reduce=reduce)
        # the projection maps the camera's y (down) to NDC y: row 0 is the picture's top
        return (rast, *surface_from_mesh(image, rast, clip, lay.tri, flip_y=False))

    def _check(self, state, camera_transforms, color_image, world_indices) -> tuple[wp.array, int, tuple]:
        """(body_q, view count, worlds per view) of a valid call; TypeError / ValueError else."""
        model, device = self.model, self.device
        if not isinstance(state, newton.State):
            raise TypeError(f"state must be a newton.State, got {type(state).__name__}")
        body_q = state.body_q
        if model.body_count:
            check_array(body_q, "state.body_q", wp.transform, 1, (model.body_count,), device)
        else:
            body_q = wp.empty(0, dtype=wp.transform, device=device)
        check_array(camera_transforms, "camera_transforms", wp.transform, 1, None, device)
        views = camera_transforms.shape[0]
        if views < 1:
            raise ValueError("camera_transforms is empty: give one camera transform per view")
        world_count = max(model.world_count, 1)
        if world_indices is None:
            if views > world_count:
                raise ValueError(f"{views} views but the model has {world_count} world(s); pass world_indices "
                                 "(the world of each view) for more views than worlds")
            worlds = tuple(range(views))
        else:
            values = world_indices.numpy() if isinstance(world_indices, wp.array) else world_indices
            worlds = tuple(int(w) for w in np.asarray(values).reshape(-1))
            if len(worlds) != views:
                raise ValueError(f"world_indices has {len(worlds)} entries for {views} camera transforms (one each)")
            bad = [w for w in worlds if not 0 <= w < world_count]
            if bad:
                raise ValueError(f"world_indices {bad} are outside the model's worlds [0, {world_count})")
        if color_image is not None:
            check_array(color_image, "color_image", wp.vec3, 3, (views, self.height, self.width), device)
        return body_q, views, worlds
