"""Kernels of the minimal differentiable particle integrator (semi-implicit Euler).

Per-particle maps with no run-time loops, so Warp's generated adjoints are exact.
"""

import warp as wp


@wp.kernel
def broadcast_velocity_kernel(
    velocity: wp.array(dtype=wp.vec3),  # (1,) or (N,)
    stride: int,  # 0 broadcasts velocity[0]
    particle_qd: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    particle_qd[i] = velocity[i * stride]


@wp.kernel
def euler_step_kernel(
    q: wp.array(dtype=wp.vec3),
    qd: wp.array(dtype=wp.vec3),
    inv_mass: wp.array(dtype=float),
    radius: wp.array(dtype=float),
    gravity: wp.array(dtype=wp.vec3),  # (1,)
    up: wp.vec3,
    ground_ke: float,  # 0 disables the ground
    ground_kd: float,
    dt: float,
    q_out: wp.array(dtype=wp.vec3),
    qd_out: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    x = q[i]
    v = qd[i]
    w = inv_mass[i]
    accel = gravity[0]
    if w == 0.0:
        accel = wp.vec3(0.0)  # pinned particle
    depth = radius[i] - wp.dot(x, up)
    if ground_ke > 0.0 and depth > 0.0:
        vn = wp.dot(v, up)
        # Hunt-Crossley: spring plus damping on approach, both scaled by depth, so the
        # force is continuous at first touch and gradients match finite differences
        fn = depth * (ground_ke - ground_kd * wp.min(vn, 0.0))
        accel = accel + up * (fn * w)
    v_new = v + accel * dt
    qd_out[i] = v_new
    q_out[i] = x + v_new * dt
