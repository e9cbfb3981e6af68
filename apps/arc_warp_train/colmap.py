"""COLMAP models (binary or text) through pycolmap, each camera kept as the renderer's own
lens where it can draw it, undistorted otherwise.

Cameras whose model the renderer draws exactly (``NATIVE_MODELS``: the pinholes, COLMAP's
radial and OpenCV models and its fisheyes) become an arc_warp camera model and
`arc_warp.Distortion`, and their images are used as they are, full frame. With
``undistort=True`` (`arc-warp train --undistort`), and for the models the renderer cannot
draw (thin prism, FOV, EUCM, division: a note says so), images are resampled to a
pinhole camera by pycolmap's undistortion (COLMAP's own `image_undistorter` logic, which
crops to the valid region, so their size may change and a fisheye loses the rim of its
field of view). Models that cannot be undistorted to a pinhole (spherical ones) are
refused by name. A lens the renderer refuses (its radial map folds back inside the image:
`arc_warp.Camera` raises) is an error naming the file and camera, with `--undistort` as
the way out.
"""

import os

import numpy as np

PINHOLE_MODELS = ("PINHOLE", "SIMPLE_PINHOLE")
COLMAP_HINT = "pip install -e '.[colmap]' (from the arc_warp checkout)"

# COLMAP model -> (arc_warp camera model, {COLMAP parameter: arc_warp.Distortion field});
# COLMAP's radial terms are OpenCV's (1 + k1 r^2 + k2 r^4 on the pinhole, theta (1 + k1
# theta^2 + ...) on the equidistant fisheye), so the coefficients carry over unchanged
NATIVE_MODELS = {
    "SIMPLE_PINHOLE": ("pinhole", {}),
    "PINHOLE": ("pinhole", {}),
    "SIMPLE_RADIAL": ("pinhole", {"k": "k1"}),
    "RADIAL": ("pinhole", {"k1": "k1", "k2": "k2"}),
    "OPENCV": ("pinhole", {k: k for k in ("k1", "k2", "p1", "p2")}),
    "FULL_OPENCV": ("pinhole", {k: k for k in ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6")}),
    "SIMPLE_FISHEYE": ("fisheye", {}),
    "FISHEYE": ("fisheye", {}),
    "SIMPLE_RADIAL_FISHEYE": ("fisheye", {"k": "k1"}),
    "RADIAL_FISHEYE": ("fisheye", {"k1": "k1", "k2": "k2"}),
    "OPENCV_FISHEYE": ("fisheye", {k: k for k in ("k1", "k2", "k3", "k4")}),
}
# why the other perspective models are undistorted (a note per camera says so)
NOT_NATIVE = {
    "THIN_PRISM_FISHEYE": "thin-prism terms (sx1, sy1)",
    "RAD_TAN_THIN_PRISM_FISHEYE": "thin-prism terms and a radial polynomial to theta^11",
    "FOV": "the FOV model's arctangent distortion",
    "EUCM": "the enhanced unified camera model",
    "DIVISION": "division-model distortion",
    "SIMPLE_DIVISION": "division-model distortion",
}


def pycolmap():
    """The pycolmap module, or ImportError saying how to install it."""
    try:
        import pycolmap as module
    except ImportError as exc:
        raise ImportError(f"reading COLMAP models and undistorting images needs pycolmap: "
                          f"{COLMAP_HINT}") from exc
    return module


def _check_perspective(camera, where):
    # Spherical models have no focal length: pycolmap crashes when asked for one.
    if not camera.is_perspective():
        raise ValueError(f"{where}: camera model {camera.model_name} cannot be undistorted to "
                         "a pinhole camera (spherical models are not supported); use a "
                         "perspective or fisheye model")


def undistort_image(image: np.ndarray, camera, where: str):
    """Resample `image` (H,W,3) float32 in [0,1], taken by pycolmap `camera` (already sized
    to the image), to a pinhole camera -> (image (H',W',3) float32, K (3,3) float64).

    Pinhole cameras pass through untouched. `where` names the image in errors."""
    h, w = image.shape[:2]
    if (camera.width, camera.height) != (w, h):
        raise ValueError(f"{where}: image is {w}x{h} but its camera is "
                         f"{camera.width}x{camera.height}")
    if camera.model_name in PINHOLE_MODELS:
        return image, np.asarray(camera.calibration_matrix(), np.float64)
    _check_perspective(camera, where)
    pc = pycolmap()
    rgb8 = (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    try:
        out, cam = pc.undistort_image(pc.UndistortCameraOptions(),
                                      pc.Bitmap.from_array(np.ascontiguousarray(rgb8)), camera)
    except ValueError as exc:
        raise ValueError(f"{where}: pycolmap could not undistort camera model "
                         f"{camera.model_name} ({exc})") from None
    pixels = np.asarray(out.to_array(), np.float32) / 255.0
    return pixels.reshape(pixels.shape[0], pixels.shape[1], -1)[..., :3], \
        np.asarray(cam.calibration_matrix(), np.float64)


def find_model(root):
    """The folder of the COLMAP model under `root` (sparse/0, sparse or root itself, binary
    or text), or FileNotFoundError."""
    for sub in (os.path.join("sparse", "0"), "sparse", ""):
        folder = os.path.join(root, sub)
        for ext in (".bin", ".txt"):
            if os.path.isfile(os.path.join(folder, "cameras" + ext)):
                return folder
    raise FileNotFoundError(f"{root}: no cameras.bin or cameras.txt in sparse/0, sparse or "
                            "the folder itself (not a COLMAP layout)")


def _locate_text_error(model):
    """file:line of the first non-number where a text model needs a number, or None."""
    for name in ("cameras.txt", "images.txt", "points3D.txt"):
        path = os.path.join(model, name)
        if not os.path.isfile(path):
            continue
        record = 0
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if line.startswith("#"):
                    continue
                words = line.split()
                if name == "images.txt":
                    record += 1
                    # odd records: IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME;
                    # even ones: X Y POINT3D_ID triples
                    words = words[:9] if record % 2 else words
                elif name == "cameras.txt":
                    words = words[:1] + words[2:]
                for word in words:
                    try:
                        float(word)
                    except ValueError:
                        return f"{path}:{number}: {word!r} is not a number"
    return None


def read_model(root):
    """Read the COLMAP model under `root` -> pycolmap.Reconstruction, with every error
    naming the model folder (and file:line for text models)."""
    model = find_model(root)
    pc = pycolmap()
    try:
        return model, pc.Reconstruction(model)
    except (ValueError, IndexError, RuntimeError) as exc:
        where = _locate_text_error(model) if not os.path.isfile(
            os.path.join(model, "cameras.bin")) else None
        raise ValueError(where or f"{model}: not a readable COLMAP model ({exc}); check that "
                         "cameras, images and points3D files are complete") from None


def image_folder(root, downscale: int, images_dir: str = "images"):
    """(folder, factor still to apply): `root`/images_N when it exists for --downscale N
    (Mip-NeRF 360 layout), else `root`/images with the whole factor left to apply."""
    if downscale > 1:
        pre = os.path.join(root, f"{images_dir}_{downscale}")
        if os.path.isdir(pre):
            return pre, 1
    return os.path.join(root, images_dir), downscale


def native_lens(camera):
    """(arc_warp camera model, `arc_warp.Distortion` or None) of pycolmap `camera` when the
    renderer draws its model exactly (NATIVE_MODELS), else None."""
    from arc_warp import Distortion

    entry = NATIVE_MODELS.get(camera.model_name)
    if entry is None:
        return None
    model, fields = entry
    values = dict(zip((name.strip() for name in camera.params_info.split(",")), camera.params))
    lens = Distortion(**{field: float(values[name]) for name, field in fields.items()})
    return model, None if lens.is_zero else lens


def _cameras_file(model):
    binary = os.path.join(model, "cameras.bin")
    return binary if os.path.isfile(binary) else os.path.join(model, "cameras.txt")


def colmap_views(root, downscale, load_image, undistort=False):
    """The registered images of the COLMAP model under `root`, sorted by name, as
    (name, image, K, world_to_camera, model, distortion): the image (H,W,3) float32 at
    `downscale`, K (3,3) float64 pixels, the pose (4,4) float64, and the arc_warp camera
    model ("pinhole" / "fisheye") with its `arc_warp.Distortion` or None. Cameras are
    kept as they are where the renderer draws them (NATIVE_MODELS) unless `undistort`;
    the others are undistorted to pinholes. Also returns the points (M,3) and colours
    (M,3) float32 and notes (one line per camera undistorted because the renderer cannot
    draw its model).

    `load_image(path, downscale)` reads one image as (H,W,3) float32."""
    from .datasets import check_lens

    model, rec = read_model(root)
    folder, factor = image_folder(root, downscale)
    images = sorted((im for im in rec.images.values() if im.has_pose), key=lambda im: im.name)
    if not images:
        raise ValueError(f"{model}: the model has no registered images")
    lenses, notes = {}, []

    def lens_of(camera_id, camera):
        """The camera's native lens (None: undistort it), checked at its size once."""
        key = (camera_id, camera.width, camera.height)
        if key not in lenses:
            lens = None if undistort else native_lens(camera)
            if lens is not None:
                check_lens(camera.calibration_matrix(), camera.width, camera.height, *lens,
                           f"{_cameras_file(model)}: camera {camera_id} ({camera.model_name} "
                           f"{camera.width}x{camera.height})")
            elif not undistort and not any(k[0] == camera_id for k in lenses):
                why = NOT_NATIVE.get(camera.model_name, "its lens model")
                notes.append(f"camera {camera_id} ({camera.model_name}) is undistorted on load: "
                             f"the renderer does not draw {why}")
            lenses[key] = lens
        return lenses[key]

    for im in images:  # every camera checked before any image is read
        if any(key[0] == im.camera_id for key in lenses):
            continue
        camera = rec.cameras[im.camera_id]
        _check_perspective(camera, f"{model}: image {im.name}")
        params = np.asarray(camera.params, np.float64)
        if not np.all(np.isfinite(params)) or min(camera.focal_length_x,
                                                  camera.focal_length_y) <= 0:
            raise ValueError(f"{model}: camera {im.camera_id} of image {im.name} has invalid "
                             f"parameters ({camera.params_to_string()})")
        lens_of(im.camera_id, camera)
    out = []
    for im in images:
        pose = im.cam_from_world() if callable(im.cam_from_world) else im.cam_from_world
        w2c = np.eye(4)
        w2c[:3] = np.asarray(pose.matrix(), np.float64)
        if not np.all(np.isfinite(w2c)):
            raise ValueError(f"{model}: image {im.name} has a non-finite pose")
        camera = rec.cameras[im.camera_id]
        image = load_image(os.path.join(folder, im.name), factor)
        # Copy, so that rescaling does not touch the model's camera.
        camera = type(camera)(model=camera.model, width=camera.width, height=camera.height,
                              params=camera.params)
        camera.rescale(image.shape[1], image.shape[0])
        lens = lens_of(im.camera_id, camera)
        if lens is None:
            image, K = undistort_image(image, camera, os.path.join(folder, im.name))
            lens = ("pinhole", None)
        else:
            K = np.asarray(camera.calibration_matrix(), np.float64)
        out.append((im.name, image, K, w2c, *lens))
    pts = [(p.xyz, p.color) for _, p in sorted(rec.points3D.items())]
    points = np.asarray([p[0] for p in pts], np.float32).reshape(-1, 3)
    colors = np.asarray([p[1] for p in pts], np.float32).reshape(-1, 3) / 255.0
    return model, out, points, colors, notes
