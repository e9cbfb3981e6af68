"""Kernel placing body-frame mesh vertices in the clip space of each camera.

A per-vertex map, so Warp's generated adjoint is exact and the kernel keeps its backward:
on the tape it carries the clip-space position gradients of ``arc_warp.mesh`` back into
``body_q`` (and on into a simulator that produced ``body_q``).
"""

import warp as wp


@wp.kernel
def body_vertices_to_clip_kernel(
    body_q: wp.array(dtype=wp.transform),  # (B,) body poses, world from body
    vertex_body: wp.array(dtype=wp.int32),  # (V,) index into body_q; -1 = static (world frame)
    points: wp.array(dtype=wp.vec3),  # (V,) body-frame positions (world where the body is -1)
    clip_from_world: wp.array(dtype=wp.mat44),  # (C,) one projection per camera
    clip: wp.array2d(dtype=wp.vec4),  # (C, V) homogeneous clip-space positions
):
    c, v = wp.tid()
    b = vertex_body[v]
    x = wp.transform_identity()
    if b >= 0:
        x = body_q[b]
    p = wp.transform_point(x, points[v])
    clip[c, v] = clip_from_world[c] * wp.vec4(p[0], p[1], p[2], 1.0)
