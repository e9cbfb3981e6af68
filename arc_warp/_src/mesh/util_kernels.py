"""Elementwise kernels shared by the mesh ops (launched with record_tape=False, so copies
of differentiable inputs never put Warp's own copy adjoints on a tape)."""

import warp as wp

from arc_warp._src.mesh.raster_kernels import tri_vertices


@wp.kernel(enable_backward=False, module="unique")
def copy_into(src: wp.array(dtype=float), dst: wp.array(dtype=float)):
    """dst = src (flat, same size): a launch that a workspace replays, cheaper on the host than wp.copy."""
    i = wp.tid()
    dst[i] = src[i]


@wp.kernel(enable_backward=False, module="unique")
def first_bad_triangle(tri: wp.array(dtype=wp.vec3i), num_vertices: int, first: wp.array(dtype=wp.int32)):
    """first[0] = the lowest triangle with an index outside [0, num_vertices) (min with its value on entry)."""
    t = wp.tid()
    if tri_vertices(tri, t, num_vertices)[0] < 0:
        wp.atomic_min(first, 0, t)


@wp.kernel(enable_backward=False, module="unique")
def publish_first(first: wp.array(dtype=wp.int32), seen: wp.array(dtype=wp.int32), none: int):
    """seen[0] = first[0] (host memory the host reads), then first[0] = ``none`` for the next
    check: one thread, launched after :func:`first_bad_triangle`, in place of a fill and a copy
    (each about 50 us of host time on CUDA)."""
    seen[0] = first[0]
    first[0] = none
