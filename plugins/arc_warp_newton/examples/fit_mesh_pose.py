"""Recover the poses of two rigid mesh bodies of a newton model from rendered images.

A newton model holds two bodies with mesh shapes (a cube and a box, both welded
``arc_warp.mesh.cube`` meshes). Target images are rendered from three cameras with
:func:`arc_warp_newton.render_body_meshes` at the true ``State.body_q``; then both poses
are recovered from a guess that is offset in translation (about 7 % of the cube's size)
and rotation (6 and 8 degrees), by Adam on ``body_q`` through the renderer, one
``wp.Tape`` per iteration.

Choices that make the image loss usable (see ``FitPoseConfig``):
- vertex colours ramp along each body's own x, y, z, so the shading pins the rotation
  (a uniformly coloured cube gives the pose gradients only at its silhouette);
- antialiasing turns the silhouettes into gradients of position;
- three cameras make every translation axis observable;
- Adam on the (p, q xyzw) of ``body_q`` with one step size (metres and quaternion units
  are of similar size here), a geometric step decay, and quaternions renormalised after
  each step.

Run: ``python -m arc_warp_newton.examples.fit_mesh_pose [--iters N] [--out DIR]``; writes
``target.png``, ``before.png`` and ``after.png`` (the views side by side) to ``--out``.
Needs newton (the checkout's ``newton`` extra).
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
from arc_warp import Camera, write_png
from arc_warp_newton import NEWTON_HINT, BodyMeshes, render_body_meshes
from arc_warp_newton.fit_ops import Adam, image_mse


@dataclass(frozen=True)
class FitPoseConfig:
    """Scene, rendering and optimisation settings (SI units, z up)."""

    width: int = 64
    height: int = 64
    cube_size: float = 0.4  # edge of body 0's cube, m; body 1 is this cube scaled by box_scale
    box_scale: tuple[float, float, float] = (1.2, 0.5, 0.5)
    # true poses (p, q xyzw), m: two bodies side by side, turned so that three faces show
    true_poses: tuple[tuple[float, ...], ...] = (
        (-0.25, 0.0, 0.5, 0.1, 0.2, 0.05, 0.9721),
        (0.3, 0.05, 0.55, -0.15, 0.05, 0.3, 0.9407),
    )
    translation_offset: tuple[tuple[float, float, float], ...] = ((0.02, -0.015, 0.01), (-0.015, 0.02, -0.012))
    rotation_offset_deg: tuple[float, ...] = (6.0, 8.0)  # about the axes below
    rotation_axes: tuple[tuple[float, float, float], ...] = ((1.0, 2.0, 0.5), (-0.5, 1.0, 1.0))
    iterations: int = 60
    lr: float = 0.01  # Adam step, m and quaternion units (0.01 ~ 1.1 degrees)
    lr_decay: float = 0.1  # final step = lr * lr_decay (geometric schedule)
    reduce: str = "arc"  # accumulator of the mesh ops' backwards

    def __post_init__(self):
        n = len(self.true_poses)
        if not (len(self.translation_offset) == len(self.rotation_offset_deg) == len(self.rotation_axes) == n):
            raise ValueError(f"need one translation offset, rotation offset and axis per body ({n})")
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations!r}")


@dataclass
class FitResult:
    """Outcome of :func:`fit`: per-iteration loss, and largest translation error (m) and
    rotation error (degrees) over the bodies, index 0 = the initial guess."""

    losses: list[float]
    translation_errors: list[float]
    rotation_errors: list[float]
    poses: np.ndarray  # (B, 7) recovered body_q
    seconds: float


def quat_about(axis, degrees: float) -> np.ndarray:
    """(4,) xyzw unit quaternion of a rotation by ``degrees`` about ``axis``."""
    axis = np.asarray(axis, np.float64) / np.linalg.norm(axis)
    half = 0.5 * math.radians(degrees)
    return np.append(axis * math.sin(half), math.cos(half))


def quat_mul(a, b) -> np.ndarray:
    """Hamilton product of xyzw quaternions (a then b applied right to left: a * b)."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz])


def pose_errors(poses, true_poses) -> tuple[float, float]:
    """(largest translation error, m; largest rotation angle error, degrees) of (B, 7) poses."""
    poses, true_poses = np.asarray(poses, np.float64), np.asarray(true_poses, np.float64)
    dt = np.linalg.norm(poses[:, :3] - true_poses[:, :3], axis=1).max()
    q = poses[:, 3:] / np.linalg.norm(poses[:, 3:], axis=1, keepdims=True)
    qt = true_poses[:, 3:] / np.linalg.norm(true_poses[:, 3:], axis=1, keepdims=True)
    cos_half = np.clip(np.abs(np.sum(q * qt, axis=1)), 0.0, 1.0)
    return float(dt), float(np.degrees(2.0 * np.arccos(cos_half)).max())


def initial_poses(cfg: FitPoseConfig) -> np.ndarray:
    """(B, 7) float32 guess: the true poses moved by the configured offsets."""
    out = []
    for pose, dp, deg, axis in zip(cfg.true_poses, cfg.translation_offset, cfg.rotation_offset_deg,
                                   cfg.rotation_axes):
        q = quat_mul(quat_about(axis, deg), np.asarray(pose[3:]) / np.linalg.norm(pose[3:]))
        out.append(np.concatenate([np.add(pose[:3], dp), q]))
    return np.asarray(out, np.float32)


def build_model(cfg: FitPoseConfig, device=None):
    """A newton model with one mesh shape per body, posed at ``cfg.true_poses``."""
    import newton

    points, _, tri, _ = dr.cube(cfg.cube_size)
    builder = newton.ModelBuilder(up_axis=newton.Axis.Z)
    for k, pose in enumerate(cfg.true_poses):
        q = np.asarray(pose[3:]) / np.linalg.norm(pose[3:])
        body = builder.add_body(xform=wp.transform(wp.vec3(*pose[:3]), wp.quat(*q)))
        builder.add_shape_mesh(body, mesh=newton.Mesh(points, tri.ravel()),
                               scale=(1.0, 1.0, 1.0) if k == 0 else cfg.box_scale)
    return builder.finalize(device=device, requires_grad=True)


def position_colors(meshes: BodyMeshes) -> BodyMeshes:
    """``meshes`` coloured by body-frame position: RGB ramps from 0.15 to 0.85 along each
    body's x, y, z (over its own bounding box), so every rotation changes the shading."""
    points, body = meshes.points.numpy(), meshes.body.numpy()
    colors = np.empty_like(points)
    for b in np.unique(body):
        sel = body == b
        lo, hi = points[sel].min(0), points[sel].max(0)
        colors[sel] = 0.15 + 0.7 * (points[sel] - lo) / np.maximum(hi - lo, 1e-9)
    return meshes.with_colors(colors)


def cameras(cfg: FitPoseConfig) -> list[Camera]:
    """Three views around the bodies, from different heights."""
    return Camera.orbit(np.radians([-100.0, -30.0, 50.0]), np.radians([25.0, 10.0, 45.0]), 1.9, 40.0,
                        cfg.width, cfg.height, center=(0.03, 0.02, 0.52))


class PoseScene:
    """Model, meshes, cameras and target images on one device."""

    def __init__(self, cfg: FitPoseConfig, device=None):
        from arc_warp_newton import model_mesh_shapes

        self.cfg = cfg
        self.model = build_model(cfg, device)
        self.device = self.model.device
        self.meshes = position_colors(model_mesh_shapes(self.model))
        self.cameras = cameras(cfg)
        self.true_poses = self.model.state().body_q.numpy()
        self.targets = self.render(self.pose_param(self.true_poses, False)).images

    def pose_param(self, poses, requires_grad: bool = True) -> wp.array:
        """(B,) wp.transform array of (B, 7) poses."""
        return wp.array(np.asarray(poses, np.float32), dtype=wp.transform, device=self.device,
                        requires_grad=requires_grad)

    def render(self, body_q: wp.array):
        return render_body_meshes(body_q, self.meshes, self.cameras, reduce=self.cfg.reduce)

    def loss(self, body_q: wp.array) -> float:
        """Image loss without gradients (for finite differences)."""
        return float(image_mse(self.render(body_q).images, self.targets).numpy()[0])

    def loss_and_grad(self, body_q: wp.array) -> tuple[float, np.ndarray]:
        """Image loss at ``body_q`` and its (B, 7) gradient; ``body_q.grad`` is zeroed after."""
        tape = wp.Tape()
        with tape:
            loss = image_mse(self.render(body_q).images, self.targets)
        tape.backward(loss)
        result = float(loss.numpy()[0]), body_q.grad.numpy().copy()
        tape.zero()
        return result


def fit(cfg: FitPoseConfig, device=None, log_every: int = 0, scene: PoseScene | None = None) -> FitResult:
    """Recover ``cfg.true_poses`` from :func:`initial_poses` by Adam through the renderer."""
    start = time.perf_counter()
    scene = PoseScene(cfg, device) if scene is None else scene
    body_q = scene.pose_param(initial_poses(cfg))
    opt = Adam([body_q], cfg.lr)
    errors = [pose_errors(body_q.numpy(), scene.true_poses)]
    losses = []
    for it in range(cfg.iterations):
        loss, grad = scene.loss_and_grad(body_q)
        losses.append(loss)
        opt.step([grad], cfg.lr_decay ** (it / max(cfg.iterations - 1, 1)))
        poses = body_q.numpy()
        poses[:, 3:] /= np.linalg.norm(poses[:, 3:], axis=1, keepdims=True)  # back onto unit quaternions
        body_q.assign(poses)
        errors.append(pose_errors(poses, scene.true_poses))
        if log_every and (it % log_every == 0 or it == cfg.iterations - 1):
            print(f"iter {it:4d} loss {loss:.3e} translation error {errors[-1][0] * 1e3:7.3f} mm "
                  f"rotation error {errors[-1][1]:6.3f} deg", flush=True)
    return FitResult(losses, [e[0] for e in errors], [e[1] for e in errors], body_q.numpy(),
                     time.perf_counter() - start)


def side_by_side(render) -> np.ndarray:
    """(H, C W, 3) float32: the C views of a :class:`MeshRender` in a row."""
    return np.concatenate(list(render.color.numpy()), axis=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=FitPoseConfig.iterations)
    parser.add_argument("--size", type=int, default=64, help="image width = height, pixels")
    parser.add_argument("--reduce", default="arc", choices=("atomic", "warp", "serial", "arc"))
    parser.add_argument("--device", default=None, help="Warp device, e.g. cpu or cuda:0")
    parser.add_argument("--out", type=Path, default=Path("fit_mesh_pose_out"))
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        import newton  # noqa: F401
    except ImportError:
        parser.error(f"this example needs the newton simulator: {NEWTON_HINT}")
    wp.config.log_level = wp.LOG_WARNING
    cfg = FitPoseConfig(iterations=args.iters, width=args.size, height=args.size, reduce=args.reduce)
    scene = PoseScene(cfg, args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    write_png(args.out / "target.png", side_by_side(scene.render(scene.pose_param(scene.true_poses, False))))
    write_png(args.out / "before.png", side_by_side(scene.render(scene.pose_param(initial_poses(cfg), False))))
    res = fit(cfg, log_every=args.log_every, scene=scene)
    write_png(args.out / "after.png", side_by_side(scene.render(scene.pose_param(res.poses, False))))
    print(f"translation error {res.translation_errors[0] * 1e3:.2f} -> {res.translation_errors[-1] * 1e3:.3f} mm, "
          f"rotation error {res.rotation_errors[0]:.2f} -> {res.rotation_errors[-1]:.3f} deg, "
          f"loss {res.losses[0]:.3e} -> {res.losses[-1]:.3e} in {len(res.losses)} iterations, {res.seconds:.1f} s")
    print(f"images in {args.out}/ (target.png, before.png, after.png)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
