"""Surfaces composited behind the Gaussians (:class:`Surface`): the checks of
``render_gaussians``' surface arguments, and the mesh ops' images turned into a surface
(:func:`surface_from_mesh`)."""

from __future__ import annotations

import warp as wp

from arc_warp._src.splat.records import Surface
from arc_warp._src.splat.surface_kernels import surface_from_mesh_bwd, surface_from_mesh_fwd
from arc_warp._src.tape import active_tape
from arc_warp._src.validate import check_array


def surface_from_mesh(
    color: wp.array,  # [B, H, W, 3] float32, the mesh image (e.g. antialias's output)
    rast: wp.array,  # [B, H, W, 4] float32 from arc_warp.mesh.rasterize
    pos: wp.array,  # [V, 4] or [B, V, 4] float32, the clip-space positions rasterised
    tri: wp.array,  # [F, 3] int32, the triangles rasterised
    *,
    flip_y: bool,
) -> tuple[wp.array, wp.array]:
    """The surface of a mesh render, for ``render_gaussians(surface_colors=, surface_depths=)``.

    Colours are the mesh image's, moved to the splat image's row order; depths are the
    camera depth of the surface point each pixel sees: clip ``w`` interpolated with the
    pixel's perspective-correct barycentrics (``w`` is affine in the triangle's 3D
    points, so this is the point's own ``w``), +inf where no triangle covers the pixel.
    That is the depth the Gaussians are sorted by when ``pos`` has ``w`` = camera z of the
    splat camera, as every projection ``P @ world_to_camera`` with P's last row (0, 0, 1, 0)
    gives (OpenCV axes, z forward; e.g. ``arc_warp_newton.camera_clip_matrix``); unlike
    inverting ``z/w``, it needs neither near nor far and keeps float32's relative precision.

    ``flip_y``: True when the mesh image's row 0 is the picture's bottom, as with an
    OpenGL-style projection (y up) and nvdiffrast's memory order (``rasterize`` puts row 0
    at NDC y = -1); False when the projection maps the camera's y (down) to NDC y, so that
    row 0 is the picture's top, as ``arc_warp_newton.camera_clip_matrix`` does.

    Silhouettes: of ``antialias``'s blend across a silhouette only the pixels inside the
    mesh reach the image (and carry its gradient to the vertices). Recorded on an active
    ``wp.Tape`` when ``color.requires_grad``: the colours' gradient is added into
    ``color.grad``; the depths have none (visibility is a step in them).

    Example (one camera; ``clip`` [1, V, 4] from an OpenGL-style projection whose w is
    the camera z; inside ``with tape:`` the loss's gradient reaches ``clip.grad``)::

        import arc_warp.mesh as dr

        rast, _ = dr.rasterize(clip, tri, (camera.height, camera.width))
        color, _ = dr.interpolate(vertex_colors, rast, tri)
        color = dr.antialias(color, rast, clip, tri)
        colors, depths = surface_from_mesh(color, rast, clip, tri, flip_y=True)
        out = render_gaussians(means, quats, scales, opacities, rgb, camera,
                               surface_colors=colors[0], surface_depths=depths[0])

    Returns:
        ``(colors, depths)``: [B, H, W] wp.vec3 and [B, H, W] float32 (world units), row 0
        at the top; ``colors[b]`` and ``depths[b]`` are camera b's surface (a view of
        ``colors`` shares its gradient).
    """
    if not isinstance(flip_y, bool):
        raise TypeError(f"flip_y must be a bool, got {type(flip_y).__name__}")
    color = check_array(color, "color", wp.float32, 4, last=3)
    b, h, w, _ = color.shape
    device = color.device
    check_array(rast, "rast", wp.float32, 4, (b, h, w, 4), device)
    check_array(pos, "pos", wp.float32, (2, 3), None, device, last=4)
    if pos.ndim == 3 and pos.shape[0] not in (1, b):
        raise ValueError(f"pos: expected a minibatch of 1 or {b} (that of color), got {pos.shape[0]}")
    check_array(tri, "tri", wp.int32, 2, None, device, last=3)
    v = pos.shape[-2]
    pos_rows = pos.reshape((1 if pos.ndim == 2 else pos.shape[0], v, 4)).view(wp.vec4)
    colors = wp.empty((b, h, w), dtype=wp.vec3, device=device, requires_grad=color.requires_grad)
    depths = wp.empty((b, h, w), dtype=wp.float32, device=device)
    flip = int(flip_y)
    wp.launch(surface_from_mesh_fwd, dim=(b, h, w),
              inputs=[color.view(wp.vec3), rast.view(wp.vec4), pos_rows, tri.view(wp.vec3i), flip],
              outputs=[colors, depths], device=device, record_tape=False)
    tape = active_tape()
    if tape is not None and color.requires_grad:
        def backward():
            wp.launch(surface_from_mesh_bwd, dim=(b, h, w), inputs=[colors.grad, flip],
                      outputs=[color.grad.view(wp.vec3)], device=device, record_tape=False)

        tape.record_func(backward, [colors, color])
    return colors, depths


def check_surfaces(colors, depths, shapes: list[tuple[int, int]], batch: bool, device) -> list[Surface] | None:
    """The per-camera :class:`Surface` of ``render_gaussians``' ``surface_colors`` /
    ``surface_depths`` (both None: None) for cameras of image sizes ``shapes``: (H, W)
    arrays for one camera, lists of C of them or (C, H, W) arrays for a batch. TypeError /
    ValueError for anything else (a missing half, a wrong dtype, shape or device)."""
    if colors is None and depths is None:
        return None
    if colors is None or depths is None:
        raise ValueError("surface_colors and surface_depths go together: give both (+inf depth where a pixel has "
                         "no surface) or neither")

    def per_camera(value, name):
        if not batch:
            return [value]
        if isinstance(value, wp.array) and value.ndim == 3:
            return [value[i] for i in range(value.shape[0])]
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{name} for a list of {len(shapes)} cameras must be a list of (H, W) wp.arrays or a "
                            f"(C, H, W) wp.array, got {type(value).__name__}")
        return list(value)

    colors, depths = per_camera(colors, "surface_colors"), per_camera(depths, "surface_depths")
    if len(colors) != len(shapes) or len(depths) != len(shapes):
        raise ValueError(f"surface_colors and surface_depths need one image per camera ({len(shapes)}), got "
                         f"{len(colors)} and {len(depths)}")
    surfaces = []
    for i, (c, d, shape) in enumerate(zip(colors, depths, shapes)):
        at = f"[{i}]" if batch else ""
        surfaces.append(Surface(check_array(c, f"surface_colors{at}", wp.vec3, 2, shape, device),
                                check_array(d, f"surface_depths{at}", wp.float32, 2, shape, device)))
    return surfaces
