"""The surface of a mesh render for ``rasterization(surface_colors=, surface_depths=)``: the
torch counterpart of ``arc_warp.splat.surface_from_mesh`` over the outputs of the
nvdiffrast drop-in (:mod:`arc_warp_torch.mesh`)."""

from __future__ import annotations

import torch
import warp as wp

from arc_warp.splat import surface_from_mesh as _core_surface
from arc_warp_torch._autograd import default_context
from arc_warp_torch._mesh_autograd import to_warp
from arc_warp_torch.mesh import _float, _int


def surface_from_mesh(
    color: torch.Tensor,  # [B, H, W, 3] the mesh image (e.g. antialias's output)
    rast: torch.Tensor,  # [B, H, W, 4] from arc_warp_torch.mesh.rasterize
    pos: torch.Tensor,  # [V, 4] or [B, V, 4] clip-space positions rasterised
    tri: torch.Tensor,  # [F, 3] int32 triangles rasterised
    *,
    flip_y: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(surface_colors [B, H, W, 3], surface_depths [B, H, W])`` float32 for
    ``rasterization``, row 0 at the top.

    The colours are the mesh image's rows in the splat image's order (differentiable:
    their gradient reaches ``color`` and, through the drop-in's ops, the vertices,
    attributes and textures). The depths are the camera depth of the surface point each
    pixel sees (clip ``w`` interpolated with the pixel's perspective-correct
    barycentrics), +inf where no triangle covers it, computed by
    ``arc_warp.splat.surface_from_mesh``; they carry no gradient (visibility is a step in
    them). They are the depths the Gaussians are sorted by when ``pos`` has ``w`` = camera z
    of the splat camera, as ``P @ viewmat`` does for a projection ``P`` whose last row is
    (0, 0, 1, 0).

    ``flip_y``: True when the mesh image's row 0 is the picture's bottom (an OpenGL-style
    projection, y up, in nvdiffrast's memory order), False when the projection maps the
    camera's y (down) to NDC y.

    Example (``clip`` [C, V, 4] from an OpenGL-style projection of each camera)::

        import arc_warp_torch.mesh as dr

        rast, _ = dr.rasterize(None, clip, tri, (height, width))
        color, _ = dr.interpolate(vertex_colors, rast, tri)
        color = dr.antialias(color, rast, clip, tri)
        surface_colors, surface_depths = surface_from_mesh(color, rast, clip, tri, flip_y=True)
        render, alpha, meta = rasterization(means, quats, scales, opacities, rgb, viewmats, Ks, width, height,
                                            surface_colors=surface_colors, surface_depths=surface_depths)
    """
    if not isinstance(flip_y, bool):
        raise TypeError(f"flip_y must be a bool, got {type(flip_y).__name__}")
    color = _float("color", color, (4,), 3)
    device = color.device
    for name, t in (("rast", rast), ("pos", pos), ("tri", tri)):
        if isinstance(t, torch.Tensor) and t.device != device:
            raise ValueError(f"{name}: expected device {device} (that of `color`), got {t.device}")
    rast = _float("rast", rast, (4,), 4).detach()
    pos = _float("pos", pos, (2, 3), 4).detach()
    tri = _int("tri", tri)
    with torch.no_grad(), default_context(device).stream():
        # the core checks the shapes before it launches; its colours are the flip below
        _, depths = _core_surface(to_warp(color), to_warp(rast), to_warp(pos), to_warp(tri), flip_y=flip_y)
        out = wp.to_torch(depths, requires_grad=False)
    out._warp_array = depths  # the tensor aliases Warp's memory: hold it
    return (color.flip(1) if flip_y else color), out
