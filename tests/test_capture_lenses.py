"""A capture's own camera through the loaders and the trainer: every COLMAP model the
renderer draws kept as its arc_warp model and distortion (points projected by arc_warp,
through the trainer's `render_views`, land where pycolmap's `img_from_cam` puts them),
transforms.json OPENCV / OPENCV_FISHEYE fields likewise, the models it cannot draw
undistorted with a note, a lens it refuses named with `--undistort`, a resume across a
changed camera handling refused, one camera model per batch, and the synthetic fisheye
capture trained natively beating undistort-then-train over the full frame."""

import dataclasses
import json
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer needs torch")
PIL_Image = pytest.importorskip("PIL.Image", reason="datasets need pillow (arc-warp[app])")
pycolmap = pytest.importorskip("pycolmap", reason="COLMAP models need pycolmap (arc-warp[colmap])")
pytest.importorskip("tqdm", reason="the trainer needs tqdm (arc-warp[app])")

import warp as wp  # noqa: E402

from arc_warp import Distortion  # noqa: E402
from arc_warp_train.checkpoint import check_checkpoint  # noqa: E402
from arc_warp_train.colmap import NATIVE_MODELS, NOT_NATIVE  # noqa: E402
from arc_warp_train.datasets import load_dataset  # noqa: E402
from arc_warp_train.trainer import TrainConfig, Trainer  # noqa: E402
from test_datasets import H, POINT, W, _colmap_scene, _rotation, arc_pixels  # noqa: E402

wp.config.log_level = wp.LOG_WARNING

# COLMAP parameters per model: pinholes of ~77 degrees across, fisheyes of ~160 degrees
# across the diagonal, every coefficient non-zero (so a coefficient mapped to the wrong
# field moves the points), all monotonic out to the image corners
PARAMS = {
    "SIMPLE_PINHOLE": (30.0, 24.5, 17.5),
    "PINHOLE": (30.0, 32.0, 24.5, 17.5),
    "SIMPLE_RADIAL": (30.0, 24.5, 17.5, -0.08),
    "RADIAL": (30.0, 24.5, 17.5, -0.08, 0.01),
    "OPENCV": (30.0, 32.0, 24.5, 17.5, -0.08, 0.01, 0.004, -0.006),
    "FULL_OPENCV": (30.0, 32.0, 24.5, 17.5, -0.08, 0.01, 0.004, -0.006, 0.003, 0.05, 0.01, 0.002),
    "SIMPLE_FISHEYE": (20.0, 24.5, 17.5),
    "FISHEYE": (20.0, 21.0, 24.5, 17.5),
    "SIMPLE_RADIAL_FISHEYE": (20.0, 24.5, 17.5, 0.04),
    "RADIAL_FISHEYE": (20.0, 24.5, 17.5, 0.04, -0.01),
    "OPENCV_FISHEYE": (20.0, 21.0, 24.5, 17.5, 0.04, -0.01, 0.002, -0.0003),
}
# float32 projection of points at depth 1..3 (the renderer's precision): well under 1e-3 px
PIXEL_TOLERANCE = 2e-3


def _pixel_points(camera, rng, count=40):
    """Camera-space points (M,3) at depths 1..3 whose pixels (pycolmap's) spread over the
    whole image, to within a pixel of its edges."""
    pixels = rng.uniform([1.0, 1.0], [camera.width - 1.0, camera.height - 1.0], size=(count, 2))
    rays = np.asarray(camera.cam_from_img(pixels), np.float64)  # (x/z, y/z)
    depth = rng.uniform(1.0, 3.0, size=(count, 1))
    return np.concatenate([rays, np.ones((count, 1))], axis=1) * depth


def _check_projection(view, camera, rng):
    """arc_warp draws camera points where pycolmap's `camera` (sized to the view) does."""
    points = _pixel_points(camera, rng)
    np.testing.assert_allclose(arc_pixels(view, points), camera.img_from_cam(points), atol=PIXEL_TOLERANCE)


def test_every_drawable_colmap_model_is_mapped():
    assert set(PARAMS) == set(NATIVE_MODELS)


@pytest.mark.parametrize("downscale", [1, 2])
@pytest.mark.parametrize("model", list(PARAMS))
def test_colmap_lens_kept_and_projected_as_pycolmap(tmp_path, rng, model, downscale):
    _colmap_scene(tmp_path, model, PARAMS[model], views=2)
    data = load_dataset(str(tmp_path), downscale=downscale)
    assert data.extras["undistort"] is False and "camera_notes" not in data.extras
    camera = pycolmap.Reconstruction(str(tmp_path / "sparse" / "0")).cameras[1]
    camera.rescale(W // downscale, H // downscale)
    for view in data.train + data.test:
        assert view.model == NATIVE_MODELS[model][0]
        assert (view.distortion is None) == (not NATIVE_MODELS[model][1])
        assert view.image.shape == (H // downscale, W // downscale, 3)  # the full frame, not resampled
        if downscale == 1:
            pixels = np.asarray(PIL_Image.open(tmp_path / "images" / view.name), np.float32) / 255.0
            np.testing.assert_array_equal(view.image, pixels)
        _check_projection(view, camera, rng)


@pytest.mark.parametrize("model,why", [("FOV", "arctangent"), ("THIN_PRISM_FISHEYE", "thin-prism")])
def test_colmap_models_the_renderer_cannot_draw_are_undistorted_with_a_note(tmp_path, model, why):
    params = {"FOV": (30.0, 30.0, 24.5, 17.5, 0.3),
              "THIN_PRISM_FISHEYE": (20.0, 20.0, 24.5, 17.5, 0.04, -0.01, 0.001, 0.001, 0.002, 0.0, 0.001, 0.001)}
    _colmap_scene(tmp_path, model, params[model], views=2)
    data = load_dataset(str(tmp_path))
    assert data.extras["camera_notes"] == [f"camera 1 ({model}) is undistorted on load: the renderer does not "
                                           f"draw {NOT_NATIVE[model]}"]
    assert why in NOT_NATIVE[model]
    for view in data.train + data.test:
        assert view.model == "pinhole" and view.distortion is None and view.image.shape != (H, W, 3)


# OpenCV k1 = -0.5 over a ~77 degree pinhole: r (1 - 0.5 r^2) peaks at r = 0.82, inside the
# corner's r = 1.0 (normalised): the image folds over itself there
FOLDING = (30.0, 32.0, 24.5, 17.5, -0.5, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("text", [False, True], ids=["binary", "text"])
def test_refused_colmap_lens_names_file_camera_and_undistort(tmp_path, text):
    _colmap_scene(tmp_path, "OPENCV", FOLDING, views=2, text=text)
    with pytest.raises(ValueError) as info:
        load_dataset(str(tmp_path))
    message = str(info.value)
    cameras = os.path.join(str(tmp_path), "sparse", "0", "cameras." + ("txt" if text else "bin"))
    assert message.startswith(f"{cameras}: camera 1 (OPENCV 48x36): the renderer cannot draw this lens")
    assert "not monotonic inside the image" in message and message.endswith(
        "; pass --undistort to resample its images to a pinhole camera instead")
    assert "\n" not in message
    data = load_dataset(str(tmp_path), undistort=True)  # the way out works
    assert data.train[0].model == "pinhole" and data.train[0].distortion is None


# ------------------------------------------------------------------ transforms.json


def _lens_transforms(root, camera_model, coeffs, frames=2):
    """nerfstudio-style transforms.json of `camera_model` with `coeffs` (top level), images
    of a dot drawn by pycolmap's camera of the same lens; returns that pycolmap camera."""
    os.makedirs(root / "images", exist_ok=True)
    colmap = {"OPENCV": "FULL_OPENCV", "OPENCV_FISHEYE": "OPENCV_FISHEYE"}[camera_model]
    cam = pycolmap.Camera.create_from_model_name(0, colmap, 1.0, W, H)
    order = {"FULL_OPENCV": ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"),
             "OPENCV_FISHEYE": ("k1", "k2", "k3", "k4")}[colmap]
    fl = (30.0, 32.0) if camera_model == "OPENCV" else (20.0, 21.0)
    cam.params = [*fl, 24.5, 17.5, *(coeffs.get(k, 0.0) for k in order)]
    meta = {"camera_model": camera_model, "fl_x": fl[0], "fl_y": fl[1], "cx": 24.5, "cy": 17.5, "w": W, "h": H,
            **coeffs, "frames": []}
    for i in range(frames):
        R, t = _rotation(0.03 * i), np.array([0.0, 0.02 * i, 0.0])
        w2c = np.eye(4)
        w2c[:3, :3], w2c[:3, 3] = R, t
        c2w = np.linalg.inv(w2c)
        c2w[:3, 1:3] *= -1.0  # OpenCV -> OpenGL axes
        name = f"images/frame_{i:05d}.png"
        uv = cam.img_from_cam((R @ POINT + t)[None])[0]
        image = np.zeros((H, W, 3), np.uint8)
        image[int(uv[1]), int(uv[0])] = 255
        PIL_Image.fromarray(image).save(root / name)
        meta["frames"].append({"file_path": name, "transform_matrix": c2w.tolist()})
    (root / "transforms.json").write_text(json.dumps(meta))
    return cam


@pytest.mark.parametrize("camera_model,coeffs,model", [
    ("OPENCV", {"k1": -0.08, "k2": 0.01, "k3": 0.003, "p1": 0.004, "p2": -0.006}, "pinhole"),
    ("OPENCV_FISHEYE", {"k1": 0.04, "k2": -0.01, "k3": 0.002, "k4": -0.0003}, "fisheye")])
def test_transforms_json_lens_fields_kept_and_projected_as_pycolmap(tmp_path, rng, camera_model, coeffs, model):
    camera = _lens_transforms(tmp_path, camera_model, coeffs)
    data = load_dataset(str(tmp_path))
    for view in data.train + data.test:
        assert view.model == model and view.distortion == Distortion(**coeffs)
        assert view.image.shape == (H, W, 3)
        _check_projection(view, camera, rng)
    for name in os.listdir(tmp_path / "images"):  # texture everywhere: any change of the lens shows
        PIL_Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(tmp_path / "images" / name)
    undistorted = load_dataset(str(tmp_path), undistort=True)  # as pycolmap undistorts the whole lens (k3 too)
    for view in undistorted.train + undistorted.test:
        assert view.model == "pinhole" and view.distortion is None
        bitmap = pycolmap.Bitmap.from_array(np.asarray(PIL_Image.open(tmp_path / view.name)))
        image, pinhole = pycolmap.undistort_image(pycolmap.UndistortCameraOptions(), bitmap, camera)
        np.testing.assert_allclose(view.K, pinhole.calibration_matrix())
        np.testing.assert_array_equal(view.image, np.asarray(image.to_array(), np.float32) / 255.0)


TRANSFORMS_ERRORS = {
    "refused lens": ({"camera_model": "OPENCV", "k1": -0.5},
                     "transforms.json: frame 0 (images/frame_00000.png): the renderer cannot draw this lens"),
    "nerfstudio's k4": ({"camera_model": "OPENCV", "k4": 0.01},
                        "'k4' with camera_model OPENCV is nerfstudio's r^8 radial term"),
    "spherical": ({"camera_model": "EQUIRECTANGULAR"}, "camera_model 'EQUIRECTANGULAR' is not supported"),
}


@pytest.mark.parametrize("case", list(TRANSFORMS_ERRORS))
def test_transforms_json_lens_errors_name_file_and_frame(tmp_path, case):
    _lens_transforms(tmp_path, "OPENCV", {"k1": -0.08})
    change, expected = TRANSFORMS_ERRORS[case]
    meta = json.loads((tmp_path / "transforms.json").read_text())
    (tmp_path / "transforms.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(ValueError) as info:
        load_dataset(str(tmp_path))
    assert expected in str(info.value) and "\n" not in str(info.value)
    if case == "refused lens":
        assert str(info.value).endswith("pass --undistort to resample its images to a pinhole camera instead")
        load_dataset(str(tmp_path), undistort=True)


# ------------------------------------------------------------------ trainer and resume


def _cfg(**kw):
    return TrainConfig(**{**dict(steps=4, sh_degree=0, init_points=30, eval_every=4, device="cpu",
                                 progress=False, cpu_threads=1), **kw})


@pytest.fixture(scope="module")
def fisheye_capture(tmp_path_factory):
    from arc_warp_train.synthetic import make_fisheye_capture

    root = tmp_path_factory.mktemp("fisheye")
    make_fisheye_capture(str(root), num_views=9, width=24, height=18, num_gaussians=200, device="cpu")
    return str(root)


def test_fisheye_capture_reads_back_as_rendered(fisheye_capture):
    """The synthetic capture's COLMAP model gives back the cameras its images were
    rendered with: rendering the scene through each loaded view reproduces the image (to
    8-bit rounding), poses, intrinsics and k1..k4 included."""
    from arc_warp_train.synthetic import fisheye_cameras, make_scene, render_rgba

    data = load_dataset(fisheye_capture)
    cams = fisheye_cameras(9, 24, 18)
    scene = make_scene(200, 0, "room")
    assert [v.name for v in data.test] == ["view_000.png", "view_008.png"]
    for view in data.train + data.test:
        cam = cams[int(view.name[5:8])]
        np.testing.assert_allclose(view.world_to_camera, cam.world_to_camera, atol=1e-12)
        assert view.model == "fisheye" and view.distortion == cam.distortion
        rgba = render_rgba(scene, view.camera(), "cpu")
        np.testing.assert_allclose(view.image, rgba[..., :3] * rgba[..., 3:], atol=0.5 / 255 + 1e-6)


def test_resume_refuses_a_changed_camera_handling(fisheye_capture, tmp_path):
    native, undistorted = (load_dataset(fisheye_capture, undistort=u) for u in (False, True))
    assert native.train[0].lens == "fisheye + distortion" and undistorted.train[0].lens == "pinhole"
    cfg = _cfg()
    for trained, resumed, hint in ((native, undistorted, "drop --undistort"),
                                   (undistorted, native, "pass --undistort")):
        state = Trainer(trained, cfg, tmp_path / "run").state_dict()
        check_checkpoint(state, "ckpt.pt", trained, cfg)  # the same handling resumes
        name = trained.train[0].name
        with pytest.raises(ValueError, match=re.escape(
                f"--resume ckpt.pt was trained on {name} as a {trained.train[0].lens} camera, this run loads "
                f"it as a {resumed.train[0].lens} camera; {hint} to resume it, or drop --resume")):
            check_checkpoint(state, "ckpt.pt", resumed, cfg)
    # checkpoints from before lenses were kept: every view was undistorted
    state = Trainer(undistorted, cfg, tmp_path / "run").state_dict()
    for key in ("lenses", "undistort"):
        del state["dataset"][key]
    check_checkpoint(state, "ckpt.pt", undistorted, cfg)
    with pytest.raises(ValueError, match="as a pinhole camera, this run loads it as a fisheye "
                                         r"\+ distortion camera; pass --undistort"):
        check_checkpoint(state, "ckpt.pt", native, cfg)


def test_resume_with_another_undistort_is_one_line_before_training(fisheye_capture, tmp_path, capsys):
    from arc_warp.cli import main

    args = ["--steps", "2", "--eval-every", "2", "--sh-degree", "0", "--device", "cpu", "--threads", "1",
            "--no-progress"]
    assert main(["train", fisheye_capture, "-o", str(tmp_path / "run")] + args) == 0
    capsys.readouterr()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["undistort"] is False and {v["camera"] for v in metrics["views"]} == {"fisheye + distortion"}
    ckpt = str(tmp_path / "run" / "checkpoint.pt")
    code = main(["train", fisheye_capture, "-o", str(tmp_path / "o"), "--resume", ckpt, "--undistort",
                 "--steps", "3"] + args[2:])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--resume {ckpt} was trained on" in err and "drop --undistort to resume it" in err


def test_batches_hold_one_camera_model(fisheye_capture, tmp_path):
    native = load_dataset(fisheye_capture)
    pinhole = dataclasses.replace(native.train[0], name="pinhole", model="pinhole", distortion=None)
    mixed = dataclasses.replace(native, train=native.train + [pinhole])
    Trainer(mixed, _cfg(batch_size=1), tmp_path / "a")  # a view per step: any mix
    with pytest.raises(ValueError, match=r"batch_size 2 > 1 needs training views of one camera model, got "
                                         r"\['fisheye', 'pinhole'\]; train with a batch of 1, or with --undistort"):
        Trainer(mixed, _cfg(batch_size=2), tmp_path / "b")


def test_batched_fisheye_step_renders_each_views_lens(fisheye_capture, tmp_path):
    """A batch renders each view through its own lens (one without distortion, one with
    another's): the images equal the views' single renders."""
    data = load_dataset(fisheye_capture)
    trainer = Trainer(data, _cfg(batch_size=2), tmp_path / "run")
    from arc_warp_train.trainer import ViewTensors

    lenses = (data.train[0].distortion, None, Distortion(k1=0.1, k2=-0.02))
    views = [ViewTensors.of(dataclasses.replace(v, distortion=lens), "cpu") for v, lens in zip(data.train, lenses)]
    with torch.no_grad():
        both = trainer.render(ViewTensors.cat(views), 0)[0]
        for i, view in enumerate(views):
            torch.testing.assert_close(both[i], trainer.render(view, 0)[0][0], rtol=0, atol=1e-6)
        flat = trainer.render(ViewTensors(views[0].image, views[0].viewmat, views[0].K), 0)[0][0]
    assert (flat - both[0]).abs().max() > 0.05  # the lens matters at this field of view


# ------------------------------------------------------------------ the fisheye study

# measured: native 16.83 dB, undistorted 15.34 dB over the full frame (seeds 1, 2: margins
# 0.96, 0.76 dB); the bar keeps half a dB of it
STUDY_MARGIN_DB = 0.5


@pytest.mark.slow
def test_native_fisheye_training_beats_undistort_then_train(tmp_path):
    """The issue's bar at a tiny size (~40 s on 2 CPU cores): 16 views of 32x24 pixels
    over a 180 degree diagonal, 150 steps per run; both runs scored on the held-out views
    through the native fisheye cameras, over the full frame."""
    from arc_warp_train.fisheye_study import run_study, study_config
    from arc_warp_train.synthetic import make_fisheye_capture

    make_fisheye_capture(str(tmp_path / "capture"), 16, 32, 24, 1000, 180.0, device="cpu")
    result = run_study(str(tmp_path / "capture"), str(tmp_path), study_config(150, progress=False),
                       log=lambda line: None)
    assert result["native"] > result["undistorted"] + STUDY_MARGIN_DB, result
