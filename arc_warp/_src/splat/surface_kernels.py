"""Kernels turning the mesh ops' images into the rasteriser's per-pixel surface, and back.

One thread per pixel (b, y, x) of the splat image, row 0 at the top; ``flip`` 1 reads
mesh row ``H - 1 - y`` (an image whose row 0 is the picture's bottom), 0 row ``y``.
"""

import warp as wp

from arc_warp._src.mesh.interp_kernels import pixel_triangle


@wp.func
def mesh_row(y: int, height: int, flip: int) -> int:
    """The mesh image's row holding splat image row ``y``."""
    if flip != 0:
        return height - 1 - y
    return y


@wp.kernel(enable_backward=False)
def surface_from_mesh_fwd(
    color: wp.array3d(dtype=wp.vec3),  # (B, H, W) the mesh image, its rows as stored
    rast: wp.array3d(dtype=wp.vec4),  # (B, H, W) (u, v, z/w, triangle id + 1)
    pos: wp.array2d(dtype=wp.vec4),  # (P, V) clip space; P = 1 (range mode, or one instance) or B
    tri: wp.array(dtype=wp.vec3i),  # (F,)
    flip: int,
    out_colors: wp.array3d(dtype=wp.vec3),  # (B, H, W)
    out_depths: wp.array3d(dtype=float),  # (B, H, W) camera z, +inf without a triangle
):
    b, y, x = wp.tid()
    row = mesh_row(y, out_colors.shape[1], flip)
    out_colors[b, y, x] = color[b, row, x]
    r = rast[b, row, x]
    f = pixel_triangle(r, tri, pos.shape[1])
    depth = wp.inf
    if f[0] >= 0:
        p = wp.min(b, pos.shape[0] - 1)
        # clip w is affine in the triangle's 3D points, so the perspective-correct
        # barycentrics give the surface point's own w: its camera depth
        depth = r[0] * pos[p, f[0]][3] + r[1] * pos[p, f[1]][3] + (1.0 - r[0] - r[1]) * pos[p, f[2]][3]
    out_depths[b, y, x] = depth


@wp.kernel(enable_backward=False)
def surface_from_mesh_bwd(
    grad_colors: wp.array3d(dtype=wp.vec3),  # (B, H, W) dL/d(surface colour)
    flip: int,
    grad_color: wp.array3d(dtype=wp.vec3),  # (B, H, W) dL/d(mesh image), added to
):
    b, y, x = wp.tid()
    row = mesh_row(y, grad_colors.shape[1], flip)
    # each mesh pixel is one splat pixel's: a plain add
    grad_color[b, row, x] = grad_color[b, row, x] + grad_colors[b, y, x]
