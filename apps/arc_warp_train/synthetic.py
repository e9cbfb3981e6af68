"""Procedural ground-truth Gaussian scenes and multi-view datasets rendered from them.

Uses numpy, Warp and the arc_warp core only: importing it loads no torch. World is z-up,
like Blender; the scene fits in a ball of radius ~1.2 around the origin, so
NeRF-synthetic-like camera rings work ("room" adds walls, a sphere of radius ROOM_RADIUS,
for cameras inside it). Datasets: NeRF-synthetic layouts of pinhole cameras
(`make_synthetic_dataset`), and COLMAP text models of a wide-angle fisheye capture
(`make_fisheye_capture`), every image rendered by arc_warp through its camera's own lens.
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


SCENES = ("torus", "blobs", "room")
ROOM_RADIUS = 3.0  # the walls of the "room" scene, world units from the origin


def make_scene(num_gaussians: int = 1500, seed: int = 0, kind: str = "torus") -> GaussianScene:
    """A procedural ground-truth scene, deterministic in `seed`:

    - "torus": a striped ball inside a tilted rainbow torus, made of flat surface
      Gaussians (disks along the surface), ~40 % on the ball and ~60 % on the torus;
    - "blobs": eight soft clusters of small random Gaussians, one colour each;
    - "room": the torus scene at 60 % of its size (half the Gaussians) inside a sphere of
      radius ROOM_RADIUS whose inside is tiled with coloured patches (12 hues around, 6
      bands of alternating brightness up), for cameras inside it: whatever a wide-angle
      lens sees has texture.
    """
    if not isinstance(num_gaussians, (int, np.integer)) or num_gaussians < 20:
        raise ValueError(f"make_scene: num_gaussians must be an int >= 20, got {num_gaussians!r}")
    if kind not in SCENES:
        raise ValueError(f"make_scene: kind must be one of {SCENES}, got {kind!r}")
    rng = np.random.default_rng(seed)
    if kind == "blobs":
        return _blobs(num_gaussians, rng)
    if kind == "room":
        return _room(num_gaussians, seed, rng)
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


def _room(n: int, seed: int, rng) -> GaussianScene:
    inner = make_scene(n // 2, seed, "torus")
    m = n - n // 2
    # Fibonacci sphere, disks facing the centre, a patch colour per (azimuth, band) cell
    i = np.arange(m) + 0.5
    z = 1.0 - 2.0 * i / m
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    normals = np.stack([np.sqrt(1 - z * z) * np.cos(phi), np.sqrt(1 - z * z) * np.sin(phi), z], 1)
    sector = np.floor((phi % (2 * math.pi)) / (2 * math.pi) * 12.0)
    band = np.floor((z + 1.0) * 3.0) % 2
    colors = _hue_to_rgb(sector / 12.0) * (0.45 + 0.55 * band)[:, None]
    colors += rng.normal(0.0, 0.02, (m, 3))
    spacing = ROOM_RADIUS * math.sqrt(4.0 * math.pi / m)
    scales = np.array([0.7, 0.7, 0.05]) * spacing * rng.uniform(0.9, 1.1, (m, 1))
    f32 = np.float32
    return GaussianScene(np.concatenate([0.6 * inner.means, ROOM_RADIUS * normals]).astype(f32),
                         np.concatenate([inner.quats, _frame_quats(-normals)]).astype(f32),
                         np.concatenate([0.6 * inner.scales, scales]).astype(f32),
                         np.concatenate([inner.opacities, np.full(m, 0.95)]).astype(f32),
                         np.clip(np.concatenate([inner.colors, colors]), 0.0, 1.0).astype(f32))


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


def fisheye_cameras(count: int, width: int, height: int, fov_deg: float = 170.0,
                    distortion=(0.03, -0.01, 0.002, -0.0002), radius: float = 1.8,
                    elevation_deg=(-10.0, 40.0), phase: float = 0.0):
    """`count` OpenCV fisheye cameras (arc_warp model "fisheye", coefficients k1..k4) on a
    sphere of `radius` looking at the origin, placed as `orbit_cameras` places them,
    the principal point at the image centre and the focal length that puts the image
    corners `fov_deg` / 2 from the optical axis (`fov_deg`: the diagonal field of view)."""
    from arc_warp import Distortion

    lens = Distortion.from_coefficients(distortion, "fisheye")
    half = math.radians(0.5 * fov_deg)
    theta_d = half * (1.0 + sum(k * half ** (2 * i + 2) for i, k in enumerate(lens.coefficients("fisheye"))))
    focal = math.hypot(0.5 * width, 0.5 * height) / theta_d
    return [Camera(focal, focal, 0.5 * width, 0.5 * height, width, height, cam.world_to_camera,
                   model="fisheye", distortion=lens)
            for cam in orbit_cameras(count, width, height, radius, 60.0, elevation_deg, phase)]


def _quaternion_wxyz(rotation: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z), w >= 0, of a (3,3) rotation matrix."""
    m = rotation
    w = math.sqrt(max(0.0, 1.0 + m[0, 0] + m[1, 1] + m[2, 2])) / 2.0
    x = math.copysign(math.sqrt(max(0.0, 1.0 + m[0, 0] - m[1, 1] - m[2, 2])) / 2.0, m[2, 1] - m[1, 2])
    y = math.copysign(math.sqrt(max(0.0, 1.0 - m[0, 0] + m[1, 1] - m[2, 2])) / 2.0, m[0, 2] - m[2, 0])
    z = math.copysign(math.sqrt(max(0.0, 1.0 - m[0, 0] - m[1, 1] + m[2, 2])) / 2.0, m[1, 0] - m[0, 1])
    q = np.array([w, x, y, z])
    return q / np.linalg.norm(q)


COLMAP_LENSES = {"pinhole": ("FULL_OPENCV", 8), "fisheye": ("OPENCV_FISHEYE", 4)}


def write_colmap(root, scene: GaussianScene, cameras, points: np.ndarray = None,
                 point_colors: np.ndarray = None, device=None) -> None:
    """Render each camera (of one size and lens) and write a COLMAP text model: `root`/images/
    view_<i>.png (RGB over black) and `root`/sparse/0/{cameras,images,points3D}.txt, one
    shared camera (FULL_OPENCV for a pinhole, OPENCV_FISHEYE for a fisheye) and the
    optional sparse points (M,3) with RGB colours (M,3) in [0,1] (tracks left empty)."""
    cam0 = cameras[0]
    name, count = COLMAP_LENSES[cam0.model]
    coeffs = cam0.distortion.coefficients(cam0.model) if cam0.distortion else (0.0,) * count
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    sparse = os.path.join(root, "sparse", "0")
    os.makedirs(sparse, exist_ok=True)
    lines = []
    for i, cam in enumerate(cameras):
        if (cam.model, cam.distortion, cam.width, cam.height) != (cam0.model, cam0.distortion, cam0.width,
                                                                   cam0.height):
            raise ValueError(f"write_colmap: camera {i} differs from camera 0 in size or lens; the model has "
                             "one shared camera")
        rgba = render_rgba(scene, cam, device)
        image = f"view_{i:03d}.png"
        _save_rgb_png(os.path.join(root, "images", image), rgba[..., :3] * rgba[..., 3:])
        q, t = _quaternion_wxyz(cam.world_to_camera[:3, :3]), cam.world_to_camera[:3, 3]
        lines += [f"{i + 1} {' '.join(repr(float(v)) for v in (*q, *t))} 1 {image}", ""]
    params = (cam0.fx, cam0.fy, cam0.cx, cam0.cy, *coeffs)
    with open(os.path.join(sparse, "cameras.txt"), "w") as f:
        f.write(f"1 {name} {cam0.width} {cam0.height} {' '.join(repr(float(v)) for v in params)}\n")
    with open(os.path.join(sparse, "images.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(sparse, "points3D.txt"), "w") as f:
        for k, (p, c) in enumerate(zip(points if points is not None else [],
                                       point_colors if point_colors is not None else [])):
            rgb = np.clip(np.round(np.asarray(c) * 255.0), 0, 255).astype(int)
            f.write(f"{k + 1} {float(p[0])!r} {float(p[1])!r} {float(p[2])!r} {rgb[0]} {rgb[1]} {rgb[2]} 0\n")


def _save_rgb_png(path: str, rgb: np.ndarray) -> None:
    from PIL import Image  # app extra; imported here so scene generation works without it

    Image.fromarray((np.clip(rgb, 0, 1) * 255.0 + 0.5).astype(np.uint8), "RGB").save(path)


def make_fisheye_capture(root, num_views: int = 24, width: int = 64, height: int = 48,
                         num_gaussians: int = 3000, fov_deg: float = 170.0,
                         distortion=(0.03, -0.01, 0.002, -0.0002), point_fraction: float = 0.3,
                         seed: int = 0, device=None) -> GaussianScene:
    """A wide-angle fisheye capture of the "room" scene as a COLMAP text model (see
    `write_colmap`): `num_views` OPENCV_FISHEYE views (`fisheye_cameras`: `fov_deg`
    diagonal, `distortion` k1..k4) from inside the room, every 8th by name held out by the
    COLMAP reader; sparse points: a random `point_fraction` of the Gaussian centres,
    jittered by 2 % of the room's radius, with their colours (an SfM-like start). Returns
    the scene."""
    scene = make_scene(num_gaussians, seed, "room")
    rng = np.random.default_rng(seed + 1)
    cams = fisheye_cameras(num_views, width, height, fov_deg, distortion)
    pick = rng.random(len(scene.means)) < point_fraction
    points = scene.means[pick] + rng.normal(0.0, 0.02 * ROOM_RADIUS, (int(pick.sum()), 3))
    write_colmap(root, scene, cams, points, scene.colors[pick], device)
    return scene
