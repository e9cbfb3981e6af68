"""Kernels turning simulation state into renderable Gaussians.

These are simple per-element maps, so Warp's generated adjoints are exact and the
kernels keep their backward (they sit on the tape between the simulator and the
renderer). Per-element attributes are read with a stride of 0 or 1 so one value can
be broadcast to every element without allocating a full array.
"""

import warp as wp


@wp.kernel
def particles_to_gaussians_kernel(
    particle_q: wp.array(dtype=wp.vec3),
    radius: wp.array(dtype=float),
    radius_stride: int,
    radius_scale: float,
    opacity: wp.array(dtype=float),
    opacity_stride: int,
    color: wp.array(dtype=wp.vec3),
    color_stride: int,
    means: wp.array(dtype=wp.vec3),
    quats: wp.array(dtype=wp.vec4),
    scales: wp.array(dtype=wp.vec3),
    opacities: wp.array(dtype=float),
    colors: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    r = radius[i * radius_stride] * radius_scale
    means[i] = particle_q[i]
    quats[i] = wp.vec4(1.0, 0.0, 0.0, 0.0)
    scales[i] = wp.vec3(r, r, r)
    opacities[i] = opacity[i * opacity_stride]
    colors[i] = color[i * color_stride]


@wp.kernel
def body_samples_to_gaussians_kernel(
    body_q: wp.array(dtype=wp.transform),
    sample_body: wp.array(dtype=wp.int32),
    sample_points: wp.array(dtype=wp.vec3),
    sample_quats: wp.array(dtype=wp.quat),
    sample_scales: wp.array(dtype=wp.vec3),
    sample_opacities: wp.array(dtype=float),
    sample_colors: wp.array(dtype=wp.vec3),
    means: wp.array(dtype=wp.vec3),
    quats: wp.array(dtype=wp.vec4),
    scales: wp.array(dtype=wp.vec3),
    opacities: wp.array(dtype=float),
    colors: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    b = sample_body[i]
    x = wp.transform_identity()
    if b >= 0:
        x = body_q[b]
    means[i] = wp.transform_point(x, sample_points[i])
    # warp quats are xyzw; the renderer takes wxyz
    r = wp.transform_get_rotation(x) * sample_quats[i]
    quats[i] = wp.vec4(r[3], r[0], r[1], r[2])
    scales[i] = sample_scales[i]
    opacities[i] = sample_opacities[i]
    colors[i] = sample_colors[i]
