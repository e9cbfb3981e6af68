"""Multi-view dataset readers: transforms.json (NeRF-synthetic, nerfstudio, instant-ngp)
and COLMAP models (binary or text, through pycolmap; see colmap.py).

Cameras come out in the OpenCV/gsplat convention (x right, y down, z forward) as
4x4 float64 world_to_camera matrices and 3x3 pixel intrinsics, each pose checked to be
rigid (check_pose), with the capture's own lens where the renderer draws it (an arc_warp
camera model, "pinhole" or "fisheye", and its `arc_warp.Distortion`): images are used as
they are, full frame. `undistort=True` (`arc-warp train --undistort`) resamples every
distorted or fisheye image to a pinhole camera instead (pycolmap, as before lenses were
rendered natively). Images of any bit depth and mode pillow reads become float32 RGB in
[0, 1] (see _image_values: 8-bit / 255, 16-bit / 65535, float images taken as values in
[0, 1]); RGBA images are composited over the dataset background.
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np

from arc_warp import Camera, Distortion


@dataclass
class View:
    """One posed image: image (H,W,3) float32 in [0,1], K (3,3) float64 pixels,
    world_to_camera (4,4) float64 OpenCV axes, and the camera's lens: `model` ("pinhole"
    or "fisheye", arc_warp's camera models) and `distortion` (`arc_warp.Distortion` in
    OpenCV's conventions, or None)."""

    name: str
    image: np.ndarray
    K: np.ndarray
    world_to_camera: np.ndarray
    model: str = "pinhole"
    distortion: Distortion = None

    @property
    def lens(self) -> str:
        """The camera's model, "+ distortion" when it has one ("pinhole", "fisheye + distortion", ...)."""
        return self.model + (" + distortion" if self.distortion is not None else "")

    def camera(self, near: float = 0.01, far: float = 1e10) -> Camera:
        """This view's `arc_warp.Camera` (its size, intrinsics, pose and lens)."""
        K = self.K
        return Camera(K[0, 0], K[1, 1], K[0, 2], K[1, 2], self.width, self.height,
                      self.world_to_camera, near, far, self.model, self.distortion)

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
    point_colors (M,3) float32 in [0,1]) and the RGB background images were composited on.
    extras: what the reader adds, e.g. "downscale" (the factor images were loaded at),
    "undistort" (whether lenses were resampled to pinholes), "camera_notes" (one line per
    camera undistorted because the renderer cannot draw it) and "skipped_frames"."""

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


_EIGHT_BIT_MODES = ("1", "L", "P", "PA", "LA", "RGB", "RGBA", "RGBX", "RGBa", "CMYK", "YCbCr",
                    "LAB", "HSV")
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
FLOAT_TOLERANCE = 1e-3
"""Float (mode F) images may stray this far outside [0, 1] (rounding) and are clipped;
further out is an error."""


def _image_values(im, path) -> np.ndarray:
    """PIL image -> (H,W,4) float32 RGBA in [0,1] (straight alpha), by mode:

    - 8-bit modes (1, L, P, PA, LA, RGB, RGBA, RGBX, RGBa, CMYK, YCbCr, LAB, HSV, so also
      16-bit RGB(A) PNGs, which pillow reads as 8-bit): converted by pillow, / 255;
    - 16-bit grayscale (I;16, I;16B, ...; 16-bit PNGs) and 32-bit integer (I) holding
      values in 0..65535 (older pillows read 16-bit PNGs as I): / 65535;
    - 32-bit float (F, e.g. float TIFFs): taken as they are, values in [0, 1] (see
      FLOAT_TOLERANCE); NaN, infinities and values outside are an error.
    Other modes are an error naming the file."""
    mode = im.mode
    if mode in _EIGHT_BIT_MODES:
        return np.asarray(im.convert("RGBA"), dtype=np.float32) / 255.0
    values = np.asarray(im)
    if mode in _SIXTEEN_BIT_MODES or mode == "I":
        if mode == "I" and values.size and (values.min() < 0 or values.max() > 65535):
            raise ValueError(f"{path}: 32-bit integer image with values in {values.min()}.."
                             f"{values.max()}, outside the 16-bit range 0..65535 that integer "
                             "images are read in; save it as an 8- or 16-bit PNG")
        gray = values.astype(np.float32) / 65535.0
    elif mode == "F":
        gray = values.astype(np.float32)
        if not np.all(np.isfinite(gray)):
            raise ValueError(f"{path}: float image with NaN or infinite values; save it with "
                             "finite values in [0, 1]")
        low, high = float(gray.min()), float(gray.max())
        if low < -FLOAT_TOLERANCE or high > 1.0 + FLOAT_TOLERANCE:
            raise ValueError(f"{path}: float image with values in [{low:.4g}, {high:.4g}]; "
                             "float images are read as values in [0, 1]: rescale it to [0, 1] "
                             "or save it as an 8- or 16-bit PNG")
        gray = np.clip(gray, 0.0, 1.0)
    else:
        raise ValueError(f"{path}: image mode {mode} is not supported; save it as an 8- or "
                         "16-bit PNG (grayscale, RGB or RGBA)")
    return np.concatenate([np.repeat(gray[..., None], 3, axis=-1),
                           np.ones(gray.shape + (1,), np.float32)], axis=-1)


def _box_downscale(values: np.ndarray, downscale: int) -> np.ndarray:
    """(H,W,C) float32 -> (H // downscale, W // downscale, C), each channel box-filtered by
    pillow (the same footprint as resizing the 8-bit image)."""
    from PIL import Image

    h, w = values.shape[0] // downscale, values.shape[1] // downscale
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(values[..., c]), "F")
                                .resize((w, h), Image.BOX), np.float32)
                     for c in range(values.shape[2])], axis=-1)


def load_image(path: str, background, downscale: int) -> np.ndarray:
    """Image file -> (H,W,3) float32 in [0,1]: any bit depth and mode pillow reads (see
    _image_values), RGBA composited over `background`, shrunk by the integer `downscale`
    (box filter). Errors name the file."""
    from PIL import Image, UnidentifiedImageError  # app extra

    if not os.path.isfile(path):
        raise FileNotFoundError(f"image not found: {path}")
    try:
        with Image.open(path) as im:
            im.load()
            if downscale > 1 and (im.width < downscale or im.height < downscale):
                raise ValueError(f"{path}: --downscale {downscale} leaves no pixel of this "
                                 f"{im.width}x{im.height} image; use a --downscale of at most "
                                 f"{min(im.width, im.height)}")
            rgba = _image_values(im, path)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ValueError(f"{path}: cannot read the image ({exc}); replace or remove the "
                         "file") from None
    alpha = rgba[..., 3:]
    rgb = rgba[..., :3] * alpha + np.asarray(background, np.float32) * (1.0 - alpha)
    return _box_downscale(rgb, downscale) if downscale > 1 else rgb


def _check_downscale(downscale) -> int:
    if isinstance(downscale, bool) or not isinstance(downscale, (int, np.integer)) or downscale < 1:
        raise ValueError(f"downscale must be an int >= 1, got {downscale!r}")
    return int(downscale)


ORTHONORMAL_TOLERANCE = 1e-3
"""Largest |(R^T R - I)_ij| accepted for a pose's rotation R (poses written with 4-6
decimals stay well inside; a shear or scale of 0.1 % does not)."""


def check_pose(matrix: np.ndarray, where: str, what: str) -> None:
    """ValueError naming `where` (file, frame) unless the (4,4) float64 `matrix` (`what`:
    the field's name) is a finite rigid transform: last row (0, 0, 0, 1), rotation block
    orthonormal (R^T R = I within ORTHONORMAL_TOLERANCE) with det +1."""
    fix = f"fix {what} or remove this view"
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{where}: the camera pose has non-finite entries; {fix}")
    if np.abs(matrix[3] - (0.0, 0.0, 0.0, 1.0)).max() > 1e-6:
        raise ValueError(f"{where}: {what} must end with the row (0, 0, 0, 1), got "
                         f"{np.array2string(matrix[3], precision=4)}; {fix}")
    rot = matrix[:3, :3]
    det = float(np.linalg.det(rot))
    if abs(det) < 1e-6:
        raise ValueError(f"{where}: {what} is singular (its rotation has det {det:.3g}); {fix}")
    error = float(np.abs(rot.T @ rot - np.eye(3)).max())
    if error > ORTHONORMAL_TOLERANCE:
        raise ValueError(f"{where}: the rotation of {what} is not orthonormal (R^T R is off "
                         f"the identity by {error:.3g}: a shear or scale); {fix}")
    if det < 0:
        raise ValueError(f"{where}: the rotation of {what} is a mirror (det {det:.3g}, not +1; "
                         f"an axis is flipped); {fix}")


def _check_focal(K, where) -> np.ndarray:
    """K (3,3) as float64, after checking that its focal lengths are finite and > 0."""
    K = np.asarray(K, np.float64)
    if not np.all(np.isfinite(K)) or K[0, 0] <= 0 or K[1, 1] <= 0:
        raise ValueError(f"{where}: focal lengths must be finite and > 0, got fx={K[0, 0]:g}, "
                         f"fy={K[1, 1]:g}")
    return K


def check_lens(K, width: int, height: int, model: str, distortion, where: str) -> None:
    """ValueError naming `where` (file, camera or frame) and `--undistort` when the renderer
    refuses the lens: `arc_warp.Camera` raises for a distortion whose radial map folds
    back inside the image (see `arc_warp.Camera`)."""
    K = np.asarray(K, np.float64)
    try:
        Camera(K[0, 0], K[1, 1], K[0, 2], K[1, 2], width, height, model=model,
               distortion=distortion)
    except ValueError as exc:
        raise ValueError(f"{where}: the renderer cannot draw this lens ({exc}); pass --undistort "
                         "to resample its images to a pinhole camera instead") from None


def _checked_view(name, image, K, world_to_camera, where, what="the pose", model="pinhole",
                  distortion=None) -> View:
    """View after checking that K has finite positive focal lengths and the pose is a
    finite rigid transform (check_pose); `where` (file, frame) names the culprit."""
    K = _check_focal(K, where)
    w2c = np.asarray(world_to_camera, np.float64)
    check_pose(w2c, where, what)
    return View(name, image, K, w2c, model, distortion)


def llff_split(views, test_every: int):
    """(train, test): views sorted by name, every `test_every`-th from the first held out
    (the LLFF hold-out of INRIA and gsplat); a single view is used for both."""
    views = sorted(views, key=lambda v: v.name)
    if len(views) == 1:
        return views, []
    return ([v for i, v in enumerate(views) if i % test_every],
            [v for i, v in enumerate(views) if not i % test_every])


# ----------------------------------------------------------------------------------------
# transforms.json: NeRF-synthetic (transforms_{train,test}.json) and nerfstudio/instant-ngp


def _read_json(path):
    try:
        with open(path) as f:
            meta = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list):
        raise ValueError(f"{path}: expected a JSON object with a 'frames' list")
    if not meta["frames"]:
        raise ValueError(f"{path}: the 'frames' list is empty; add posed frames")
    return meta


def _number(frame, meta, key, where, default=None):
    """frame[key], else meta[key], else `default`, as a float; errors name file and frame."""
    value = frame.get(key, meta.get(key, default))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: '{key}' must be a number, got {value!r}")
    return float(value)


# transforms.json camera_model -> (arc_warp camera model, its coefficients in the file).
# OPENCV's k1, k2, k3 and p1, p2 are OpenCV's; nerfstudio reads a k4 there as an r^8 term,
# which OpenCV's model has not (its k4 divides), so a non-zero k4 is refused.
_LENSES = {"PINHOLE": ("pinhole", ()), "SIMPLE_PINHOLE": ("pinhole", ()),
           "OPENCV": ("pinhole", ("k1", "k2", "p1", "p2", "k3")),
           "OPENCV_FISHEYE": ("fisheye", ("k1", "k2", "k3", "k4"))}


def _frame_camera(frame, meta, where, image_size, downscale, undistort):
    """(K, arc_warp camera model, Distortion or None, pycolmap camera to undistort with or
    None) of one frame at the size of its loaded image."""
    h, w = image_size
    src_w = _number(frame, meta, "w", where, w * downscale)
    src_h = _number(frame, meta, "h", where, h * downscale)
    fx = _number(frame, meta, "fl_x", where)
    if fx is None:
        angle = _number(frame, meta, "camera_angle_x", where)
        if angle is None:
            raise ValueError(f"{where}: needs 'camera_angle_x' or 'fl_x'")
        fx = 0.5 * src_w / np.tan(0.5 * angle)
    fy = _number(frame, meta, "fl_y", where)
    if fy is None:
        angle = _number(frame, meta, "camera_angle_y", where)
        fy = fx if angle is None else 0.5 * src_h / np.tan(0.5 * angle)
    cx = _number(frame, meta, "cx", where, 0.5 * src_w)
    cy = _number(frame, meta, "cy", where, 0.5 * src_h)
    sx, sy = w / src_w, h / src_h
    K = _check_focal([[fx * sx, 0.0, cx * sx], [0.0, fy * sy, cy * sy], [0.0, 0.0, 1.0]], where)
    name = frame.get("camera_model", meta.get("camera_model", "OPENCV"))
    if name not in _LENSES:
        raise ValueError(f"{where}: camera_model {name!r} is not supported ({', '.join(_LENSES)}; "
                         "spherical cameras such as EQUIRECTANGULAR neither render nor undistort "
                         "to a pinhole)")
    model, fields = _LENSES[name]
    if name == "OPENCV" and _number(frame, meta, "k4", where, 0.0):
        raise ValueError(f"{where}: 'k4' with camera_model OPENCV is nerfstudio's r^8 radial term, "
                         "which OpenCV's model (and so neither the renderer nor the undistortion) "
                         "has; refit the camera without it")
    coeffs = {k: _number(frame, meta, k, where, 0.0) for k in fields}
    lens = Distortion(**coeffs)
    if lens.is_zero:
        return K, model, None, None
    if not undistort:
        check_lens(K, w, h, model, lens, where)
        return K, model, lens, None
    from .colmap import pycolmap

    pc = pycolmap()
    # pycolmap's model of the same lens: FULL_OPENCV holds OPENCV's k3
    colmap_name = "FULL_OPENCV" if name == "OPENCV" and lens.k3 else name
    camera = pc.Camera.create_from_model_name(0, colmap_name, 1.0, w, h)
    values = lens.coefficients(model)  # OpenCV's order, pycolmap's too
    camera.params = [K[0, 0], K[1, 1], K[0, 2], K[1, 2],
                     *values[:len(camera.params) - 4]]
    return K, model, lens, camera


def _transforms_views(path, root, background, downscale, undistort, skip_missing=False):
    """(views, skipped) of one transforms*.json file (camera-to-world in the Blender/OpenGL
    axes), each view with its lens (resampled to a pinhole when `undistort`). With
    `skip_missing`, frames whose image file does not exist are left out and their paths
    returned in `skipped` (instant-ngp's rule: its captures list every frame COLMAP posed,
    and blurry photos are deleted from images/ afterwards); otherwise a missing image is
    an error."""
    from .colmap import image_folder, undistort_image

    meta = _read_json(path)
    views, skipped = [], []
    for i, frame in enumerate(meta["frames"]):
        where = f"{path}: frame {i}"
        if not isinstance(frame, dict) or "file_path" not in frame \
                or "transform_matrix" not in frame:
            raise ValueError(f"{where} needs 'file_path' and 'transform_matrix'")
        rel = os.path.normpath(frame["file_path"])
        parts = rel.split(os.sep, 1)
        factor = downscale
        if len(parts) == 2 and parts[0] == "images":  # nerfstudio's images_N folders
            folder, factor = image_folder(root, downscale)
            file = os.path.join(folder, parts[1])
        else:
            file = os.path.join(root, rel)
        if not os.path.splitext(file)[1]:
            file += ".png"
        where = f"{path}: frame {i} ({frame['file_path']})"
        if skip_missing and not os.path.isfile(file):
            skipped.append(file)
            continue
        try:
            c2w = np.array(frame["transform_matrix"], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: transform_matrix must be 4x4 numbers") from None
        if c2w.shape != (4, 4):
            raise ValueError(f"{where}: transform_matrix must be 4x4, got shape {c2w.shape}")
        check_pose(c2w, where, "transform_matrix")  # before inverting it
        image = load_image(file, background, factor)
        K, model, lens, camera = _frame_camera(frame, meta, where, image.shape[:2], downscale,
                                               undistort)
        if camera is not None:
            image, K = undistort_image(image, camera, file)
            model, lens = "pinhole", None
        c2w[:3, 1:3] *= -1.0  # OpenGL/Blender (y up, z back) -> OpenCV (y down, z forward)
        views.append(_checked_view(os.path.relpath(file, root), image, K, np.linalg.inv(c2w),
                                   where, "transform_matrix", model, lens))
    if not views:
        raise FileNotFoundError(f"{path}: none of the {len(skipped)} frames' images exist "
                                f"(first: {skipped[0]})")
    return views, skipped


def load_nerf_synthetic(root, background=(1.0, 1.0, 1.0), downscale: int = 1,
                        test_every: int = 8, undistort: bool = False) -> Dataset:
    """Read a transforms.json dataset: NeRF-synthetic (`root`/transforms_train.json with
    transforms_test.json or transforms_val.json) or nerfstudio / instant-ngp (one
    `root`/transforms.json, every `test_every`-th frame by name held out; frames whose
    image file is missing are skipped, as instant-ngp does, and listed in
    extras['skipped_frames']).

    Frames: 'file_path' (extension optional, '.png' assumed) and a camera-to-world
    'transform_matrix' in the Blender convention. Intrinsics: 'camera_angle_x' (and
    optional 'camera_angle_y'), or 'fl_x'/'fl_y'/'cx'/'cy'/'w'/'h', at top level or per
    frame. 'camera_model' PINHOLE, OPENCV (the default: 'k1', 'k2', 'k3', 'p1', 'p2') or
    OPENCV_FISHEYE ('k1'..'k4'): kept as the view's lens (rendered natively, full frame),
    or with `undistort` resampled to a pinhole with pycolmap; a lens the renderer refuses
    is an error naming the file and frame. RGBA images are composited over
    `background`. Paths under images/ use images_N when it exists for downscale N. No
    point cloud.
    """
    downscale = _check_downscale(downscale)
    split = os.path.join(root, "transforms_train.json")
    single = os.path.join(root, "transforms.json")
    skipped = []
    if os.path.isfile(split):
        train, _ = _transforms_views(split, root, background, downscale, undistort)
        held = next((s for s in ("test", "val")
                     if os.path.isfile(os.path.join(root, f"transforms_{s}.json"))), None)
        if held is not None:
            test, _ = _transforms_views(os.path.join(root, f"transforms_{held}.json"), root,
                                        background, downscale, undistort)
        else:
            train, test = llff_split(train, test_every)
        source = f"nerf_synthetic:{root}"
    elif os.path.isfile(single):
        views, skipped = _transforms_views(single, root, background, downscale, undistort,
                                           skip_missing=True)
        train, test = llff_split(views, test_every)
        source = f"transforms:{root}"
    else:
        raise FileNotFoundError(f"{root}: no transforms_train.json or transforms.json "
                                "(not a NeRF-synthetic or nerfstudio layout)")
    extras = {"downscale": downscale, "undistort": bool(undistort),
              **({"skipped_frames": skipped} if skipped else {})}
    return Dataset(train, test, background=tuple(float(b) for b in background), source=source,
                   extras=extras)


# ----------------------------------------------------------------------------------------
# COLMAP


def load_colmap(root, downscale: int = 1, test_every: int = 8,
                undistort: bool = False) -> Dataset:
    """Read a COLMAP model, binary or text, from `root`/sparse/0, `root`/sparse or `root`,
    with images in `root`/images (or `root`/images_N for downscale N when that folder
    exists; otherwise images are shrunk by a box filter). Cameras the renderer draws
    (colmap.NATIVE_MODELS) keep their lens and full frame; the other perspective and
    fisheye models, and every model with `undistort`, are undistorted on load (pycolmap;
    extras["camera_notes"] says which and why). Images sorted by name; every
    `test_every`-th from the first is held out (LLFF style, as INRIA and gsplat)."""
    from .colmap import colmap_views

    downscale = _check_downscale(downscale)
    model, entries, points, colors, notes = colmap_views(
        root, downscale, lambda path, factor: load_image(path, (0.0, 0.0, 0.0), factor),
        undistort)
    views = [_checked_view(name, image, K, w2c, f"{model}: image {name}", "its pose", lens, dist)
             for name, image, K, w2c, lens, dist in entries]
    train, test = llff_split(views, test_every)
    extras = {"downscale": downscale, "undistort": bool(undistort),
              **({"camera_notes": notes} if notes else {})}
    return Dataset(train, test, points if len(points) else None,
                   colors if len(points) else None, source=f"colmap:{root}", extras=extras)


def dataset_kind(root) -> str:
    """'nerf' when `root` holds transforms_train.json or transforms.json, else 'colmap'."""
    return "nerf" if any(os.path.isfile(os.path.join(root, f)) for f in (
        "transforms_train.json", "transforms.json")) else "colmap"


def load_dataset(root, kind: str = "auto", **kwargs) -> Dataset:
    """Load `root` as kind 'nerf' (transforms*.json), 'colmap' (binary or text model) or
    'auto' (whichever layout is present). `kwargs` go to the reader."""
    if kind not in ("auto", "nerf", "colmap"):
        raise ValueError(f"dataset kind must be 'auto', 'nerf' or 'colmap', got {kind!r}")
    if not os.path.isdir(root):
        raise FileNotFoundError(f"dataset folder not found: {root}")
    if kind == "nerf" or (kind == "auto" and dataset_kind(root) == "nerf"):
        return load_nerf_synthetic(root, **kwargs)
    return load_colmap(root, **kwargs)
