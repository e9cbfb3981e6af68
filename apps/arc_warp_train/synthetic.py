"""Procedural ground-truth Gaussian scenes and multi-view datasets rendered from them.

Uses numpy, Warp and the arc_warp core only: importing it loads no torch. World is z-up, like Blender; the scene fits in a
ball of radius ~1.2 around the origin, so NeRF-synthetic-like camera rings work.
"""

import json
import math
import os
from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp import Camera, RenderSettings, render_gaussians
from arc_warp.ply import GaussianPly, write_ply
from arc_warp.splat import SH_C0  # rgb = SH_C0 * f_dc + 0.5


@dataclass
class GaussianScene:
    """Renderer-ready Gaussians (float32 numpy): means (N,3), quats (N,4) wxyz unit,
    scales (N,3) linear std-devs, opacities (N,) in (0,1), colors (N,3) RGB in [0,1] or
    (N,K,3) SH coefficients (K = (d+1)^2, 3DGS convention)."""

    means: np.ndarray
    quats: np.ndarray
    scales: np.ndarray
    opacities: np.ndarray
    colors: np.ndarray

    def to_ply(self) -> GaussianPly:
        """As a 3DGS PLY record (RGB colours become degree-0 SH coefficients)."""
        sh = self.colors if self.colors.ndim == 3 else ((self.colors - 0.5) / SH_C0)[:, None, :]
        return GaussianPly.from_activated(self.means, self.quats, self.scales,
                                          self.opacities, sh)

    @classmethod
    def from_ply(cls, ply: GaussianPly) -> "GaussianScene":
        """From a 3DGS PLY record (SH colours kept)."""
        g = ply.activated()
        return cls(g["means"], g["quats"], g["scales"], g["opacities"], g["sh"])


def _frame_quats(normals: np.ndarray) -> np.ndarray:
    """(M,3) unit normals -> (M,4) wxyz quaternions rotating +z onto each normal."""
    z = np.array([0.0, 0.0, 1.0])
    axis = np.cross(z, normals)
    cos = np.clip(normals @ z, -1.0, 1.0)
    half = 0.5 * np.arccos(cos)
    norm = np.linalg.norm(axis, axis=1, keepdims=True)
    axis = np.where(norm > 1e-9, axis / np.maximum(norm, 1e-12), np.array([1.0, 0.0, 0.0]))
    return np.concatenate([np.cos(half)[:, None], np.sin(half)[:, None] * axis], axis=1)


def _hue_to_rgb(h: np.ndarray) -> np.ndarray:
    """Hue in [0,1) -> saturated RGB (M,3)."""
    k = (np.array([5.0, 3.0, 1.0]) + 6.0 * h[:, None]) % 6.0
    return 1.0 - np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0) * 0.85


SCENES = ("torus", "blobs")


def make_scene(num_gaussians: int = 1500, seed: int = 0, kind: str = "torus") -> GaussianScene:
    """A procedural ground-truth scene, deterministic in `seed`:

    - "torus": a striped ball inside a tilted rainbow torus, made of flat surface
      Gaussians (disks along the surface), ~40 % on the ball and ~60 % on the torus;
    - "blobs": eight soft clusters of small random Gaussians, one colour each.
    """
    if not isinstance(num_gaussians, (int, np.integer)) or num_gaussians < 20:
        raise ValueError(f"make_scene: num_gaussians must be an int >= 20, got {num_gaussians!r}")
    if kind not in SCENES:
        raise ValueError(f"make_scene: kind must be one of {SCENES}, got {kind!r}")
    rng = np.random.default_rng(seed)
    if kind == "blobs":
        return _blobs(num_gaussians, rng)
    n_sphere = int(0.4 * num_gaussians)
    n_torus = num_gaussians - n_sphere

    # Sphere of radius 0.55 on a Fibonacci lattice, blue/white latitude stripes.
    r_s = 0.55
    i = np.arange(n_sphere) + 0.5
    z = 1.0 - 2.0 * i / n_sphere
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    n_s = np.stack([np.sqrt(1 - z * z) * np.cos(phi), np.sqrt(1 - z * z) * np.sin(phi), z], 1)
    stripe = (np.floor((z + 1.0) * 3.0) % 2)[:, None]
    col_s = stripe * np.array([0.95, 0.95, 0.9]) + (1 - stripe) * np.array([0.15, 0.3, 0.85])
    spacing_s = r_s * math.sqrt(4.0 * math.pi / n_sphere)

    # Torus (major 0.9, minor 0.22), tilted 25 degrees about x, rainbow hue around it.
    big, small = 0.9, 0.22
    n_u = max(8, int(round(math.sqrt(n_torus * big / small))))
    n_v = max(3, n_torus // n_u)
    u = (np.arange(n_torus) % n_u + rng.uniform(-0.2, 0.2, n_torus)) * 2 * math.pi / n_u
    v = (np.arange(n_torus) // n_u % n_v + 0.5 * (np.arange(n_torus) % 2)) * 2 * math.pi / n_v
    ring = np.stack([np.cos(u), np.sin(u), np.zeros_like(u)], 1)
    n_t = np.cos(v)[:, None] * ring + np.sin(v)[:, None] * np.array([0.0, 0.0, 1.0])
    p_t = big * ring + small * n_t
    tilt = math.radians(25.0)
    rot = np.array([[1, 0, 0], [0, math.cos(tilt), -math.sin(tilt)],
                    [0, math.sin(tilt), math.cos(tilt)]])
    p_t, n_t = p_t @ rot.T, n_t @ rot.T
    col_t = _hue_to_rgb(u / (2 * math.pi))
    spacing_t = math.sqrt(4 * math.pi ** 2 * big * small / n_torus)

    normals = np.concatenate([n_s, n_t])
    means = np.concatenate([r_s * n_s, p_t])
    tangent = np.concatenate([np.full(n_sphere, spacing_s), np.full(n_torus, spacing_t)])
    scales = np.stack([0.6 * tangent, 0.6 * tangent, 0.1 * tangent], 1)
    scales *= rng.uniform(0.85, 1.15, size=(num_gaussians, 1))
    colors = np.concatenate([col_s, col_t]) + rng.normal(0.0, 0.02, (num_gaussians, 3))
    f32 = np.float32
    return GaussianScene(means.astype(f32), _frame_quats(normals).astype(f32),
                         scales.astype(f32), rng.uniform(0.85, 0.98, num_gaussians).astype(f32),
                         np.clip(colors, 0.0, 1.0).astype(f32))


def _blobs(n: int, rng) -> GaussianScene:
    centers = rng.normal(size=(8, 3))
    centers *= (0.8 / np.linalg.norm(centers, axis=1))[:, None]
    owner = np.arange(n) % 8
    means = centers[owner] + rng.normal(0.0, 0.18, (n, 3))
    colors = _hue_to_rgb(owner / 8.0) + rng.normal(0.0, 0.03, (n, 3))
    quats = rng.normal(size=(n, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    f32 = np.float32
    return GaussianScene(means.astype(f32), quats.astype(f32),
                         np.exp(rng.uniform(np.log(0.02), np.log(0.06), (n, 3))).astype(f32),
                         rng.uniform(0.5, 0.95, n).astype(f32),
                         np.clip(colors, 0.0, 1.0).astype(f32))


def orbit_cameras(count: int, width: int, height: int, radius: float = 4.0,
                  fov_y_deg: float = 40.0, elevation_deg=(15.0, 60.0), phase: float = 0.0):
    """`count` cameras on a sphere of `radius` looking at the origin (z up): azimuths step by
    the golden angle (offset by `phase` radians), elevations sweep `elevation_deg`."""
    golden = math.pi * (3.0 - math.sqrt(5.0))
    sweep = [0.5 if count == 1 else k / (count - 1) for k in range(count)]
    return Camera.orbit([phase + k * golden for k in range(count)],
                        [math.radians(elevation_deg[0] + t * (elevation_deg[1] - elevation_deg[0]))
                         for t in sweep], radius, fov_y_deg, width, height)


def render_rgba(scene: GaussianScene, camera: Camera, device=None) -> np.ndarray:
    """Render `scene` with the Warp renderer -> (H,W,4) float32 straight (unpremultiplied)
    RGBA, the convention of NeRF-synthetic PNGs."""
    with wp.ScopedDevice(device):
        arrays = [wp.array(np.ascontiguousarray(a), dtype=t) for a, t in (
            (scene.means, wp.vec3), (scene.quats, wp.vec4), (scene.scales, wp.vec3),
            (scene.opacities, wp.float32), (scene.colors, wp.vec3))]
        out = render_gaussians(*arrays, camera, RenderSettings())
        color, alpha = out.color.numpy(), out.alpha.numpy()
    straight = color / np.maximum(alpha, 1e-6)[..., None]
    return np.concatenate([np.clip(straight, 0, 1), np.clip(alpha, 0, 1)[..., None]], -1)


def _save_rgba_png(path: str, rgba: np.ndarray) -> None:
    from PIL import Image  # app extra; imported here so scene generation works without it

    Image.fromarray((np.clip(rgba, 0, 1) * 255.0 + 0.5).astype(np.uint8), "RGBA").save(path)


def write_nerf_synthetic(root, scene: GaussianScene, train_cameras, test_cameras,
                         device=None) -> None:
    """Render each camera and write a NeRF-synthetic layout under `root`:
    transforms_{train,test}.json (Blender/OpenGL camera-to-world matrices, camera_angle_x
    plus exact fl_x/fl_y/cx/cy/w/h), {train,test}/r_<i>.png RGBA, and gt.ply."""
    os.makedirs(root, exist_ok=True)
    for split, cams in (("train", train_cameras), ("test", test_cameras)):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        frames = []
        for i, cam in enumerate(cams):
            _save_rgba_png(os.path.join(root, split, f"r_{i}.png"),
                           render_rgba(scene, cam, device))
            c2w = np.linalg.inv(cam.world_to_camera)
            c2w[:3, 1:3] *= -1.0  # OpenCV (y down, z forward) -> OpenGL (y up, z back)
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": c2w.tolist()})
        cam0 = cams[0]
        meta = {"camera_angle_x": 2.0 * math.atan(0.5 * cam0.width / cam0.fx),
                "fl_x": cam0.fx, "fl_y": cam0.fy, "cx": cam0.cx, "cy": cam0.cy,
                "w": cam0.width, "h": cam0.height, "frames": frames}
        with open(os.path.join(root, f"transforms_{split}.json"), "w") as f:
            json.dump(meta, f, indent=1)
    write_ply(os.path.join(root, "gt.ply"), scene.to_ply())


def make_synthetic_dataset(root, num_train: int = 12, num_test: int = 4, width: int = 64,
                           height: int = 64, num_gaussians: int = 1500, seed: int = 0,
                           device=None, scene: GaussianScene = None) -> GaussianScene:
    """Write `scene` (default `make_scene(num_gaussians, seed)`) as a NeRF-synthetic dataset
    with `num_train` training and `num_test` held-out views (different azimuths) of
    `width` x `height` pixels, rendered on the Warp `device`. Returns the scene."""
    scene = make_scene(num_gaussians, seed) if scene is None else scene
    train = orbit_cameras(num_train, width, height)
    test = orbit_cameras(num_test, width, height, phase=0.5 * math.pi * (3.0 - math.sqrt(5.0)),
                         elevation_deg=(25.0, 50.0))
    write_nerf_synthetic(root, scene, train, test, device)
    return scene
