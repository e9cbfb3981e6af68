"""Kernels for fitting simulation parameters to images (generated adjoints)."""

import warp as wp


@wp.kernel
def image_sq_error_kernel(
    image: wp.array2d(dtype=wp.vec3),
    target: wp.array2d(dtype=wp.vec3),
    weight: float,  # 1 / (pixels * images): the loss is a mean
    loss: wp.array(dtype=float),
):
    y, x = wp.tid()
    d = image[y, x] - target[y, x]
    wp.atomic_add(loss, 0, weight * wp.dot(d, d))
