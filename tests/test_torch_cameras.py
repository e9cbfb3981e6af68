"""Camera models through the torch API (gsplat's keywords): `rasterization(camera_model=
"ortho" | "fisheye", radial_coeffs=, tangential_coeffs=)` against the dense float64
reference of reference_cameras (images and gradients), host and device cameras alike,
and the gsplat keywords arc_warp accepts only at their defaults."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch API and the float64 reference need torch")

from arc_warp_torch import rasterization  # noqa: E402
from test_camera_models import CAMERAS, reference, robust_model_scene  # noqa: E402
from test_splat_reference import PARAMS, cotangents, torch_params  # noqa: E402


def _keywords(cam) -> dict:
    """rasterization's camera keywords for a reference ModelCamera: the model, and its
    OpenCV coefficients split into gsplat's radial / tangential tensors."""
    kw = {"camera_model": cam.model}
    coeffs = list(cam.distortion or ())
    if coeffs and cam.model == "fisheye":
        kw["radial_coeffs"] = torch.tensor([coeffs], dtype=torch.float32)
    elif coeffs:
        k1, k2, p1, p2, *rest = coeffs + [0.0] * (8 - len(coeffs))
        kw["radial_coeffs"] = torch.tensor([[k1, k2, *rest]], dtype=torch.float32)
        kw["tangential_coeffs"] = torch.tensor([[p1, p2]], dtype=torch.float32)
    return kw


def _render(scene, cam, params, background):
    viewmats = torch.tensor(cam.world_to_camera[None], dtype=torch.float32)
    ks = torch.tensor([[[cam.fx, 0.0, cam.cx], [0.0, cam.fy, cam.cy], [0.0, 0.0, 1.0]]], dtype=torch.float32)
    colors, alphas, _ = rasterization(*(params[k] for k in PARAMS), viewmats, ks, cam.width, cam.height,
                                      near_plane=cam.near, far_plane=cam.far, sh_degree=scene.sh_degree,
                                      backgrounds=torch.tensor(background, dtype=torch.float32), **_keywords(cam))
    return colors[0], alphas[0, ..., 0]


@pytest.mark.parametrize("camera_id", list(CAMERAS))
def test_rasterization_camera_models_match_the_reference(rng, camera_id):
    """Images within 1e-5 mean difference of gsplat's conventions composited densely in
    float64, and gradient cosine >= 0.9999 (the issue's bars), through the torch API."""
    scene, cam = robust_model_scene(rng, camera_id, sh_degree=1, opacity_range=(0.3, 0.99), size_px_range=(1.0, 6.0))
    background = (0.25, 0.5, 0.75)
    cot = cotangents(rng, scene)
    ref_params = torch_params(scene, requires_grad=True)
    ref = reference(scene, cam, ref_params, background)
    (ref.color * torch.tensor(cot["color"], dtype=torch.float64)).sum().backward()
    params = {k: torch.tensor(getattr(scene, k), requires_grad=True) for k in PARAMS}
    colors, alphas = _render(scene, cam, params, background)
    assert (colors.detach().double() - ref.color.detach()).abs().mean() < 1e-5
    assert (alphas.detach().double() - ref.alpha.detach()).abs().mean() < 1e-5
    (colors * torch.tensor(cot["color"], dtype=torch.float32)).sum().backward()
    for k in PARAMS:
        got, want = params[k].grad.double().flatten(), ref_params[k].grad.flatten()
        assert float(got @ want / (got.norm() * want.norm())) >= 0.9999, k


@pytest.mark.parametrize("keyword,value", [("radius_clip", 1.0), ("tile_size", 8), ("sparse_grad", True),
                                           ("distributed", True), ("segmented", True), ("with_eval3d", True),
                                           ("camera_model", "ftheta"), ("rolling_shutter", "ROLLING_TOP_TO_BOTTOM")])
def test_unsupported_gsplat_keywords_name_themselves(rng, keyword, value):
    scene, cam = robust_model_scene(rng, "fisheye", n=8)
    params = {k: torch.tensor(getattr(scene, k)) for k in PARAMS}
    viewmats = torch.tensor(cam.world_to_camera[None], dtype=torch.float32)
    ks = torch.tensor([[[cam.fx, 0.0, cam.cx], [0.0, cam.fy, cam.cy], [0.0, 0.0, 1.0]]], dtype=torch.float32)
    with pytest.raises(NotImplementedError, match=f"{keyword}="):
        rasterization(*params.values(), viewmats, ks, cam.width, cam.height, **{keyword: value})


def test_gsplat_defaults_and_no_effect_keywords_are_accepted(rng):
    scene, cam = robust_model_scene(rng, "fisheye", n=8)
    params = {k: torch.tensor(getattr(scene, k)) for k in PARAMS}
    viewmats = torch.tensor(cam.world_to_camera[None], dtype=torch.float32)
    ks = torch.tensor([[[cam.fx, 0.0, cam.cx], [0.0, cam.fy, cam.cy], [0.0, 0.0, 1.0]]], dtype=torch.float32)
    base = rasterization(*params.values(), viewmats, ks, cam.width, cam.height, camera_model="fisheye")[0]
    again = rasterization(*params.values(), viewmats, ks, cam.width, cam.height, 0.01, 1e10, 0.0, 0.3, None, False,
                          16, None, "RGB", False, False, "classic", 32, False, "fisheye", False, None, True, False)[0]
    np.testing.assert_array_equal(base.numpy(), again.numpy())
    with pytest.raises(ValueError, match="tangential"):
        rasterization(*params.values(), viewmats, ks, cam.width, cam.height, camera_model="fisheye",
                      radial_coeffs=torch.zeros(1, 4), tangential_coeffs=torch.zeros(1, 2))
