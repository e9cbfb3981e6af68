"""Camera models (ortho, fisheye) and lens distortion against the float64 references in
reference_cameras.py: forward images, hand-written gradients, finite differences, the
lens's cull radius, the distortion method's accuracy against the exact per-pixel image,
and the errors for bad cameras (host Camera and device-side DeviceCameras)."""

import math
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the float64 reference needs torch")
wp = pytest.importorskip("warp")

import arc_warp  # noqa: E402
from arc_warp import Camera, DeviceCameras, Distortion  # noqa: E402
from arc_warp._src.splat.camera_funcs import fisheye_terms  # noqa: E402

from conftest import random_scene  # noqa: E402
from reference_cameras import (  # noqa: E402
    ModelCamera, autodiff_jacobian, closed_form_jacobian, corner_radius, radial_limit, render,
    render_exact_distorted, undistort,
)
from reference_splat import fragile_fields, margins  # noqa: E402
from test_splat_reference import (  # noqa: E402
    OUTPUTS, PARAMS, arc_grads, arc_outputs, assert_forward_close, assert_grads_close, cotangents,
    torch_params, warp_inputs,
)

wp.config.log_level = wp.LOG_WARNING

# id: (model, OpenCV coefficients for the model, horizontal field of view in degrees)
CAMERAS = {
    "ortho": ("ortho", (), None),
    "fisheye": ("fisheye", (), 150.0),
    "fisheye_k": ("fisheye", (0.04, -0.012, 0.003, -0.0004), 150.0),
    "opencv": ("pinhole", (-0.22, 0.05, 0.0012, -0.0016), 80.0),
    "full_opencv": ("pinhole", (-0.18, 0.04, 0.001, -0.0012, 0.012, 0.08, -0.015, 0.006), 80.0),
}


def model_camera(base, model, coeffs, fov_x_deg) -> ModelCamera:
    """``base``'s pose and image with the model's focal length (float32-exact)."""
    if model == "ortho":
        focal = base.width / 2.5  # the image spans 2.5 world units
    elif model == "fisheye":
        focal = 0.5 * base.width / math.radians(0.5 * fov_x_deg)
    else:
        focal = 0.5 * base.width / math.tan(math.radians(0.5 * fov_x_deg))
    fx = round(focal * 8) / 8
    cam = ModelCamera(fx, fx * 1.0625, base.cx, base.cy, base.width, base.height, base.world_to_camera,
                      base.near, base.far, model, tuple(coeffs))
    if cam.distorted:
        r2, valid = radial_limit(model, coeffs, corner_radius(cam))
        assert valid
        cam = replace(cam, r2_max=r2)
    return cam


def model_scene(rng, camera_id, n=40, width=33, height=25, sh_degree=None, opacity_range=(0.05, 0.95),
                size_px_range=(0.5, 5.0), border_px=4.0, near_axis=3):
    """(scene, camera): conftest's random scene with its means re-placed so that they
    project (through the exact model) into the image widened by ``border_px``, at camera
    depths 1.5-5, ``near_axis`` of them within 2 px of the principal point; std-devs of
    ``size_px_range`` pixels there."""
    base = random_scene(rng, n=n, width=width, height=height, sh_degree=sh_degree, opacity_range=opacity_range,
                        size_px_range=size_px_range)
    cam = model_camera(base, *CAMERAS[camera_id])
    z = rng.uniform(1.5, 5.0, n)
    u = rng.uniform(-border_px, width + border_px, n)
    v = rng.uniform(-border_px, height + border_px, n)
    u[:near_axis] = cam.cx + rng.uniform(-2.0, 2.0, near_axis)
    v[:near_axis] = cam.cy + rng.uniform(-2.0, 2.0, near_axis)
    m = torch.tensor(np.stack([(u - cam.cx) / cam.fx, (v - cam.cy) / cam.fy], -1))
    nrm = (undistort(m, cam) if cam.distorted else m).numpy()
    if cam.model == "pinhole":
        pts, local = np.column_stack([nrm * z[:, None], z]), cam.fx / z
    elif cam.model == "ortho":
        pts, local = np.column_stack([nrm, z]), np.full(n, cam.fx)
    else:
        theta = np.linalg.norm(nrm, axis=-1)
        lateral = nrm / theta[:, None] * (z * np.tan(theta))[:, None]
        pts, local = np.column_stack([lateral, z]), cam.fx * np.cos(theta) / z
    view = cam.world_to_camera
    world = (pts - view[:3, 3]) @ np.linalg.inv(view[:3, :3]).T
    size_px = np.exp(rng.uniform(*np.log(size_px_range), size=(n, 3)))
    scene = replace(base, means=world.astype(np.float32),
                    scales=(size_px / local[:, None]).astype(np.float32))
    return scene, cam


def robust_model_scene(rng, camera_id, tries=40, **kwargs):
    """A scene whose float64 render is not within float32 noise of a discrete decision
    (see test_splat_reference.robust_scene)."""
    for _ in range(tries):
        scene, cam = model_scene(rng, camera_id, **kwargs)
        with torch.no_grad():
            p = torch_params(scene)
            ref = reference(scene, cam, p)
            if not fragile_fields(margins(ref, p["opacities"], cam)):
                return scene, cam
    raise RuntimeError(f"no robust scene in {tries} tries for {camera_id} {kwargs}")


def reference(scene, cam, params, background=(0.0, 0.0, 0.0), eps2d=0.3):
    return render(params["means"], params["quats"], params["scales"], params["opacities"], params["colors"],
                  cam, scene.sh_degree, background, eps2d)


def reference_grads(scene, cam, cot, background=(0.0, 0.0, 0.0)) -> dict:
    p = torch_params(scene, requires_grad=True)
    ref = reference(scene, cam, p, background)
    loss = sum((getattr(ref, k) * torch.tensor(cot[k], dtype=torch.float64)).sum() for k in OUTPUTS)
    loss.backward()
    return {k: p[k].grad.double().numpy() for k in PARAMS}


def arc_camera(cam: ModelCamera) -> Camera:
    return Camera(cam.fx, cam.fy, cam.cx, cam.cy, cam.width, cam.height, cam.world_to_camera, cam.near, cam.far,
                  model=cam.model, distortion=cam.distortion or None)


def render_arc(scene, cam, background=(0.0, 0.0, 0.0), eps2d=0.3, camera=None):
    settings = arc_warp.RenderSettings(sh_degree=scene.sh_degree, background=background, eps2d=eps2d)
    inputs = warp_inputs(scene, "cpu")
    return arc_warp.render_gaussians(inputs["means"], inputs["quats"], inputs["scales"], inputs["opacities"],
                                     inputs["colors"], arc_camera(cam) if camera is None else camera, settings)


def cosine(a, b) -> float:
    a, b = np.ravel(a), np.ravel(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- the reference on its own ----------------------------------------------------------


@pytest.mark.parametrize("model", ["pinhole", "ortho", "fisheye"])
def test_reference_closed_form_jacobians_match_autodiff(rng, model):
    # gsplat's closed forms (re-derived) against autodiff of the exact camera function,
    # over angles from near the axis to 80 degrees; float64 throughout.
    cam = ModelCamera(40.0, 44.0, 16.5, 12.5, 33, 25, np.eye(4), model=model)
    theta = np.concatenate([[1e-3], rng.uniform(0.0, np.radians(80.0), 30)])
    phi = rng.uniform(0.0, 2.0 * np.pi, theta.size)
    z = rng.uniform(0.5, 4.0, theta.size)
    t = torch.tensor(np.column_stack([z * np.tan(theta) * np.cos(phi), z * np.tan(theta) * np.sin(phi), z]))
    np.testing.assert_allclose(closed_form_jacobian(t, cam).numpy(), autodiff_jacobian(t, cam).detach().numpy(),
                               rtol=1e-9, atol=1e-9)


CULL_CASES = [
    ("pinhole", (-0.22, 0.05, 0.0, 0.0), True),
    ("pinhole", (-0.18, 0.04, 0.0, 0.0, 0.012, 0.08, -0.015, 0.006), True),
    ("pinhole", (0.1, 0.0, 0.0, 0.0), True),  # pincushion: never folds
    ("pinhole", (-0.1, 0.0, 0.0, 0.0), True),  # folds between the corner and 1.3x it: culls there
    ("pinhole", (0.0, 0.0, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0), True),  # a pole of rho beyond 1.3x the corner
    ("pinhole", (-0.3, 0.0, 0.0, 0.0), False),  # folds inside the image
    ("pinhole", (0.0, 0.0, 0.0, 0.0, 0.0, 1.5, 0.0, 0.0), False),  # rho's denominator pulls R back
    ("fisheye", (0.04, -0.012, 0.003, -0.0004), True),
    ("fisheye", (0.1, 0.0, 0.0, 0.0), True),
    ("fisheye", (-0.05, 0.0, 0.0, 0.0), True),  # folds beyond 90 degrees, which depth culls
    ("fisheye", (-0.3, 0.0, 0.0, 0.0), False),  # theta_d peaks at 0.70 rad, before the corner
]


@pytest.mark.parametrize("model,coeffs,valid", CULL_CASES)
def test_cull_radius_matches_dense_sampling(model, coeffs, valid):
    # Camera's exact polynomial roots against the reference's 400k-angle sampling; the
    # sampling's step limits the agreement to ~1e-4 relative (coarser in tan near 90 deg).
    fx = 24.0 if model == "pinhole" else 20.0  # corner radius 1.04 (46 deg) / 1.25 rad (72 deg)
    corner = corner_radius(ModelCamera(fx, fx, 20.0, 15.0, 40, 30, np.eye(4)))
    want, want_valid = radial_limit(model, coeffs, corner)
    assert want_valid == valid
    if not valid:
        with pytest.raises(ValueError, match="not monotonic inside the image"):
            Camera(fx, fx, 20.0, 15.0, 40, 30, model=model, distortion=coeffs)
        return
    got = Camera(fx, fx, 20.0, 15.0, 40, 30, model=model, distortion=coeffs).r2_max
    if math.isinf(want):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(want, rel=1e-4)


# --- renderer versus reference ---------------------------------------------------------


@pytest.mark.parametrize("camera_id", list(CAMERAS))
@pytest.mark.parametrize("sh_degree", [None, 2])
def test_forward_matches_reference(rng, camera_id, sh_degree):
    # Same tolerances as the pinhole (test_splat_reference): float32 roundoff of pixel
    # coordinates up to ~1e2 px. The SH view direction is from the camera centre for
    # every model, as gsplat (an orthographic camera's too).
    scene, cam = robust_model_scene(rng, camera_id, sh_degree=sh_degree)
    bg = (0.2, 0.4, 0.1)
    with torch.no_grad():
        ref = reference(scene, cam, torch_params(scene), bg)
    assert int(ref.projection.visible.sum()) >= 20
    assert_forward_close(arc_outputs(render_arc(scene, cam, bg)), ref)


@pytest.mark.parametrize("camera_id", list(CAMERAS))
def test_gradients_match_reference(rng, camera_id):
    # Norm-wise 1e-4 per parameter as the pinhole's GRAD_RTOL, which implies the bar's
    # cosine >= 0.9999 (checked too); the fisheye scenes put Gaussians near the axis,
    # where the kernel sums series, and out to ~85 degrees.
    scene, cam = robust_model_scene(rng, camera_id, sh_degree=1, opacity_range=(0.3, 0.99),
                                    size_px_range=(1.0, 6.0))
    bg = (0.25, 0.5, 0.75)
    cot = cotangents(rng, scene)
    want = reference_grads(scene, cam, cot, bg)
    got = arc_grads(render_arc(scene, cam, bg), cot, "cpu")
    assert_grads_close(got, want)
    for k in PARAMS:
        assert cosine(got[k], want[k]) >= 0.9999, k


@pytest.mark.parametrize("camera_id", list(CAMERAS))
def test_finite_differences_through_renderer(rng, camera_id):
    # Wide half-transparent Gaussians: every pixel sees each above the 1/255 cut and none
    # terminates, so the loss is smooth and float32 central differences of the renderer
    # itself check its hand-written gradient (means, quats, scales; opacities and colours
    # do not pass through the camera).
    scene, cam = model_scene(rng, camera_id, n=5, width=20, height=14, sh_degree=1, opacity_range=(0.3, 0.6),
                             size_px_range=(7.0, 12.0), border_px=-3.0, near_axis=2)
    cot = cotangents(rng, scene)
    got = arc_grads(render_arc(scene, cam), cot, "cpu")
    want = reference_grads(scene, cam, cot)

    def loss(s):
        out = render_arc(s, cam)
        return sum(float((getattr(out, k).numpy().astype(np.float64).reshape(cot[k].shape) * cot[k]).sum())
                   for k in OUTPUTS)

    def ref_loss_state(s):
        with torch.no_grad():
            ref = reference(s, cam, torch_params(s))
            value = sum(float((getattr(ref, k) * torch.tensor(cot[k], dtype=torch.float64)).sum())
                        for k in OUTPUTS)
        return value, bool(ref.valid.all()), bool(ref.alive.all())

    for name, comp in (("means", 0), ("means", 2), ("quats", 1), ("scales", 2)):
        g = want[name].reshape(len(scene.opacities), -1)
        gi = int(np.argmax(np.abs(g[:, comp])))
        x0 = float(getattr(scene, name)[gi, comp])
        # 1 % of the Gaussian's own scale (see test_splat_reference's FD test)
        h = 1e-2 * (float(scene.scales[gi].max()) if name == "means" else
                    float(np.linalg.norm(scene.quats[gi])) if name == "quats" else abs(x0))
        plus, minus = (_perturbed(scene, name, (gi, comp), x0 + d) for d in (h, -h))
        (rp, *sp), (rm, *sm) = ref_loss_state(plus), ref_loss_state(minus)
        assert sp == sm == [True, True], "the scene should have no discrete event nearby"
        step = float(np.float32(x0 + h)) - float(np.float32(x0 - h))
        fd = (loss(plus) - loss(minus)) / step
        ana, ref_ana = float(got[name].reshape(g.shape)[gi, comp]), float(g[gi, comp])
        truncation = abs((rp - rm) / step - ref_ana)
        assert abs(fd - ana) <= truncation + 5e-3 * abs(ana), (name, comp, fd, ana, truncation)


def _perturbed(scene, name, idx, value):
    arr = getattr(scene, name).copy()
    arr[idx] = value
    return replace(scene, **{name: arr})


# --- the distortion method against the exact lens ------------------------------------

# Bound of |alpha - exact alpha| per unit of a Gaussian's std-dev over the focal length
# (its angular size): the EWA linearisation at the mean misses the lens's curvature over
# the footprint, an error first order in sigma / f. Worst measured (sigma 1-4 px, f = 38 px
# for the OpenCV lenses, 24.5 px for the fisheye): opencv 0.47, full_opencv 0.54,
# fisheye_k 0.10; at the principal point, where the radial map has no curvature, it falls
# as (sigma / f)^2. A wrong Jacobian term breaks the bound by orders of magnitude.
EXACT_ALPHA_PER_SIGMA = 0.6


@pytest.mark.parametrize("camera_id", ["opencv", "full_opencv", "fisheye_k"])
def test_distortion_accuracy_against_exact_lens(rng, camera_id):
    # One Gaussian (opacity 0.9) at the image centre, halfway out and near the corner,
    # 1-4 px wide: the renderer's image against `render_exact_distorted` (each pixel
    # undistorted exactly, the undistorted splat evaluated there), eps2d = 0 in both.
    base, cam = model_scene(rng, camera_id, n=1, width=64, height=48, near_axis=0)
    worst = 0.0
    for fu, fv in ((0.5, 0.5), (0.75, 0.7), (0.92, 0.9)):
        m = torch.tensor([[(fu * cam.width - cam.cx) / cam.fx, (fv * cam.height - cam.cy) / cam.fy]])
        nrm = undistort(m.double(), cam).numpy()[0]
        z = 3.0
        theta = np.linalg.norm(nrm)
        if cam.model == "pinhole":
            pt, local = np.append(nrm * z, z), cam.fx / z
        else:
            pt, local = np.append(nrm / theta * z * np.tan(theta), z), cam.fx * np.cos(theta) / z
        view = cam.world_to_camera
        world = (pt - view[:3, 3]) @ np.linalg.inv(view[:3, :3]).T
        for sigma_px in (1.0, 2.0, 4.0):
            scene = replace(base, means=world[None].astype(np.float32), quats=np.float32([[1.0, 0.2, -0.3, 0.1]]),
                            scales=np.full((1, 3), sigma_px / local, np.float32), opacities=np.float32([0.9]),
                            colors=np.float32([[1.0, 1.0, 1.0]]))
            p = torch_params(scene)
            with torch.no_grad():
                exact = render_exact_distorted(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                                               cam, eps2d=0.0)
            got = render_arc(scene, cam, eps2d=0.0).alpha.numpy().astype(np.float64)
            err = np.abs(got - exact.alpha.numpy()).max() / (sigma_px / cam.fx)
            assert err <= EXACT_ALPHA_PER_SIGMA, ((fu, fv), sigma_px, err)
            worst = max(worst, err)
    assert worst > 0.02  # the curvature error is there: the exact reference differs


# --- camera records and their errors ---------------------------------------------------


def test_camera_rejects_bad_models_and_coefficients():
    with pytest.raises(ValueError, match="model must be one of"):
        Camera(20.0, 20.0, 10.0, 8.0, 20, 16, model="equirect")
    with pytest.raises(ValueError, match="has no lens distortion"):
        Camera(20.0, 20.0, 10.0, 8.0, 20, 16, model="ortho", distortion=(0.1, 0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="must be a finite number"):
        Camera(20.0, 20.0, 10.0, 8.0, 20, 16, distortion=(float("nan"), 0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="must be a finite number"):
        Distortion(k2=float("inf"))
    with pytest.raises(ValueError, match=r"expected 4 coefficients .*got 5"):
        Camera(20.0, 20.0, 10.0, 8.0, 20, 16, model="fisheye", distortion=(0.1, 0.0, 0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="fisheye camera's distortion has no p1"):
        Camera(20.0, 20.0, 10.0, 8.0, 20, 16, model="fisheye", distortion=Distortion(k1=0.1, p1=0.01))
    with pytest.raises(ValueError, match="not monotonic inside the image"):
        Camera(20.0, 20.0, 10.0, 8.0, 20, 16, distortion=(-0.5, 0.0, 0.0, 0.0))
    # OpenCV's order: 8 pinhole coefficients are k1, k2, p1, p2, k3, k4, k5, k6
    cam = Camera(20.0, 20.0, 10.0, 8.0, 20, 16, distortion=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8))
    assert cam.distortion == Distortion(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    assert Camera(20.0, 20.0, 10.0, 8.0, 20, 16, distortion=(0.0,) * 4).distortion is None


def _device_cameras(cam: Camera, coeffs=None, count=2, model=None):
    k = cam.K.astype(np.float32)
    vm = np.repeat(cam.world_to_camera[None].astype(np.float32), count, 0)
    return DeviceCameras(wp.array(vm, dtype=wp.mat44), wp.array(np.repeat(k[None], count, 0), dtype=wp.mat33),
                         cam.width, cam.height, cam.near, cam.far, model or cam.model,
                         None if coeffs is None else wp.array(np.float32(coeffs), dtype=wp.float32))


def test_device_cameras_match_host_cameras(rng):
    # The same lens from host coefficients and from a (C, 8) device array: identical
    # projection (the cull radius differs by float32 bisection, far from any centre).
    scene, ref_cam = model_scene(rng, "full_opencv", n=30)
    cam = arc_camera(ref_cam)
    host = render_arc(scene, ref_cam)
    devs = render_arc(scene, ref_cam, camera=_device_cameras(cam, [cam.distortion.coefficients(cam.model)] * 2))
    for out in devs:
        np.testing.assert_array_equal(out.radii.numpy(), host.radii.numpy())
        np.testing.assert_allclose(out.means2d.numpy(), host.means2d.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(out.color.numpy(), host.color.numpy(), rtol=0, atol=1e-6)
    fish_scene, fish_ref = model_scene(rng, "fisheye_k", n=30)
    fish = arc_camera(fish_ref)
    want = render_arc(fish_scene, fish_ref).color.numpy()
    coeffs = [fish.distortion.coefficients("fisheye")] * 2
    got = render_arc(fish_scene, fish_ref, camera=_device_cameras(fish, coeffs))[1]
    np.testing.assert_allclose(got.color.numpy(), want, rtol=0, atol=1e-6)
    ortho_scene, ortho_ref = model_scene(rng, "ortho", n=30)
    want = render_arc(ortho_scene, ortho_ref).color.numpy()
    got = render_arc(ortho_scene, ortho_ref, camera=_device_cameras(arc_camera(ortho_ref)))[0]
    np.testing.assert_allclose(got.color.numpy(), want, rtol=0, atol=1e-6)


def test_device_cameras_flag_bad_distortion(rng):
    scene, ref_cam = model_scene(rng, "opencv", n=10)
    cam = arc_camera(ref_cam)
    good = list(ref_cam.distortion)
    for bad in ([float("nan"), 0.0, 0.0, 0.0], [-0.6, 0.0, 0.0, 0.0]):  # NaN; folds inside the image
        with pytest.raises(ValueError, match=r"distortion coefficients \(DeviceCameras.distortion\) are non-finite "
                                             "or make the lens mapping non-monotonic"):
            render_arc(scene, ref_cam, camera=_device_cameras(cam, [good, bad]))
    with pytest.raises(ValueError, match=r"must have shape \(C=2, K\) with K in \(4,\)"):
        _device_cameras(cam, [good + [0.0]] * 2, model="fisheye")
    with pytest.raises(ValueError, match="has no lens distortion"):
        _device_cameras(cam, [good] * 2, model="ortho")
    with pytest.raises(ValueError, match="model must be one of"):
        _device_cameras(cam, None, model="fish-eye")


@pytest.mark.parametrize("model,coeffs,valid", CULL_CASES)
def test_device_cull_radius_matches_host(model, coeffs, valid):
    # camera_from_matrices samples 256 ray angles and bisects in float32; Camera finds the
    # polynomial's roots in float64: the same radius to float32 bisection accuracy.
    from arc_warp._src.camera import CAMERA_MODELS
    from arc_warp._src.splat.geometry_funcs import CameraParams
    from arc_warp._src.splat.project_kernels import camera_from_matrices

    fx = 24.0 if model == "pinhole" else 20.0
    cams = wp.zeros(1, dtype=CameraParams)
    bad = wp.zeros(3, dtype=wp.int32)
    k = np.float32([[[fx, 0.0, 20.0], [0.0, fx, 15.0], [0.0, 0.0, 1.0]]])
    wp.launch(camera_from_matrices, 1, [wp.array(np.eye(4, dtype=np.float32)[None], dtype=wp.mat44),
                                        wp.array(k, dtype=wp.mat33), 0, 40, 30, 0.01, 1e10,
                                        CAMERA_MODELS.index(model), wp.array(np.float32([coeffs])), cams, bad, 1, 2])
    assert list(bad.numpy()) == [0, 0, 0 if valid else 1]
    if valid:
        got = float(cams.numpy()[0]["r2_max"])
        want = Camera(fx, fx, 20.0, 15.0, 40, 30, model=model, distortion=coeffs).r2_max
        assert got == pytest.approx(want, rel=1e-5) or (math.isinf(want) and math.isinf(got))


def test_centres_beyond_the_cull_radius_are_culled(rng):
    # A pincushion lens (never folds) culls centres where the distorted radius passes 1.3x
    # the corner's; two Gaussians just inside and just outside that radius.
    cam = Camera(24.0, 24.0, 20.0, 15.0, 40, 30, distortion=(0.1, 0.0, 0.0, 0.0))
    r = math.sqrt(cam.r2_max)
    means = np.float32([[r * 0.995, 0.0, 1.0], [r * 1.005, 0.0, 1.0]])
    inputs = [wp.array(means, dtype=wp.vec3), wp.array(np.float32([[1, 0, 0, 0]] * 2), dtype=wp.vec4),
              wp.array(np.full((2, 3), 0.5, np.float32), dtype=wp.vec3), wp.array(np.float32([0.9, 0.9])),
              wp.array(np.ones((2, 3), np.float32), dtype=wp.vec3)]
    radii = arc_warp.render_gaussians(*inputs, cam).radii.numpy()
    assert radii[0, 0] > 0 and radii[1, 0] == 0


@wp.kernel(enable_backward=False)
def _fisheye_terms_kernel(points: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec4)):
    i = wp.tid()
    out[i] = fisheye_terms(points[i])


def test_fisheye_terms_on_both_sides_of_the_series_switch():
    # h = theta / r, c = (dh/dr) / r, e = (dc/dr) / r of the kernel (float32; Taylor series
    # below (r/z)^2 = 0.04, closed forms above) against float64 values: the series summed
    # to convergence for r/z <= 0.5, where the closed forms cancel, the closed forms beyond.
    t = np.concatenate([[0.0, 1e-4, 1e-2], np.linspace(0.05, 0.35, 13), [0.5, 1.0, 3.0, 20.0]])
    z = np.linspace(0.7, 3.0, t.size)
    pts = np.column_stack([0.6 * t * z, 0.8 * t * z, z]).astype(np.float32)
    out = wp.zeros(t.size, dtype=wp.vec4)
    wp.launch(_fisheye_terms_kernel, t.size, [wp.array(pts, dtype=wp.vec3), out])
    p = pts.astype(np.float64)
    r2 = p[:, 0] ** 2 + p[:, 1] ** 2
    zz = p[:, 2]
    t2 = r2 / zz ** 2
    j = np.arange(1, 60)[:, None]
    h_series = ((-1.0) ** (j - 1) * t2 ** (j - 1) / (2 * j - 1)).sum(0) / zz
    phi = ((-1.0) ** j * (2 * j / (2 * j + 1)) * t2 ** (j - 1)).sum(0)
    psi = ((-1.0) ** (j + 1) * (2 * (j + 1)) * (2 * j) / (2 * j + 3) * t2 ** (j - 1)).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(r2)
        l2 = r2 + zz ** 2
        h_closed = np.arctan2(r, zz) / r
        c_closed = (zz / l2 - h_closed) / r2
        e_closed = (-2 * zz / l2 ** 2 - 3 * c_closed) / r2
    small = t2 <= 0.25
    want = np.column_stack([np.where(small, h_series, h_closed), np.where(small, phi / zz ** 3, c_closed),
                            np.where(small, psi / zz ** 5, e_closed), 1.0 / (r2 + zz ** 2)])
    # Relative errors seen: < 3e-7 wherever the series run; the closed forms' cancellation
    # peaks at the switch, 2.6e-6 in c and 8e-5 in e (e enters the gradient times
    # (r/z)^2 <= 0.04 against c's terms, so 3e-6 there), falling as (r/z)^-4 beyond.
    got = out.numpy()
    np.testing.assert_allclose(got[:, [0, 1, 3]], want[:, [0, 1, 3]], rtol=5e-6, atol=0)
    series = t2 < 0.04  # camera_funcs.SERIES_T2
    np.testing.assert_allclose(got[series, 2], want[series, 2], rtol=1e-6, atol=0)
    np.testing.assert_allclose(got[~series, 2], want[~series, 2], rtol=2e-4, atol=0)


@pytest.mark.parametrize("antialiased", [False, True])
def test_pinhole_only_kernels_equal_the_generic_kernels(rng, antialiased):
    # project(..., pinhole_only=True) compiles the undistorted pinhole alone; on such a
    # camera it must give the generic kernels' bits, forward and backward.
    from arc_warp._src.splat.geometry_funcs import CameraParams, Splat2D, grad_vector
    from arc_warp._src.splat.project_kernels import make_project_bwd, make_project_fwd
    from arc_warp._src.splat.renderer import camera_params, is_plain_pinhole

    scene = random_scene(rng, n=50, width=37, height=29)
    cam = Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height, scene.world_to_camera)
    assert is_plain_pinhole([cam]) and not is_plain_pinhole([replace(cam, distortion=None, model="ortho")])
    inputs = warp_inputs(scene, "cpu")
    n = len(scene.opacities)
    cams = wp.array(camera_params([cam]), dtype=CameraParams, device="cpu")
    args = [inputs["means"], inputs["quats"], inputs["scales"], inputs["opacities"], cams, 0.3, 3, 2]
    raster = wp.array(rng.normal(size=(n, 10)).astype(np.float32), dtype=grad_vector(False))
    results = []
    for only in (False, True):
        outs = [wp.zeros(n, dtype=t) for t in (wp.vec2, Splat2D, wp.vec2i, wp.int32, wp.int32, wp.int32)]
        outs.append(wp.zeros(12, dtype=wp.int32))
        wp.launch(make_project_fwd(antialiased, pinhole_only=only), n, args + outs)
        grads = [wp.zeros(n, dtype=t) for t in (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3, wp.vec2)]
        wp.launch(make_project_bwd(0, False, antialiased, pinhole_only=only), n,
                  [inputs["means"], inputs["quats"], inputs["scales"], inputs["colors"], inputs["opacities"], args[4],
                   0.3, outs[2], outs[1], inputs["colors"], raster] + grads + [None, None])
        results.append([a.numpy() for a in outs + grads])
    assert (results[0][2][:, 0] > 0).sum() > 20
    for generic, only in zip(*results):
        assert generic.tobytes() == only.tobytes()
