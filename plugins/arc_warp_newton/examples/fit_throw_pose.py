"""Recover the initial pose of a thrown rigid mesh from rendered frames, through newton's
simulation and the hybrid camera sensor on one ``wp.Tape``.

A box (a newton mesh shape on a free body) is thrown, spinning, through a scene of
Gaussians (a newton ``GeoType.GAUSSIAN`` shape: a backdrop of blobs behind its path and
fainter ones in front of it, so the box hides some and is seen through others). Target frames are rendered at a few
steps from two cameras by :class:`arc_warp_newton.SensorHybridCamera`. Then the initial pose
(position and orientation) is recovered from a guess 6 cm and 12 degrees off: each
iteration simulates with ``newton.solvers.SolverSemiImplicit``, renders the same frames,
and takes an Adam step on the pose with the gradient of the image loss through the
renders and every simulation step.

Choices that make the image loss usable (see ``ThrowPoseConfig``):
- the box's vertex colours ramp along its own axes, so the shading pins its rotation (a
  uniformly coloured box gives the pose gradients only at its silhouette);
- antialiased silhouettes (the sensor's default) turn edges into gradients of position;
- two cameras make every axis observable; the guess overlaps the target in every frame;
- Adam on (p, q xyzw) with one step size, a geometric decay, and the quaternion
  renormalised after each step.

Run: ``python -m arc_warp_newton.examples.fit_throw_pose [--steps N] [--size S] [--out DIR]``
(``--steps``: optimisation steps). It prints the errors per step and the final ratio of
the pose error to the starting one. Needs newton (the checkout's ``newton`` extra).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import warp as wp

import arc_warp.mesh as dr
from arc_warp import RenderSettings, write_png
from arc_warp_newton import NEWTON_HINT
from arc_warp_newton.fit_ops import Adam, image_mse


@dataclass(frozen=True)
class ThrowPoseConfig:
    """Scene, simulation, rendering and optimisation settings (SI units, z up)."""

    width: int = 48
    height: int = 48
    box_size: tuple[float, float, float] = (0.5, 0.36, 0.28)  # edges, m
    true_position: tuple[float, float, float] = (-0.35, 0.0, 0.3)
    true_rotation: tuple[float, float, float] = (0.3, -0.2, 0.5)  # roll, pitch, yaw, radians
    velocity: tuple[float, float, float] = (2.0, 0.1, 1.6)  # known initial linear velocity, m/s
    spin: tuple[float, float, float] = (1.0, 2.0, -1.5)  # known initial angular velocity, rad/s
    position_offset: tuple[float, float, float] = (0.04, -0.035, 0.03)  # the guess's error, m (6 cm)
    rotation_offset_deg: float = 12.0
    rotation_axis: tuple[float, float, float] = (1.0, -2.0, 1.5)
    dt: float = 1.0 / 60.0
    frame_steps: tuple[int, ...] = (0, 7, 14, 21)  # simulation steps rendered
    backdrop: int = 120  # blobs behind the box's path
    foreground: int = 24  # fainter blobs in front of it
    seed: int = 3
    iterations: int = 60
    lr: float = 0.012  # Adam step, m and quaternion units (0.01 ~ 1.1 degrees)
    lr_decay: float = 0.1  # final step = lr * lr_decay (geometric schedule)

    def __post_init__(self):
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations!r}")
        if not self.frame_steps or min(self.frame_steps) < 0:
            raise ValueError(f"frame_steps must be step indices >= 0, got {self.frame_steps!r}")


@dataclass
class FitResult:
    """Per step (index 0 = the guess) the image loss, the position error (m), the rotation
    error (degrees) and the pose error (position error / box diagonal + rotation error in
    radians, the ratio the example reports); the recovered (7,) pose; wall time."""

    losses: list[float]
    position_errors: list[float]
    rotation_errors: list[float]
    pose_errors: list[float]
    pose: np.ndarray
    seconds: float

    @property
    def ratio(self) -> float:
        """Final pose error over the starting one."""
        return self.pose_errors[-1] / self.pose_errors[0]


def quat_rpy(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """(4,) xyzw of ``wp.quat_rpy``."""
    return np.array(wp.quat_rpy(roll, pitch, yaw), np.float64)


def quat_about(axis, degrees: float) -> np.ndarray:
    axis = np.asarray(axis, np.float64) / np.linalg.norm(axis)
    half = 0.5 * math.radians(degrees)
    return np.append(axis * math.sin(half), math.cos(half))


def quat_mul(a, b) -> np.ndarray:
    """Hamilton product of xyzw quaternions."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz])


def true_pose(cfg: ThrowPoseConfig) -> np.ndarray:
    return np.concatenate([cfg.true_position, quat_rpy(*cfg.true_rotation)])


def initial_pose(cfg: ThrowPoseConfig) -> np.ndarray:
    """The guess: the true pose moved by the configured offsets."""
    pose = true_pose(cfg)
    return np.concatenate([pose[:3] + cfg.position_offset,
                           quat_mul(quat_about(cfg.rotation_axis, cfg.rotation_offset_deg), pose[3:])])


def pose_errors(pose, truth, size) -> tuple[float, float, float]:
    """(position error m, rotation error degrees, pose error) of (7,) poses."""
    dp = float(np.linalg.norm(np.asarray(pose[:3], np.float64) - truth[:3]))
    q = np.asarray(pose[3:], np.float64) / np.linalg.norm(pose[3:])
    angle = 2.0 * math.acos(min(1.0, abs(float(q @ truth[3:]))))
    return dp, math.degrees(angle), dp / float(np.linalg.norm(size)) + angle


@wp.kernel
def set_pose(pose: wp.array(dtype=wp.transform), body_q: wp.array(dtype=wp.transform)):
    body_q[0] = pose[0]


class ThrowScene:
    """The newton model, its sensor and cameras, and the target frames."""

    def __init__(self, cfg: ThrowPoseConfig, device=None):
        import newton

        from arc_warp_newton import SensorHybridCamera, look_at_transform

        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        builder = newton.ModelBuilder(up_axis=newton.Axis.Z)
        body = builder.add_body(xform=wp.transform(wp.vec3(*cfg.true_position), wp.quat(*quat_rpy(*cfg.true_rotation))))
        points, _, tri, _ = dr.cube(1.0)
        builder.add_shape_mesh(body, mesh=newton.Mesh(points * np.asarray(cfg.box_size, np.float32), tri.ravel()))
        # a backdrop of blobs behind the box's path (the cameras look along +y) and fainter
        # ones in front of it
        n, m = cfg.backdrop, cfg.foreground
        centres = np.concatenate([np.stack([rng.uniform(-1.2, 1.2, n), rng.uniform(0.4, 0.9, n),
                                            rng.uniform(-0.3, 1.3, n)], 1),
                                  np.stack([rng.uniform(-0.8, 0.8, m), rng.uniform(-0.7, -0.45, m),
                                            rng.uniform(0.0, 1.0, m)], 1)])
        blobs = newton.Gaussian(positions=centres, rotations=rng.normal(size=(n + m, 4)),
                                scales=np.exp(rng.uniform(np.log(0.04), np.log(0.1), (n + m, 3))),
                                opacities=np.concatenate([rng.uniform(0.4, 0.8, n), rng.uniform(0.15, 0.35, m)]),
                                sh_coeffs=rng.normal(0.0, 0.9, (n + m, 3)))
        builder.add_shape_gaussian(-1, gaussian=blobs)
        self.model = builder.finalize(device=device, requires_grad=True)
        self.model.gravity.requires_grad = False
        self.device = self.model.device
        self.solver = newton.solvers.SolverSemiImplicit(self.model)
        self.control = self.model.control()
        self.sensor = SensorHybridCamera(self.model, cfg.width, cfg.height, camera_fov=0.9,
                                         settings=RenderSettings(background=(0.05, 0.05, 0.08)))
        self._colour_box()
        self.cameras = wp.array([look_at_transform((0.05, -2.2, 0.7), (0.05, 0.0, 0.45)),
                                 look_at_transform((1.6, -1.5, 1.5), (0.05, 0.0, 0.4))], dtype=wp.transform,
                                device=self.device)
        self.truth = true_pose(cfg)
        with wp.ScopedDevice(self.device):
            self.targets = [f.numpy() for f in self.frames(self.pose_param(self.truth, False))]
        self.target_images = [wp.array(t[v], dtype=wp.vec3, device=self.device)
                              for t in self.targets for v in range(len(t))]

    def _colour_box(self) -> None:
        """Vertex colours ramping along the box's own axes (0.15 to 0.85)."""
        start, count = self.sensor.mesh_vertices(0)
        colors = self.sensor.mesh_colors.numpy()
        corners = np.array([[x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)], np.float32)
        colors[start:start + count] = 0.15 + 0.7 * corners
        self.sensor.mesh_colors.assign(colors)
        self.sensor.mesh_colors.requires_grad = False

    def pose_param(self, pose, requires_grad: bool = True) -> wp.array:
        return wp.array([np.asarray(pose, np.float32)], dtype=wp.transform, device=self.device,
                        requires_grad=requires_grad)

    def frames(self, pose: wp.array) -> list[wp.array]:
        """(2, H, W) wp.vec3 images at ``cfg.frame_steps`` of the throw from ``pose``
        (recorded on an active tape: simulation and renders)."""
        cfg, model = self.cfg, self.model
        states = [model.state(requires_grad=True) for _ in range(max(cfg.frame_steps) + 1)]
        qd = np.zeros((1, 6), np.float32)
        qd[0, :3], qd[0, 3:] = cfg.velocity, cfg.spin  # newton's body_qd: linear, angular
        states[0].body_qd.assign(qd)
        wp.launch(set_pose, dim=1, inputs=[pose], outputs=[states[0].body_q], device=self.device)
        for i in range(len(states) - 1):
            states[i].clear_forces()
            self.solver.step(states[i], states[i + 1], self.control, None, cfg.dt)
        return [self.sensor.update(states[k], self.cameras, world_indices=[0, 0]) for k in cfg.frame_steps]

    def loss_and_grad(self, pose: wp.array) -> tuple[float, np.ndarray]:
        tape = wp.Tape()
        with tape:
            images = [f[v] for f in self.frames(pose) for v in range(f.shape[0])]
            loss = image_mse(images, self.target_images)
        tape.backward(loss)
        result = float(loss.numpy()[0]), pose.grad.numpy().copy()
        tape.zero()
        return result


def fit(cfg: ThrowPoseConfig, device=None, log_every: int = 0, scene: ThrowScene | None = None) -> FitResult:
    """Recover the true initial pose from :func:`initial_pose` by Adam through simulation
    and renders."""
    start = time.perf_counter()
    scene = ThrowScene(cfg, device) if scene is None else scene
    pose = scene.pose_param(initial_pose(cfg))
    opt = Adam([pose], cfg.lr)
    errors = [pose_errors(pose.numpy()[0], scene.truth, cfg.box_size)]
    losses = []
    for it in range(cfg.iterations):
        loss, grad = scene.loss_and_grad(pose)
        losses.append(loss)
        opt.step([grad], cfg.lr_decay ** (it / max(cfg.iterations - 1, 1)))
        p = pose.numpy()
        p[:, 3:] /= np.linalg.norm(p[:, 3:], axis=1, keepdims=True)  # back onto unit quaternions
        pose.assign(p)
        errors.append(pose_errors(p[0], scene.truth, cfg.box_size))
        if log_every and (it % log_every == 0 or it == cfg.iterations - 1):
            e = errors[it]  # at the pose the loss was taken at
            print(f"step {it:3d} loss {loss:.3e} position error {e[0] * 1e3:6.2f} mm rotation error {e[1]:5.2f} deg "
                  f"pose error {e[2] / errors[0][2]:6.1%} of the start", flush=True)
    return FitResult(losses, [e[0] for e in errors], [e[1] for e in errors], [e[2] for e in errors],
                     pose.numpy()[0], time.perf_counter() - start)


def strip(frames: list) -> np.ndarray:
    """Frames (each (2, H, W, 3)) as one picture: cameras in rows, frames in columns."""
    return np.concatenate([np.concatenate([f[v] for f in frames], axis=1) for v in range(2)], axis=0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=ThrowPoseConfig.iterations, help="optimisation steps")
    parser.add_argument("--size", type=int, default=48, help="image width = height, pixels")
    parser.add_argument("--device", default=None, help="Warp device, e.g. cpu or cuda:0")
    parser.add_argument("--out", type=Path, default=None, help="write target.png, before.png, after.png here")
    parser.add_argument("--log-every", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        import newton  # noqa: F401
    except ImportError:
        parser.error(f"this example needs the newton simulator: {NEWTON_HINT}")
    wp.config.log_level = wp.LOG_WARNING
    cfg = ThrowPoseConfig(iterations=args.steps, width=args.size, height=args.size)
    scene = ThrowScene(cfg, args.device)
    res = fit(cfg, log_every=args.log_every, scene=scene)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_png(args.out / "target.png", strip(scene.targets))
        for name, pose in (("before.png", initial_pose(cfg)), ("after.png", res.pose)):
            write_png(args.out / name, strip([f.numpy() for f in scene.frames(scene.pose_param(pose, False))]))
    print(f"position error {res.position_errors[0] * 1e3:.1f} -> {res.position_errors[-1] * 1e3:.2f} mm, rotation "
          f"error {res.rotation_errors[0]:.2f} -> {res.rotation_errors[-1]:.3f} deg, in {len(res.losses)} steps, "
          f"{res.seconds:.1f} s")
    print(f"final pose error: {res.ratio:.1%} of the starting one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
