"""Real-capture readers: COLMAP binary models with distorted cameras (written by pycolmap),
kept as they are or undistorted (`undistort=True`), images_N folders, the LLFF hold-out,
nerfstudio / instant-ngp transforms.json with OPENCV distortion, and the load-time errors
that name the file and frame. test_capture_lenses.py checks each lens kept natively."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("torch", reason="the trainer needs torch")
PIL_Image = pytest.importorskip("PIL.Image", reason="datasets need pillow (arc-warp[app])")
pycolmap = pytest.importorskip("pycolmap", reason="COLMAP models need pycolmap (arc-warp[colmap])")

from arc_warp_train.datasets import load_dataset  # noqa: E402

W, H = 48, 36
POINT = np.array([0.25, -0.15, 2.0])  # a 3D point every test camera sees


def _rotation(angle):
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def _dot_image(uv, w, h):
    """Black RGB image with a bright 3x3 dot centred on pixel coordinate `uv`."""
    img = np.zeros((h, w, 3), np.uint8)
    x, y = int(np.floor(uv[0])), int(np.floor(uv[1]))
    img[max(y - 1, 0):y + 2, max(x - 1, 0):x + 2] = 255
    return img


def _bright_centre(image):
    """Intensity-weighted centre (x, y) of the pixel centres of an (H,W,3) image, in
    pixel coordinates where pixel (i, j) covers [j, j+1) x [i, i+1)."""
    weight = image.mean(axis=2) ** 2
    ys, xs = np.mgrid[:image.shape[0], :image.shape[1]]
    return np.array([(weight * (xs + 0.5)).sum(), (weight * (ys + 0.5)).sum()]) / weight.sum()


def _colmap_scene(root, model="SIMPLE_RADIAL", params=(40.0, 24.0, 18.0, -0.15), views=9,
                  text=False, downscaled=None):
    """A COLMAP model written by pycolmap: `views` images looking at POINT, each a dot
    drawn where the distorted camera sees POINT (so an undistorted load must put it at
    K @ POINT); optional images_N copies at 1/N size."""
    rec = pycolmap.Reconstruction()
    cam = pycolmap.Camera.create_from_model_name(1, model, float(params[0]), W, H)
    cam.params = list(params)
    rec.add_camera_with_trivial_rig(cam)
    os.makedirs(root / "images")
    poses = {}
    for i in range(views):
        R = _rotation(0.02 * (i - views / 2))
        t = np.array([0.03 * i, 0.0, 0.0])
        pose = pycolmap.Rigid3d(pycolmap.Rotation3d(R), t)
        name = f"img_{(i * 7) % views:02d}.png"  # names out of id order
        rec.add_image_with_trivial_frame(
            pycolmap.Image(name=name, camera_id=1, image_id=i + 1), pose)
        p_cam = R @ POINT + t
        uv = cam.img_from_cam(p_cam[None])[0]
        PIL_Image.fromarray(_dot_image(uv, W, H)).save(root / "images" / name)
        if downscaled:
            os.makedirs(root / f"images_{downscaled}", exist_ok=True)
            small = cam.__class__(model=cam.model, width=W, height=H, params=cam.params)
            small.rescale(W // downscaled, H // downscaled)
            PIL_Image.fromarray(_dot_image(small.img_from_cam(p_cam[None])[0],
                                           W // downscaled, H // downscaled)).save(
                root / f"images_{downscaled}" / name)
        poses[name] = (R, t)
    for k, p in enumerate(np.random.default_rng(0).normal(size=(7, 3))):
        rec.add_point3D(p, pycolmap.Track(), np.array([10 * k, 20, 30], np.uint8))
    sparse = root / "sparse" / "0"
    os.makedirs(sparse)
    (rec.write_text if text else rec.write_binary)(str(sparse))
    return poses


def arc_pixels(view, cam_points):
    """arc_warp's pixels (M,2) of camera-space points (M,3) seen by `view` through its lens:
    the projected centres of tiny Gaussians rendered by the trainer's `render_views`
    (each view's lens passed to `rasterization` as the trainer passes it)."""
    import torch

    from arc_warp_train.model import render_views
    from arc_warp_train.trainer import ViewTensors

    c2w = np.linalg.inv(view.world_to_camera)
    world = np.asarray(cam_points, np.float64) @ c2w[:3, :3].T + c2w[:3, 3]
    n = len(world)
    params = {"means": torch.tensor(world, dtype=torch.float32),
              "quats": torch.tensor([[1.0, 0.0, 0.0, 0.0]] * n), "scales": torch.full((n, 3), -7.0),
              "opacities": torch.zeros(n), "sh0": torch.zeros(n, 1, 3), "shN": torch.zeros(n, 0, 3)}
    lens = ViewTensors.of(view, "cpu")
    _, _, meta = render_views(params, lens.viewmat, lens.K, view.width, view.height, 0, (0.0, 0.0, 0.0),
                              camera_model=lens.model, distortion=lens.distortion)
    assert bool((meta["radii"][0] > 0).all()), "a point was culled"
    return meta["means2d"][0].detach().double().numpy()


def _check_dot(view, poses):
    R, t = poses[view.name]
    np.testing.assert_allclose(view.world_to_camera[:3, :3], R, atol=1e-9)
    np.testing.assert_allclose(view.world_to_camera[:3, 3], t, atol=1e-9)
    if view.model == "pinhole" and view.distortion is None:
        uvw = view.K @ (R @ POINT + t)
        expected = uvw[:2] / uvw[2]
    else:  # kept as captured: where arc_warp draws POINT through the lens
        expected = arc_pixels(view, (R @ POINT + t)[None])[0]
    # The dot is 3 px wide and resampled at most once: its centre moves by well under a pixel.
    np.testing.assert_allclose(_bright_centre(view.image), expected, atol=0.75)


@pytest.mark.parametrize("text", [False, True], ids=["binary", "text"])
def test_colmap_simple_radial_undistorted_with_llff_holdout(tmp_path, text):
    poses = _colmap_scene(tmp_path, text=text)
    data = load_dataset(str(tmp_path), undistort=True)
    names = sorted(poses)
    assert [v.name for v in data.test] == [names[0], names[8]]  # every 8th by name
    assert [v.name for v in data.train] == names[1:8]
    for view in data.train + data.test:
        assert view.image.shape != (H, W, 3)  # resampled to the undistorted pinhole size
        _check_dot(view, poses)
    assert data.points.shape == (7, 3)
    np.testing.assert_allclose(data.point_colors[3], [30 / 255, 20 / 255, 30 / 255])


@pytest.mark.parametrize("model,params", [
    ("OPENCV", (40.0, 42.0, 24.0, 18.0, -0.1, 0.02, 0.003, -0.002)),
    ("OPENCV_FISHEYE", (40.0, 40.0, 24.0, 18.0, 0.05, 0.01, 0.0, 0.0)),
    ("PINHOLE", (40.0, 42.0, 24.5, 17.5))])
def test_colmap_camera_models_undistorted(tmp_path, model, params):
    poses = _colmap_scene(tmp_path, model, params, views=2)
    data = load_dataset(str(tmp_path), undistort=True)
    for view in data.train + data.test:
        assert view.model == "pinhole" and view.distortion is None
        _check_dot(view, poses)
    if model == "PINHOLE":  # passed through untouched
        assert data.train[0].image.shape == (H, W, 3)


@pytest.mark.parametrize("undistort", [False, True])
def test_colmap_spherical_model_refused_by_name(tmp_path, undistort):
    _colmap_scene(tmp_path, "EQUIRECTANGULAR", (W, H), views=1)
    with pytest.raises(ValueError, match="camera model EQUIRECTANGULAR cannot be undistorted"):
        load_dataset(str(tmp_path), undistort=undistort)


@pytest.mark.parametrize("undistort", [False, True])
def test_colmap_images_n_folder_used_for_downscale(tmp_path, undistort):
    poses = _colmap_scene(tmp_path, views=2, downscaled=2)
    # Blank the full-size images: only images_2 can supply the dots.
    for name in poses:
        PIL_Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(tmp_path / "images" / name)
    data = load_dataset(str(tmp_path), downscale=2, undistort=undistort)
    for view in data.train + data.test:
        assert view.image.shape[1] <= W // 2
        assert (view.distortion is None) == undistort
        _check_dot(view, poses)


def _transforms_scene(root, per_frame=False, distortion=None, frames=3):
    """nerfstudio-style transforms.json (OpenGL camera-to-world) with a dot per image drawn
    by the OPENCV camera; returns {name: (R, t)} world-to-camera in OpenCV axes."""
    os.makedirs(root / "images")
    intr = {"fl_x": 40.0, "fl_y": 42.0, "cx": 24.0, "cy": 18.0, "w": W, "h": H}
    dist = distortion or {}
    cam = pycolmap.Camera.create_from_model_name(0, "OPENCV", 1.0, W, H)
    cam.params = [40.0, 42.0, 24.0, 18.0, *(dist.get(k, 0.0) for k in ("k1", "k2", "p1", "p2"))]
    meta = {} if per_frame else {**intr, **dist}
    meta["frames"], poses = [], {}
    for i in reversed(range(frames)):  # listed out of name order
        R, t = _rotation(0.03 * i), np.array([0.0, 0.02 * i, 0.0])
        w2c = np.eye(4)
        w2c[:3, :3], w2c[:3, 3] = R, t
        c2w = np.linalg.inv(w2c)
        c2w[:3, 1:3] *= -1.0  # OpenCV -> OpenGL axes
        name = f"images/frame_{i:05d}.png"
        PIL_Image.fromarray(_dot_image(cam.img_from_cam((R @ POINT + t)[None])[0], W, H)).save(
            root / name)
        frame = {"file_path": name, "transform_matrix": c2w.tolist()}
        if per_frame:
            frame.update(intr, **dist)
        meta["frames"].append(frame)
        poses[name] = (R, t)
    (root / "transforms.json").write_text(json.dumps(meta))
    return poses


@pytest.mark.parametrize("per_frame", [False, True], ids=["scene", "frame"])
def test_transforms_json_opencv_undistorted(tmp_path, per_frame):
    dist = {"k1": -0.12, "k2": 0.02, "p1": 0.002, "p2": -0.003}
    poses = _transforms_scene(tmp_path, per_frame, dist, frames=9)
    data = load_dataset(str(tmp_path), undistort=True)
    assert data.source.startswith("transforms:")
    assert [v.name for v in data.test] == ["images/frame_00000.png", "images/frame_00008.png"]
    for view in data.train + data.test:
        _check_dot(view, poses)


def test_transforms_json_pinhole_intrinsics(tmp_path):
    poses = _transforms_scene(tmp_path)
    view = load_dataset(str(tmp_path)).train[0]
    np.testing.assert_allclose(view.K, [[40, 0, 24], [0, 42, 18], [0, 0, 1]])
    _check_dot(view, poses)


def test_transforms_json_frames_without_images_skipped_as_instant_ngp(tmp_path):
    """instant-ngp's captures (its data/nerf/fox) list frames whose blurry photo was deleted:
    those are left out and reported, the hold-out is taken over the rest; a scene with no
    image at all is an error naming one."""
    poses = _transforms_scene(tmp_path, frames=9)
    for i in (3, 5):
        os.remove(tmp_path / "images" / f"frame_{i:05d}.png")
    data = load_dataset(str(tmp_path))
    assert len(data.train) + len(data.test) == 7
    assert sorted(os.path.basename(p) for p in data.extras["skipped_frames"]) == [
        "frame_00003.png", "frame_00005.png"]
    assert [v.name for v in data.test] == ["images/frame_00000.png"]
    for view in data.train + data.test:
        _check_dot(view, poses)
    for name in os.listdir(tmp_path / "images"):
        os.remove(tmp_path / "images" / name)
    with pytest.raises(FileNotFoundError, match="none of the 9 frames' images exist"):
        load_dataset(str(tmp_path))


# ------------------------------------------------------------------ load-time errors


def _write_transforms(root, meta):
    (root / "transforms.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))


DATASET_ERRORS = {
    # case: (how to spoil a good 3-frame transforms.json scene, error text)
    "empty frames": (lambda root, meta: _write_transforms(root, {**meta, "frames": []}),
                     "'frames' list is empty"),
    "bad JSON": (lambda root, meta: _write_transforms(root, '{\n "frames": [\n  {,]}'),
                 "transforms.json:3: invalid JSON"),
    "number as text": (lambda root, meta: _write_transforms(
        root, {**meta, "frames": [meta["frames"][0], {**meta["frames"][1], "fl_x": "4O"}]}),
        "transforms.json: frame 1 (images/frame_00001.png): 'fl_x' must be a number, got '4O'"),
    "zero focal": (lambda root, meta: _write_transforms(
        root, {**meta, "frames": [meta["frames"][0], {**meta["frames"][1], "fl_y": 0.0}]}),
        "frame 1 (images/frame_00001.png): focal lengths must be finite and > 0"),
    "NaN pose": (lambda root, meta: _write_transforms(root, {**meta, "frames": [
        meta["frames"][0], meta["frames"][1],
        {**meta["frames"][2], "transform_matrix": [[float("nan")] * 4] * 4}]}),
        "frame 2 (images/frame_00000.png): the camera pose has non-finite entries"),
    "corrupt PNG": (lambda root, meta: (root / "images" / "frame_00001.png").write_bytes(
        b"\x89PNG\r\n\x1a\ngarbage"), "frame_00001.png: cannot read the image"),
}


def _spoil_pose(change):
    """Spoiler of DATASET_ERRORS: frame 1's transform_matrix through `change` (4x4 array)."""
    def spoil(root, meta):
        frame = meta["frames"][1]
        c2w = change(np.array(frame["transform_matrix"]))
        _write_transforms(root, {**meta, "frames": [meta["frames"][0], {
            **frame, "transform_matrix": c2w.tolist()}, meta["frames"][2]]})
    return spoil


def _columns(c2w, *pairs):
    out = c2w.copy()
    for dst, src, k in pairs:
        out[:3, dst] += k * c2w[:3, src]
    return out


FRAME_1 = "transforms.json: frame 1 (images/frame_00001.png): "
POSE_ERRORS = {
    # case: (how to spoil frame 1's camera-to-world matrix, error text after FRAME_1)
    "sheared": (lambda m: _columns(m, (1, 0, 0.2)),  # det stays 1
                "the rotation of transform_matrix is not orthonormal"),
    "scaled": (lambda m: np.diag([1.1, 1.1, 1.1, 1.0]) @ m,
               "the rotation of transform_matrix is not orthonormal"),
    "mirrored": (lambda m: m @ np.diag([-1.0, 1.0, 1.0, 1.0]),  # |det| stays 1
                 "the rotation of transform_matrix is a mirror (det -1"),
    "singular": (lambda m: _columns(m, (2, 2, -1.0)), "transform_matrix is singular"),
    "last row": (lambda m: m + np.outer([0, 0, 0, 1.0], [0, 0, 0.5, 0]),
                 "transform_matrix must end with the row (0, 0, 0, 1), got [0.  0.  0.5 1. ]"),
}
for _case, (_change, _text) in POSE_ERRORS.items():
    DATASET_ERRORS[f"{_case} pose"] = (_spoil_pose(_change),
                                       FRAME_1 + _text)


@pytest.mark.parametrize("case", list(DATASET_ERRORS))
def test_transforms_errors_name_file_and_frame(tmp_path, case):
    _transforms_scene(tmp_path)
    meta = json.loads((tmp_path / "transforms.json").read_text())
    spoil, expected = DATASET_ERRORS[case]
    spoil(tmp_path, meta)
    with pytest.raises(ValueError) as info:
        load_dataset(str(tmp_path))
    assert expected in str(info.value) and "\n" not in str(info.value)
    if "pose" in case:  # and what to do
        assert str(info.value).endswith("; fix transform_matrix or remove this view")


def test_colmap_errors_name_the_model(tmp_path):
    _colmap_scene(tmp_path, views=2, text=True)
    cams = tmp_path / "sparse" / "0" / "cameras.txt"
    good = cams.read_text()
    cams.write_text(good.replace("SIMPLE_RADIAL 48 36 40", "SIMPLE_RADIAL 48 36 4O"))
    with pytest.raises(ValueError, match=r"cameras.txt:\d+: '4O' is not a number"):
        load_dataset(str(tmp_path))
    cams.write_text(good.replace("SIMPLE_RADIAL 48 36 40", "SIMPLE_RADIAL 48 36 0"))
    with pytest.raises(ValueError, match=r"sparse/0: camera 1 of image img_00.png has invalid"):
        load_dataset(str(tmp_path))


# ------------------------------------------------------------------ image modes and depths


def _png16(path, values, color_type):
    """A 16-bit PNG written by hand (zlib), so pillow's writer plays no part: `values`
    (H,W) or (H,W,C) integers in 0..65535; color_type 0 gray, 2 RGB, 4 gray+alpha, 6 RGBA."""
    import struct
    import zlib

    h, w = values.shape[:2]
    raw = b"".join(b"\x00" + values[y].astype(">u2").tobytes() for y in range(h))

    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(
        ">IIBBBBB", w, h, 16, color_type, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b""))


RAMP16 = (np.arange(12).reshape(3, 4) * 5957).astype(np.uint16)  # 0 .. 65527
RAMP = RAMP16 / 65535.0
BACKGROUND = np.array([0.25, 0.5, 0.75])


def _gray(values):
    return np.repeat(np.asarray(values, np.float64)[..., None], 3, axis=-1)


def _image_case(kind, path):
    """Write a (3,4) image of `kind` to `path` -> (file, expected (3,4,3) float64, tolerance)."""
    if kind == "16-bit gray PNG":
        _png16(path.with_suffix(".png"), RAMP16, 0)
        return path.with_suffix(".png"), _gray(RAMP), 1e-6
    if kind == "16-bit gray+alpha PNG":  # pillow reads it as 8-bit LA
        alpha = np.full((3, 4), 65535, np.uint16)
        alpha[0] = 0
        _png16(path.with_suffix(".png"), np.stack([RAMP16, alpha], -1), 4)
        expected = _gray(RAMP)
        expected[0] = BACKGROUND
        return path.with_suffix(".png"), expected, 1 / 255
    if kind == "16-bit RGB PNG":  # pillow reads it as 8-bit RGB
        rgb = np.stack([RAMP16, RAMP16[::-1], np.full((3, 4), 65535)], -1)
        _png16(path.with_suffix(".png"), rgb, 2)
        return path.with_suffix(".png"), rgb / 65535.0, 1 / 255
    if kind in ("I;16 TIFF", "I;16B TIFF"):
        mode = kind.split()[0]
        data = RAMP16.astype(">u2" if mode.endswith("B") else "<u2").tobytes()
        PIL_Image.frombytes(mode, (4, 3), data).save(path.with_suffix(".tif"))
        return path.with_suffix(".tif"), _gray(RAMP), 1e-6
    if kind == "32-bit integer TIFF":
        PIL_Image.fromarray(RAMP16.astype(np.int32)).save(path.with_suffix(".tif"))
        return path.with_suffix(".tif"), _gray(RAMP), 1e-6
    if kind == "float TIFF":
        values = np.linspace(0.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
        PIL_Image.fromarray(values, "F").save(path.with_suffix(".tif"))
        return path.with_suffix(".tif"), _gray(values), 1e-6
    if kind == "palette PNG with transparency":
        im = PIL_Image.new("P", (4, 3))
        im.putpalette([255, 0, 0, 0, 255, 0, 10, 20, 30])
        im.putdata([0, 1, 2, 1] * 3)
        im.save(path.with_suffix(".png"), transparency=1)
        colours = {0: [1, 0, 0], 1: BACKGROUND, 2: np.array([10, 20, 30]) / 255}
        return path.with_suffix(".png"), np.array(
            [[colours[i] for i in (0, 1, 2, 1)]] * 3, np.float64), 1e-6
    if kind == "1-bit PNG":
        bits = (np.arange(12).reshape(3, 4) % 3 == 0)
        PIL_Image.fromarray(bits).save(path.with_suffix(".png"))
        return path.with_suffix(".png"), _gray(bits), 0.0
    if kind == "RGBA PNG":
        rgba = np.zeros((3, 4, 4), np.uint8)
        rgba[..., 0], rgba[..., 3] = 200, [[255, 0, 51, 255]] * 3
        PIL_Image.fromarray(rgba, "RGBA").save(path.with_suffix(".png"))
        a = rgba[..., 3:] / 255.0
        rgb = np.zeros((3, 4, 3))
        rgb[..., 0] = 200 / 255
        return path.with_suffix(".png"), rgb * a + BACKGROUND * (1 - a), 1e-6
    if kind == "CMYK TIFF":
        cmyk = np.zeros((3, 4, 4), np.uint8)
        cmyk[:, :2, 0] = 255  # cyan: no red
        PIL_Image.fromarray(cmyk, "CMYK").save(path.with_suffix(".tif"))
        expected = np.ones((3, 4, 3))
        expected[:, :2, 0] = 0.0
        return path.with_suffix(".tif"), expected, 1e-6
    raise AssertionError(kind)


IMAGE_KINDS = ["16-bit gray PNG", "16-bit gray+alpha PNG", "16-bit RGB PNG", "I;16 TIFF",
               "I;16B TIFF", "32-bit integer TIFF", "float TIFF",
               "palette PNG with transparency", "1-bit PNG", "RGBA PNG", "CMYK TIFF"]


@pytest.mark.parametrize("kind", IMAGE_KINDS)
def test_every_image_mode_loads_as_unit_float_rgb(tmp_path, kind):
    from arc_warp_train.datasets import load_image

    path, expected, tol = _image_case(kind, tmp_path / "im")
    with PIL_Image.open(path) as im:
        mode = im.mode
    image = load_image(str(path), BACKGROUND, 1)
    assert image.dtype == np.float32 and image.shape == (3, 4, 3), mode
    np.testing.assert_allclose(image, expected, atol=tol + 1e-7, err_msg=f"pillow mode {mode}")


def test_sixteen_bit_image_downscaled_by_box_filter(tmp_path):
    from arc_warp_train.datasets import load_image

    values = (np.arange(16).reshape(4, 4) * 4000).astype(np.uint16)
    _png16(tmp_path / "a.png", values, 0)
    expected = (values / 65535.0).reshape(2, 2, 2, 2).mean(axis=(1, 3))
    np.testing.assert_allclose(load_image(str(tmp_path / "a.png"), (0, 0, 0), 2),
                               _gray(expected), atol=1e-6)


@pytest.mark.parametrize("values,expected", [
    (np.array([[0.0, 2.0]], np.float32), r"float image with values in \[0, 2\]; float images "
     r"are read as values in \[0, 1\]: rescale it"),
    (np.array([[0.0, np.nan]], np.float32), "float image with NaN or infinite values"),
    (np.array([[0, 70000]], np.int32), "32-bit integer image with values in 0..70000"),
], ids=["float above 1", "float NaN", "integer above 16 bits"])
def test_images_out_of_range_are_refused_by_name(tmp_path, values, expected):
    from arc_warp_train.datasets import load_image

    path = tmp_path / "bad.tif"
    PIL_Image.fromarray(values).save(path)
    with pytest.raises(ValueError, match=rf"^{tmp_path}/bad.tif: {expected}"):
        load_image(str(path), (0, 0, 0), 1)


def test_float_image_within_rounding_of_the_range_is_clipped(tmp_path):
    from arc_warp_train.datasets import load_image

    path = tmp_path / "f.tif"
    PIL_Image.fromarray(np.array([[-1e-4, 1.0 + 1e-4]], np.float32)).save(path)
    np.testing.assert_array_equal(load_image(str(path), (0, 0, 0), 1), _gray([[0.0, 1.0]]))


def test_downscale_larger_than_the_image_names_option_and_file(tmp_path):
    _transforms_scene(tmp_path)
    with pytest.raises(ValueError) as info:
        load_dataset(str(tmp_path), downscale=64)
    message = str(info.value)
    assert "images/frame_0000" in message and f"--downscale 64 leaves no pixel of this " \
        f"{W}x{H} image; use a --downscale of at most {H}" in message, message


def test_unsupported_image_mode_names_the_file():
    from arc_warp_train.datasets import _image_values

    with pytest.raises(ValueError, match=r"^scan.tif: image mode La is not supported; save it"):
        _image_values(PIL_Image.new("La", (2, 2)), "scan.tif")
