"""Kernels of :class:`SensorHybridCamera`: a model's shapes and Gaussians in each view's
camera frame.

Per-element maps with generated adjoints (no loops), so ``wp.Tape`` carries the image
gradients back into ``body_q``, the shapes' transforms and scales, the camera transforms,
the vertex colours and the Gaussians' parameters. Each view's camera frame is OpenCV's
(x right, y down, z forward): newton's camera looks along its local -Z with +Y up, so the
camera-from-world transform is ``flip * inverse(camera_transform)``, ``flip`` the half turn
about x.
"""

import warp as wp

SH_C0 = 0.28209479177387814  # the degree-0 SH basis constant (newton's and arc_warp's)


@wp.func
def shape_in_world(shape: int, shape_body: wp.array(dtype=wp.int32), shape_transform: wp.array(dtype=wp.transform),
                   body_q: wp.array(dtype=wp.transform)) -> wp.transform:
    """World from shape frame: the shape's body pose (identity for static shapes) times
    its transform in the body."""
    b = shape_body[shape]
    x = shape_transform[shape]
    if b >= 0:
        x = wp.transform_multiply(body_q[b], x)
    return x


@wp.func
def camera_from_world(camera: wp.transform) -> wp.transform:
    """OpenCV camera frame from world, for a newton camera transform (world from camera,
    looking along -Z, +Y up)."""
    flip = wp.transform(wp.vec3(0.0, 0.0, 0.0), wp.quat(1.0, 0.0, 0.0, 0.0))  # half turn about x
    return wp.transform_multiply(flip, wp.transform_inverse(camera))


@wp.kernel
def shape_vertices_to_clip(
    vertex: wp.array(dtype=wp.int32),  # (Vt,) the model vertex each view vertex copies
    vertex_view: wp.array(dtype=wp.int32),  # (Vt,) its view
    model_shape: wp.array(dtype=wp.int32),  # (Vm,) shape of each model vertex
    model_a: wp.array(dtype=wp.vec3),  # (Vm,) point = a * scale + b * scale.x + c * scale.y
    model_b: wp.array(dtype=wp.vec3),  # (Vm,)
    model_c: wp.array(dtype=wp.vec3),  # (Vm,)
    model_color: wp.array(dtype=wp.vec3),  # (Vm,) RGB
    shape_body: wp.array(dtype=wp.int32),  # (S,) newton Model.shape_body
    shape_transform: wp.array(dtype=wp.transform),  # (S,) Model.shape_transform
    shape_scale: wp.array(dtype=wp.vec3),  # (S,) Model.shape_scale
    body_q: wp.array(dtype=wp.transform),  # (B,) State.body_q
    cameras: wp.array(dtype=wp.transform),  # (V,) world from camera
    projection: wp.mat44,  # clip from OpenCV camera
    clip: wp.array(dtype=wp.vec4),  # (Vt,) clip-space positions, w = camera z
    color: wp.array(dtype=wp.vec3),  # (Vt,) vertex colours
):
    i = wp.tid()
    m = vertex[i]
    s = model_shape[m]
    scale = shape_scale[s]
    local = wp.cw_mul(model_a[m], scale) + model_b[m] * scale[0] + model_c[m] * scale[1]
    x = wp.transform_multiply(camera_from_world(cameras[vertex_view[i]]),
                              shape_in_world(s, shape_body, shape_transform, body_q))
    p = wp.transform_point(x, local)
    clip[i] = projection * wp.vec4(p[0], p[1], p[2], 1.0)
    color[i] = model_color[m]


@wp.kernel
def gaussians_to_camera(
    gaussian: wp.array(dtype=wp.int32),  # (Gt,) the parameter row each view Gaussian reads
    gaussian_shape: wp.array(dtype=wp.int32),  # (Gt,) its shape
    gaussian_view: wp.array(dtype=wp.int32),  # (Gt,) its view
    positions: wp.array(dtype=wp.vec3),  # (P,) shape-frame centres (before the shape scale)
    rotations: wp.array(dtype=wp.quat),  # (P,) shape-frame rotations, xyzw
    scales: wp.array(dtype=wp.vec3),  # (P,) std-devs (before the shape scale)
    opacities: wp.array(dtype=float),  # (P,) in [0, 1]
    sh_dc: wp.array(dtype=wp.vec3),  # (P,) degree-0 SH coefficients
    shape_body: wp.array(dtype=wp.int32),  # (S,)
    shape_transform: wp.array(dtype=wp.transform),  # (S,)
    shape_scale: wp.array(dtype=wp.vec3),  # (S,)
    body_q: wp.array(dtype=wp.transform),  # (B,)
    cameras: wp.array(dtype=wp.transform),  # (V,) world from camera
    means: wp.array(dtype=wp.vec3),  # (Gt,) camera-frame centres
    quats: wp.array(dtype=wp.vec4),  # (Gt,) camera-frame rotations, wxyz
    out_scales: wp.array(dtype=wp.vec3),  # (Gt,)
    out_opacities: wp.array(dtype=float),  # (Gt,)
    colors: wp.array(dtype=wp.vec3),  # (Gt,) RGB
):
    i = wp.tid()
    g = gaussian[i]
    s = gaussian_shape[i]
    scale = shape_scale[s]
    x = wp.transform_multiply(camera_from_world(cameras[gaussian_view[i]]),
                              shape_in_world(s, shape_body, shape_transform, body_q))
    means[i] = wp.transform_point(x, wp.cw_mul(positions[g], scale))
    q = wp.transform_get_rotation(x) * rotations[g]
    quats[i] = wp.vec4(q[3], q[0], q[1], q[2])
    # newton scales the whole asset; a Gaussian's extent follows the mean of the three
    # factors, which is the scale itself for the uniform scales this is exact for
    out_scales[i] = scales[g] * ((scale[0] + scale[1] + scale[2]) / 3.0)
    out_opacities[i] = opacities[g]
    # newton's Gaussian colour: the degree-0 SH term, + 0.5, clamped at 0
    colors[i] = wp.max(sh_dc[g] * SH_C0 + wp.vec3(0.5, 0.5, 0.5), wp.vec3(0.0, 0.0, 0.0))
