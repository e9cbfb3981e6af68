"""Bridges to newton (needs ``pip install arc-warp[newton]``).

- :class:`NewtonRollout`: steps a newton ``Model`` inside the active ``wp.Tape`` with
  the initial linear velocity and the gravity fed in as differentiable parameters.
- :func:`shape_surface_samples`: :class:`SurfaceSamples` on a model's sphere and box
  shapes, for :func:`bodies_to_gaussians`.
"""

from __future__ import annotations

import numpy as np
import warp as wp

import newton

from .convert_ops import SurfaceSamples, box_surface_samples, sphere_surface_samples
from .integrator_kernels import broadcast_velocity_kernel
from .integrator_ops import check_vec3_param


@wp.kernel
def set_body_linear_velocity_kernel(
    velocity: wp.array(dtype=wp.vec3),  # (1,) or (B,)
    stride: int,
    body_qd_in: wp.array(dtype=wp.spatial_vector),
    body_qd: wp.array(dtype=wp.spatial_vector),
):
    # newton's body_qd is (linear, angular); the angular part is kept
    i = wp.tid()
    w = wp.spatial_bottom(body_qd_in[i])
    body_qd[i] = wp.spatial_vector(velocity[i * stride], w)


class NewtonRollout:
    """Differentiable rollouts of a newton model.

    Args:
        model: a ``newton.Model`` finalized with ``requires_grad=True``.
        solver: a newton solver for ``model`` (default ``SolverSemiImplicit(model)``,
            whose adjoints newton supports; XPBD also gave correct gradients in our checks).
        dt: time step, seconds.
        contacts: ``newton.Contacts`` passed to every step, or None (no contacts). For a
            static ground, newton's diffsim examples collide once with a large
            ``soft_contact_gap`` and reuse the result.
        control: ``newton.Control`` passed to every step (default ``model.control()``).

    The rollout owns ``model.gravity``: each :meth:`rollout` replaces it by a fresh array
    filled (on the tape) from its ``gravity`` argument. Fresh, so that gradients of two
    rollouts on one tape, or of successive tapes, never mix through a shared array.
    Between iterations call ``tape.zero()`` after reading the gradients (as newton's
    diffsim examples do): some arrays persist across rollouts, and without it their
    stale gradients feed the next backward pass.
    """

    def __init__(self, model, solver=None, dt: float = 1.0 / 60.0, contacts=None, control=None):
        if not isinstance(model, newton.Model):
            raise TypeError(f"model must be a newton.Model, got {type(model).__name__}")
        if not model.requires_grad:
            raise ValueError("model must be finalized with requires_grad=True for differentiable rollouts")
        if not (np.isfinite(dt) and dt > 0):
            raise ValueError(f"dt must be a finite float > 0, got {dt!r}")
        self.model = model
        self.solver = newton.solvers.SolverSemiImplicit(model) if solver is None else solver
        self.dt = float(dt)
        self.contacts = contacts
        self.control = model.control() if control is None else control

    def rollout(
        self,
        velocity: wp.array,  # (1,) or (N,) wp.vec3 initial linear velocity, m/s
        gravity: wp.array,  # (1,) wp.vec3, m/s^2
        steps: int,
    ) -> list:
        """Simulate ``steps`` steps from the model's initial state.

        ``velocity`` sets every particle's initial velocity and every body's initial
        linear velocity (a (1,) array is shared; an (N,) array needs N == particle
        count, or body count when the model has no particles). Returns ``steps + 1``
        ``newton.State`` objects (index 0 = initial). On an active ``wp.Tape`` all
        launches are recorded, so gradients reach ``velocity.grad`` / ``gravity.grad``.
        """
        m = self.model
        n = m.particle_count if m.particle_count else m.body_count
        check_vec3_param(velocity, "velocity", (1, n), m.device)
        check_vec3_param(gravity, "gravity", (1,), m.device)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        m.gravity = wp.empty(m.gravity.shape[0], dtype=wp.vec3, device=m.device, requires_grad=True)
        wp.launch(broadcast_velocity_kernel, dim=m.gravity.shape[0], inputs=[gravity, 0], outputs=[m.gravity],
                  device=m.device)
        states = [m.state(requires_grad=True) for _ in range(steps + 1)]
        first = states[0]
        if m.particle_count:
            wp.launch(broadcast_velocity_kernel, dim=m.particle_count,
                      inputs=[velocity, int(velocity.shape[0] == m.particle_count and n != 1)],
                      outputs=[first.particle_qd], device=m.device)
        if m.body_count:
            qd_in = wp.clone(first.body_qd, requires_grad=False)
            stride = int(velocity.shape[0] == m.body_count and m.body_count != 1 and not m.particle_count)
            wp.launch(set_body_linear_velocity_kernel, dim=m.body_count, inputs=[velocity, stride, qd_in],
                      outputs=[first.body_qd], device=m.device)
        for i in range(steps):
            states[i].clear_forces()
            self.solver.step(states[i], states[i + 1], self.control, self.contacts, self.dt)
        return states


def shape_surface_samples(model, colors, *, sphere_count: int = 64, box_per_side: int = 4,
                          scale: float | None = None, opacity: float = 1.0,
                          skip_unsupported: bool = False) -> SurfaceSamples:
    """Gaussians on the surfaces of a newton model's sphere and box shapes.

    Each sample is fixed in its shape's body frame (``model.shape_transform`` applied),
    so :func:`bodies_to_gaussians` with ``State.body_q`` places them. Planes are skipped
    (infinite). ``colors``: an RGB triple for all shapes or a (S, 3) array per shape.
    ``scale``: std-dev of every sample (world units); None = the per-shape defaults of
    :func:`sphere_surface_samples` / :func:`box_surface_samples` (touching blobs).
    Other shape types raise ValueError unless ``skip_unsupported``.
    """
    types = model.shape_type.numpy()
    if types.size == 0:
        raise ValueError("model has no shapes")
    scale = model.shape_scale.numpy()
    xform = model.shape_transform.numpy()
    body = model.shape_body.numpy()
    cols = np.broadcast_to(np.asarray(colors, dtype=np.float32), (types.size, 3))
    parts = []
    for s, t in enumerate(types):
        if t == int(newton.GeoType.SPHERE):
            parts.append(sphere_surface_samples(int(body[s]), float(scale[s][0]), sphere_count, cols[s],
                                                scale=scale, opacity=opacity, shape_xform=xform[s], device=model.device))
        elif t == int(newton.GeoType.BOX):
            parts.append(box_surface_samples(int(body[s]), scale[s], box_per_side, cols[s],
                                             scale=scale, opacity=opacity, shape_xform=xform[s], device=model.device))
        elif t != int(newton.GeoType.PLANE) and not skip_unsupported:
            raise ValueError(f"shape {s} has type {newton.GeoType(t).name}; only SPHERE and BOX are sampled "
                             "(pass skip_unsupported=True to leave others out)")
    if not parts:
        raise ValueError("model has no sphere or box shapes to sample")
    return SurfaceSamples.concat(parts)
