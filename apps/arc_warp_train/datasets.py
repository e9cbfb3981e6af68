"""Multi-view dataset readers: NeRF-synthetic (transforms.json) and COLMAP text models.

Cameras come out in the OpenCV/gsplat convention (x right, y down, z forward) as
4x4 float64 world_to_camera matrices and 3x3 pixel intrinsics. Images are float32 RGB
in [0, 1]; RGBA images are composited over the dataset background.
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np


@dataclass
class View:
    """One posed image: image (H,W,3) float32 in [0,1], K (3,3) float64 pixels,
    world_to_camera (4,4) float64 OpenCV axes."""

    name: str
    image: np.ndarray
    K: np.ndarray
    world_to_camera: np.ndarray

    @property
    def width(self) -> int:
        return self.image.shape[1]

    @property
    def height(self) -> int:
        return self.image.shape[0]

    @property
    def center(self) -> np.ndarray:
        """(3,) camera position in world units."""
        return np.linalg.inv(self.world_to_camera)[:3, 3]


@dataclass
class Dataset:
    """Train and held-out views, an optional sparse point cloud (points (M,3) float32 and
    point_colors (M,3) float32 in [0,1]) and the RGB background images were composited on."""

    train: list
    test: list
    points: np.ndarray = None
    point_colors: np.ndarray = None
    background: tuple = (0.0, 0.0, 0.0)
    source: str = ""
    extras: dict = field(default_factory=dict)

    @property
    def scene_scale(self) -> float:
        """1.1 x the largest distance from a training camera to their mean position
        (the INRIA/gsplat "scene extent"); 1.0 for a single camera."""
        centers = np.stack([v.center for v in self.train])
        radius = float(np.linalg.norm(centers - centers.mean(0), axis=1).max()) * 1.1
        return radius if radius > 0 else 1.0


def _load_image(path: str, background, downscale: int) -> np.ndarray:
    from PIL import Image  # app extra

    if not os.path.isfile(path):
        raise FileNotFoundError(f"image not found: {path}")
    with Image.open(path) as im:
        im = im.convert("RGBA")
        if downscale > 1:
            im = im.resize((im.width // downscale, im.height // downscale), Image.BOX)
        rgba = np.asarray(im, dtype=np.float32) / 255.0
    alpha = rgba[..., 3:]
    return rgba[..., :3] * alpha + np.asarray(background, np.float32) * (1.0 - alpha)


def _check_downscale(downscale) -> int:
    if isinstance(downscale, bool) or not isinstance(downscale, (int, np.integer)) or downscale < 1:
        raise ValueError(f"downscale must be an int >= 1, got {downscale!r}")
    return int(downscale)


# ----------------------------------------------------------------------------------------
# NeRF-synthetic


def _nerf_split(root, split, background, downscale, meta_root):
    path = os.path.join(root, f"transforms_{split}.json")
    with open(path) as f:
        meta = json.load(f)
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list):
        raise ValueError(f"{path}: expected a JSON object with a 'frames' list")
    views = []
    for i, frame in enumerate(meta["frames"]):
        if "file_path" not in frame or "transform_matrix" not in frame:
            raise ValueError(f"{path}: frame {i} needs 'file_path' and 'transform_matrix'")
        file = os.path.normpath(os.path.join(root, frame["file_path"]))
        if not os.path.splitext(file)[1]:
            file += ".png"
        image = _load_image(file, background, downscale)
        h, w = image.shape[:2]
        src_w = frame.get("w", meta.get("w", w * downscale))
        src_h = frame.get("h", meta.get("h", h * downscale))
        fx = frame.get("fl_x", meta.get("fl_x"))
        if fx is None:
            if "camera_angle_x" not in meta:
                raise ValueError(f"{path}: needs 'camera_angle_x' or 'fl_x'")
            fx = 0.5 * src_w / np.tan(0.5 * meta["camera_angle_x"])
        fy = frame.get("fl_y", meta.get("fl_y"))
        if fy is None:
            fy = 0.5 * src_h / np.tan(0.5 * meta["camera_angle_y"]) if "camera_angle_y" in meta \
                else fx
        cx = frame.get("cx", meta.get("cx", 0.5 * src_w))
        cy = frame.get("cy", meta.get("cy", 0.5 * src_h))
        sx, sy = w / src_w, h / src_h
        K = np.array([[fx * sx, 0.0, cx * sx], [0.0, fy * sy, cy * sy], [0.0, 0.0, 1.0]])
        c2w = np.array(frame["transform_matrix"], dtype=np.float64)
        if c2w.shape != (4, 4):
            raise ValueError(f"{path}: frame {i} transform_matrix must be 4x4, got {c2w.shape}")
        c2w[:3, 1:3] *= -1.0  # OpenGL/Blender (y up, z back) -> OpenCV (y down, z forward)
        views.append(View(os.path.relpath(file, meta_root), image, K, np.linalg.inv(c2w)))
    return views


def load_nerf_synthetic(root, background=(1.0, 1.0, 1.0), downscale: int = 1,
                        test_every: int = 8) -> Dataset:
    """Read `root`/transforms_train.json and transforms_test.json (or transforms_val.json).

    Frames: 'file_path' (extension optional, '.png' assumed) and a camera-to-world
    'transform_matrix' in the Blender convention. Intrinsics: 'camera_angle_x' (and
    optional 'camera_angle_y'), or 'fl_x'/'fl_y'/'cx'/'cy'/'w'/'h' at top level or per
    frame. RGBA images are composited over `background`. Without a test or val file,
    every `test_every`-th training frame is held out. No point cloud.
    """
    downscale = _check_downscale(downscale)
    if not os.path.isfile(os.path.join(root, "transforms_train.json")):
        raise FileNotFoundError(f"{root}: no transforms_train.json (not a NeRF-synthetic layout)")
    train = _nerf_split(root, "train", background, downscale, root)
    held = next((s for s in ("test", "val")
                 if os.path.isfile(os.path.join(root, f"transforms_{s}.json"))), None)
    if held is not None:
        test = _nerf_split(root, held, background, downscale, root)
    else:
        test = train[::test_every]
        train = [v for i, v in enumerate(train) if i % test_every]
    return Dataset(train, test, background=tuple(float(b) for b in background),
                   source=f"nerf_synthetic:{root}")


# ----------------------------------------------------------------------------------------
# COLMAP text model


def _colmap_lines(path):
    with open(path) as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if text and not text.startswith("#"):
                yield number, text


def _parse_error(path, number, problem):
    return ValueError(f"{path}:{number}: {problem}")


def read_colmap_cameras(path) -> dict:
    """cameras.txt -> {camera_id: (width, height, fx, fy, cx, cy)}; PINHOLE and SIMPLE_PINHOLE
    only (undistorted images, as 3DGS requires)."""
    cams = {}
    for number, text in _colmap_lines(path):
        w = text.split()
        if len(w) < 5:
            raise _parse_error(path, number, "expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS[]")
        model, params = w[1], [float(p) for p in w[4:]]
        if model == "PINHOLE" and len(params) == 4:
            fx, fy, cx, cy = params
        elif model == "SIMPLE_PINHOLE" and len(params) == 3:
            fx, cx, cy = params
            fy = fx
        else:
            raise _parse_error(path, number, f"camera model {model} with {len(params)} params is "
                               "not supported; undistort the images (colmap image_undistorter) "
                               "to get PINHOLE cameras")
        cams[int(w[0])] = (int(w[2]), int(w[3]), fx, fy, cx, cy)
    return cams


def quat_wxyz_to_rotmat(q) -> np.ndarray:
    """(4,) wxyz quaternion (any norm) -> (3,3) rotation matrix, float64."""
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def read_colmap_images(path) -> list:
    """images.txt -> [(name, camera_id, world_to_camera (4,4))] sorted by name. Each image
    has two lines: IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME, then its 2D points
    (possibly empty, so blank lines count here)."""
    out = []
    with open(path) as f:
        lines = [(i, line.strip()) for i, line in enumerate(f, 1) if not line.startswith("#")]
    for k in range(0, len(lines), 2):
        number, text = lines[k]
        if not text:
            continue
        w = text.split()
        if len(w) < 10:
            raise _parse_error(path, number, "expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME")
        w2c = np.eye(4)
        w2c[:3, :3] = quat_wxyz_to_rotmat([float(v) for v in w[1:5]])
        w2c[:3, 3] = [float(v) for v in w[5:8]]
        out.append((" ".join(w[9:]), int(w[8]), w2c))
    return sorted(out, key=lambda item: item[0])


def read_colmap_points(path):
    """points3D.txt -> (points (M,3) float32, colors (M,3) float32 in [0,1])."""
    xyz, rgb = [], []
    for number, text in _colmap_lines(path):
        w = text.split()
        if len(w) < 7:
            raise _parse_error(path, number, "expected POINT3D_ID X Y Z R G B ERROR TRACK[]")
        xyz.append([float(v) for v in w[1:4]])
        rgb.append([int(v) for v in w[4:7]])
    return (np.asarray(xyz, np.float32).reshape(-1, 3),
            np.asarray(rgb, np.float32).reshape(-1, 3) / 255.0)


def _find_colmap_model(root):
    for sub in (os.path.join("sparse", "0"), "sparse", ""):
        folder = os.path.join(root, sub)
        if os.path.isfile(os.path.join(folder, "cameras.txt")):
            return folder
        if os.path.isfile(os.path.join(folder, "cameras.bin")):
            raise ValueError(f"{folder}: binary COLMAP model found; convert it with "
                             "`colmap model_converter --output_type TXT`")
    raise FileNotFoundError(f"{root}: no cameras.txt in sparse/0, sparse or the root "
                            "(not a COLMAP text layout)")


def load_colmap(root, downscale: int = 1, test_every: int = 8, images_dir: str = "images") -> Dataset:
    """Read a COLMAP text model (cameras.txt, images.txt, points3D.txt) found in
    `root`/sparse/0, `root`/sparse or `root`, with images in `root`/`images_dir`.
    Images sorted by name; every `test_every`-th (from the first) is held out (LLFF style).
    `downscale` shrinks images (box filter) and intrinsics by an integer factor."""
    downscale = _check_downscale(downscale)
    model = _find_colmap_model(root)
    cams = read_colmap_cameras(os.path.join(model, "cameras.txt"))
    entries = read_colmap_images(os.path.join(model, "images.txt"))
    points_file = os.path.join(model, "points3D.txt")
    points, colors = read_colmap_points(points_file) if os.path.isfile(points_file) else (None, None)
    if not entries:
        raise ValueError(f"{model}/images.txt lists no images")
    views = []
    for name, cam_id, w2c in entries:
        if cam_id not in cams:
            raise ValueError(f"{model}/images.txt: image {name} uses unknown camera {cam_id}")
        width, height, fx, fy, cx, cy = cams[cam_id]
        image = _load_image(os.path.join(root, images_dir, name), (0.0, 0.0, 0.0), downscale)
        sx, sy = image.shape[1] / width, image.shape[0] / height
        K = np.array([[fx * sx, 0.0, cx * sx], [0.0, fy * sy, cy * sy], [0.0, 0.0, 1.0]])
        views.append(View(name, image, K, w2c))
    test = views[::test_every] if len(views) > 1 else []
    train = [v for i, v in enumerate(views) if i % test_every or len(views) == 1]
    return Dataset(train, test, points, colors, source=f"colmap:{root}")


def load_dataset(root, kind: str = "auto", **kwargs) -> Dataset:
    """Load `root` as kind 'nerf' (transforms.json), 'colmap' (text model) or 'auto'
    (whichever layout is present). `kwargs` go to the reader."""
    if kind not in ("auto", "nerf", "colmap"):
        raise ValueError(f"dataset kind must be 'auto', 'nerf' or 'colmap', got {kind!r}")
    if not os.path.isdir(root):
        raise FileNotFoundError(f"dataset folder not found: {root}")
    if kind == "nerf" or (kind == "auto" and os.path.isfile(os.path.join(root, "transforms_train.json"))):
        return load_nerf_synthetic(root, **kwargs)
    return load_colmap(root, **kwargs)
