"""Recover how a ball was thrown from rendered frames.

A ball made of particles (a small coloured lattice) is thrown under gravity. Target
frames are rendered from two cameras with the true initial velocity and gravity; then
both are recovered from a perturbed guess by gradient descent through simulation +
``arc_warp.render_gaussians``, all on one ``wp.Tape`` per iteration.

Choices that make the image loss usable (see ``ThrowBallConfig``):
- each particle is a Gaussian several pixels wide and the guess is 10-15 % off, so the
  rendered ball overlaps its target in every frame and the loss has a slope;
- the ball's colours vary across it, so its position is pinned in every direction;
- two cameras (side and oblique) make all three velocity components observable;
- Adam with per-parameter step sizes (in m/s and m/s^2) and a geometric decay of the
  step, since the loss scales differ between velocity and gravity.

Run: ``python -m arc_warp_newton.examples.throw_ball [--backend warp|newton] [--iters N]``.
``--backend warp`` uses the minimal Warp integrator (no newton needed); ``newton`` uses
``newton.solvers.SolverSemiImplicit``. Both use symplectic Euler, so frames agree.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np
import warp as wp

from arc_warp import Camera, RenderSettings, render_gaussians
from arc_warp_newton import NEWTON_HINT, IntegratorSettings, ParticleIntegrator, particles_to_gaussians
from arc_warp_newton.fit_ops import Adam, image_mse


@dataclass(frozen=True)
class ThrowBallConfig:
    """Scene, rendering and optimisation settings (SI units, z up)."""

    backend: str = "warp"  # "warp" (minimal integrator) or "newton"
    width: int = 32
    height: int = 32
    dt: float = 1.0 / 60.0
    frame_steps: tuple[int, ...] = (6, 12, 18, 24, 30)  # steps at which frames are rendered
    ball_center: tuple[float, float, float] = (-1.0, 0.0, 0.5)
    lattice: int = 2  # particles per side of the ball's cubic lattice
    spacing: float = 0.25  # lattice spacing, m: ~2.5 std-devs, so blobs touch but few tails
    # (cut at alpha 1/255 by the rasteriser, a step FD sees and gradients do not) lie deep
    # inside neighbouring blobs
    # physical radius, m: below spacing / 2 so newton's particle-particle contact stays idle
    particle_radius: float = 0.1
    gaussian_scale: float = 0.1  # Gaussian std-dev, m (about 1.1-2 px at these distances)
    # < 1: fully opaque overlapping blobs hit the rasteriser's alpha clamp (0.999) and
    # transmittance floor (1e-4), both steps in the image that gradients do not see
    opacity: float = 0.9
    true_velocity: tuple[float, float, float] = (2.0, 0.5, 3.0)
    true_gravity: tuple[float, float, float] = (0.0, 0.0, -9.81)
    init_velocity: tuple[float, float, float] = (1.75, 0.57, 3.4)  # 12-15 % off per component
    init_gravity: tuple[float, float, float] = (0.0, 0.0, -8.6)  # 12 % off
    # gravity components to fit; the rest stay at the guess. Fitting x/y too works but
    # they trade off against v0 over a short arc (a narrow valley), so it takes longer.
    fit_gravity_axes: tuple[bool, bool, bool] = (False, False, True)
    iterations: int = 120
    lr_velocity: float = 0.08  # Adam step, m/s
    lr_gravity: float = 0.25  # Adam step, m/s^2
    lr_decay: float = 0.035  # final step = lr * lr_decay (geometric schedule)
    render: RenderSettings = field(default_factory=RenderSettings)

    def __post_init__(self):
        if self.backend not in ("warp", "newton"):
            raise ValueError(f"backend must be 'warp' or 'newton', got {self.backend!r}")
        if not self.frame_steps or min(self.frame_steps) < 0:
            raise ValueError(f"frame_steps must be non-empty step indices >= 0, got {self.frame_steps!r}")
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations!r}")


@dataclass
class FitResult:
    """Outcome of :func:`fit`: (3,) float64 vectors, losses per iteration, wall time."""

    true_velocity: np.ndarray
    true_gravity: np.ndarray
    init_velocity: np.ndarray
    init_gravity: np.ndarray
    velocity: np.ndarray
    gravity: np.ndarray
    losses: list[float]
    seconds: float

    @property
    def velocity_error(self) -> float:
        """|recovered - true| / |true| for the initial velocity."""
        return float(np.linalg.norm(self.velocity - self.true_velocity) / np.linalg.norm(self.true_velocity))

    @property
    def gravity_error(self) -> float:
        """|recovered - true| / |true| for gravity."""
        return float(np.linalg.norm(self.gravity - self.true_gravity) / np.linalg.norm(self.true_gravity))


def ball_particles(cfg: ThrowBallConfig) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3) positions and (N, 3) RGB colours of the ball's particle lattice.

    The lattice is tilted so that no two particles share a camera depth: with ties,
    float rounding under a translation could flip their compositing order and make
    the image loss jump.
    """
    t = (np.arange(cfg.lattice) - 0.5 * (cfg.lattice - 1)) * cfg.spacing
    grid = np.stack(np.meshgrid(t, t, t, indexing="ij"), axis=-1).reshape(-1, 3)
    span = max(np.ptp(t), 1e-9)
    colors = 0.15 + 0.8 * (grid - t[0]) / span  # colour ramps along x, y, z
    a, b = 0.5, 0.35  # tilt angles, rad
    rz = np.array([[np.cos(a), -np.sin(a), 0.0], [np.sin(a), np.cos(a), 0.0], [0.0, 0.0, 1.0]])
    rx = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(b), -np.sin(b)], [0.0, np.sin(b), np.cos(b)]])
    grid = grid @ (rx @ rz).T
    return (grid + np.asarray(cfg.ball_center)).astype(np.float32), colors.astype(np.float32)


def cameras(cfg: ThrowBallConfig) -> list[Camera]:
    """A side camera (looking along +y) and an oblique one, both framing the arc."""
    target = (-0.45, 0.0, 0.75)
    return [
        Camera.look_at((-0.45, -4.0, 0.75), target, (0.0, 0.0, 1.0), 40.0, cfg.width, cfg.height),
        Camera.look_at((1.8, -2.6, 2.2), target, (0.0, 0.0, 1.0), 45.0, cfg.width, cfg.height),
    ]


class _NewtonParticles:
    """The ball as newton particles, stepped by SolverSemiImplicit; rollout() returns
    particle positions like :meth:`ParticleIntegrator.rollout`."""

    def __init__(self, positions, radius: float, dt: float, device):
        import newton

        from arc_warp_newton import NewtonRollout

        builder = newton.ModelBuilder(up_axis=newton.Axis.Z, gravity=(0.0, 0.0, -9.81))
        for p in positions:
            builder.add_particle(pos=wp.vec3(*p), vel=wp.vec3(0.0), mass=1.0, radius=radius)
        model = builder.finalize(device=device, requires_grad=True)
        self._rollout = NewtonRollout(model, dt=dt)

    def rollout(self, velocity, gravity, steps):
        return [s.particle_q for s in self._rollout.rollout(velocity, gravity, steps)]


class ThrowBall:
    """The scene: simulator, cameras and per-particle appearance on one device."""

    def __init__(self, cfg: ThrowBallConfig, device=None):
        self.cfg = cfg
        self.device = wp.get_device(device)
        positions, colors = ball_particles(cfg)
        if cfg.backend == "newton":
            self.sim = _NewtonParticles(positions, cfg.particle_radius, cfg.dt, self.device)
        else:
            self.sim = ParticleIntegrator(positions, 1.0, cfg.particle_radius, IntegratorSettings(dt=cfg.dt),
                                          device=self.device)
        self.colors = wp.array(colors, dtype=wp.vec3, device=self.device)
        self.cameras = cameras(cfg)

    def render(self, velocity: wp.array, gravity: wp.array) -> list[wp.array]:
        """Frames (H, W) wp.vec3 for every (frame step, camera), recorded on the active tape."""
        traj = self.sim.rollout(velocity, gravity, max(self.cfg.frame_steps))
        images = []
        for step in self.cfg.frame_steps:
            g = particles_to_gaussians(traj[step], self.cfg.gaussian_scale, self.colors, self.cfg.opacity)
            for cam in self.cameras:
                images.append(render_gaussians(*g.arrays, cam, self.cfg.render).color)
        return images

    def vec3_param(self, value, requires_grad: bool = True) -> wp.array:
        return wp.array(np.asarray(value, np.float32).reshape(1, 3), dtype=wp.vec3, device=self.device,
                        requires_grad=requires_grad)

    def loss_and_grad(self, velocity, gravity, targets) -> tuple[float, np.ndarray, np.ndarray]:
        """Image loss at (velocity, gravity) and its (1, 3) gradients w.r.t. both.

        The tape is zeroed before returning: newton keeps arrays across rollouts whose
        gradients would otherwise carry over into the next backward pass.
        """
        tape = wp.Tape()
        with tape:
            loss = image_mse(self.render(velocity, gravity), targets)
        tape.backward(loss)
        result = float(loss.numpy()[0]), velocity.grad.numpy().copy(), gravity.grad.numpy().copy()
        tape.zero()
        return result

    def loss(self, velocity, gravity, targets) -> float:
        """Image loss without gradients (for finite differences)."""
        return float(image_mse(self.render(velocity, gravity), targets).numpy()[0])


def fit(cfg: ThrowBallConfig, device=None, log_every: int = 0) -> FitResult:
    """Render targets with the true parameters, then recover them from the guess."""
    start = time.perf_counter()
    scene = ThrowBall(cfg, device)
    targets = scene.render(scene.vec3_param(cfg.true_velocity, False), scene.vec3_param(cfg.true_gravity, False))
    velocity = scene.vec3_param(cfg.init_velocity)
    gravity = scene.vec3_param(cfg.init_gravity)
    opt = Adam([velocity, gravity], [cfg.lr_velocity, cfg.lr_gravity])
    gravity_mask = np.asarray(cfg.fit_gravity_axes, dtype=np.float32).reshape(1, 3)
    losses = []
    for it in range(cfg.iterations):
        loss, d_velocity, d_gravity = scene.loss_and_grad(velocity, gravity, targets)
        losses.append(loss)
        opt.step([d_velocity, d_gravity * gravity_mask], cfg.lr_decay ** (it / max(cfg.iterations - 1, 1)))
        if log_every and (it % log_every == 0 or it == cfg.iterations - 1):
            print(f"iter {it:4d} loss {losses[-1]:.3e} v0 {np.round(velocity.numpy()[0], 4)} "
                  f"g {np.round(gravity.numpy()[0], 4)}", flush=True)
    as64 = lambda v: np.asarray(v, dtype=np.float64).reshape(3)  # noqa: E731
    return FitResult(as64(cfg.true_velocity), as64(cfg.true_gravity), as64(cfg.init_velocity),
                     as64(cfg.init_gravity), as64(velocity.numpy()[0]), as64(gravity.numpy()[0]), losses,
                     time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("warp", "newton"), default="warp")
    parser.add_argument("--iters", type=int, default=ThrowBallConfig.iterations)
    parser.add_argument("--size", type=int, default=32, help="image width = height, pixels")
    parser.add_argument("--device", default=None, help="Warp device, e.g. cpu or cuda:0")
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args(argv)
    if args.backend == "newton":
        try:
            import newton  # noqa: F401
        except ImportError:
            parser.error(f"--backend newton needs the newton simulator: {NEWTON_HINT}, or use --backend warp")
    wp.config.log_level = wp.LOG_WARNING
    cfg = ThrowBallConfig(backend=args.backend, iterations=args.iters, width=args.size, height=args.size)
    res = fit(cfg, args.device, args.log_every)
    print(f"velocity: true {res.true_velocity} init {res.init_velocity} recovered {np.round(res.velocity, 4)} "
          f"rel. error {res.velocity_error:.2%}")
    print(f"gravity:  true {res.true_gravity} init {res.init_gravity} recovered {np.round(res.gravity, 4)} "
          f"rel. error {res.gravity_error:.2%}")
    print(f"loss {res.losses[0]:.3e} -> {res.losses[-1]:.3e} in {len(res.losses)} iterations, {res.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
