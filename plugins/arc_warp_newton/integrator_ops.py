"""A minimal differentiable particle integrator in Warp (no newton needed).

Semi-implicit (symplectic) Euler under a uniform gravity vector, with an optional
ground plane through the origin (normal ``up``) acting as a Hunt-Crossley penalty
spring-damper (force ``depth * (ke - kd * min(v_n, 0))`` per unit inverse mass).
Every step is a Warp launch with a generated adjoint, so on an active ``wp.Tape``
gradients flow from the returned positions back to the initial velocity and gravity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import warp as wp

from .integrator_kernels import broadcast_velocity_kernel, euler_step_kernel


@dataclass(frozen=True)
class IntegratorSettings:
    """Options of :class:`ParticleIntegrator`.

    dt: time step, seconds (> 0). ground: enable the ground plane. up: (3,) unit normal
    of the ground (the plane passes through the origin). ground_ke: penalty stiffness,
    N/m. ground_kd: damping on approach per unit penetration depth, N s/m^2. A
    particle's contact depth is its radius minus its height above the plane.
    """

    dt: float = 1.0 / 60.0
    ground: bool = False
    up: tuple[float, float, float] = (0.0, 0.0, 1.0)
    ground_ke: float = 1.0e4
    ground_kd: float = 1.0e3

    def __post_init__(self):
        if not (math.isfinite(self.dt) and self.dt > 0):
            raise ValueError(f"IntegratorSettings.dt must be a finite float > 0, got {self.dt!r}")
        up = np.asarray(self.up, dtype=np.float64)
        if up.shape != (3,) or not np.isclose(np.linalg.norm(up), 1.0, atol=1e-6):
            raise ValueError(f"IntegratorSettings.up must be a unit 3-vector, got {self.up!r}")
        object.__setattr__(self, "up", tuple(float(v) for v in up))
        for name in ("ground_ke", "ground_kd"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"IntegratorSettings.{name} must be a finite float >= 0, got {value!r}")


class ParticleIntegrator:
    """Semi-implicit Euler particles.

    Args:
        positions: (N, 3) initial positions, world units (numpy or wp.vec3 array; copied).
        masses: float or (N,) masses, kg (0 pins a particle).
        radii: float or (N,) radii, world units (used by the ground contact).
        settings: :class:`IntegratorSettings`.
        device: Warp device (default: Warp's default device).
    """

    def __init__(self, positions, masses=1.0, radii=0.05, settings: IntegratorSettings | None = None, device=None):
        self.settings = IntegratorSettings() if settings is None else settings
        if not isinstance(self.settings, IntegratorSettings):
            raise TypeError(f"settings must be IntegratorSettings, got {type(self.settings).__name__}")
        self.device = wp.get_device(device)
        pos = positions.numpy() if isinstance(positions, wp.array) else np.asarray(positions, dtype=np.float32)
        if pos.ndim != 2 or pos.shape[1] != 3 or pos.shape[0] == 0 or not np.all(np.isfinite(pos)):
            raise ValueError(f"positions must be finite (N, 3) with N >= 1, got shape {pos.shape}")
        n = pos.shape[0]
        masses = np.broadcast_to(np.asarray(masses, dtype=np.float64), (n,))
        radii = np.broadcast_to(np.asarray(radii, dtype=np.float32), (n,))
        if np.any(masses < 0) or not np.all(np.isfinite(masses)):
            raise ValueError("masses must be finite and >= 0")
        if np.any(radii < 0) or not np.all(np.isfinite(radii)):
            raise ValueError("radii must be finite and >= 0")
        inv = np.where(masses > 0, 1.0 / np.where(masses > 0, masses, 1.0), 0.0).astype(np.float32)
        self.particle_q = wp.array(pos.astype(np.float32), dtype=wp.vec3, device=self.device)
        self.particle_inv_mass = wp.array(inv, dtype=float, device=self.device)
        self.particle_radius = wp.array(np.ascontiguousarray(radii), dtype=float, device=self.device)

    @property
    def particle_count(self) -> int:
        return self.particle_q.shape[0]

    def rollout(
        self,
        velocity: wp.array,  # (1,) or (N,) wp.vec3 initial velocity, m/s
        gravity: wp.array,  # (1,) wp.vec3 acceleration, m/s^2
        steps: int,
    ) -> list[wp.array]:
        """Simulate ``steps`` steps from the initial positions with the given initial
        velocity (a (1,) array is shared by all particles) and gravity.

        Returns ``steps + 1`` (N,) wp.vec3 position arrays (index 0 = initial state).
        On an active ``wp.Tape`` every launch is recorded; gradients reach
        ``velocity.grad`` and ``gravity.grad`` when those have ``requires_grad``.
        """
        n, dev = self.particle_count, self.device
        check_vec3_param(velocity, "velocity", (1, n), dev)
        check_vec3_param(gravity, "gravity", (1,), dev)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        grad = velocity.requires_grad or gravity.requires_grad
        s = self.settings
        q = wp.clone(self.particle_q, requires_grad=grad)
        qd = wp.empty(n, dtype=wp.vec3, device=dev, requires_grad=grad)
        wp.launch(broadcast_velocity_kernel, dim=n, inputs=[velocity, int(velocity.shape[0] == n and n != 1)],
                  outputs=[qd], device=dev)
        ke = s.ground_ke if s.ground else 0.0
        out = [q]
        for _ in range(steps):
            q_new = wp.empty_like(q, requires_grad=grad)
            qd_new = wp.empty_like(qd, requires_grad=grad)
            wp.launch(euler_step_kernel, dim=n,
                      inputs=[q, qd, self.particle_inv_mass, self.particle_radius, gravity, wp.vec3(*s.up),
                              ke, s.ground_kd, s.dt],
                      outputs=[q_new, qd_new], device=dev)
            q, qd = q_new, qd_new
            out.append(q)
        return out


def check_vec3_param(arr, name: str, sizes: tuple[int, ...], device) -> None:
    if not isinstance(arr, wp.array) or arr.dtype != wp.vec3 or arr.ndim != 1:
        got = f"{type(arr).__name__}" if not isinstance(arr, wp.array) else f"ndim={arr.ndim} dtype={arr.dtype}"
        raise TypeError(f"{name} must be a 1-D wp.array of wp.vec3, got {got}")
    if arr.shape[0] not in sizes:
        raise ValueError(f"{name} must have {' or '.join(map(str, sorted(set(sizes))))} elements, got {arr.shape[0]}")
    if arr.device != device:
        raise ValueError(f"{name} is on {arr.device}, the simulation on {device}")
