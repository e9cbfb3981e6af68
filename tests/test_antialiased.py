"""The antialiased 2D filter (Mip-Splatting; gsplat's rasterize_mode="antialiased", INRIA's
antialiasing=True) against an independent float64 reference: the dense reference renderer
with each opacity scaled by sqrt(det(S) / det(S + 0.3 I)), S the undilated 2D covariance,
differentiated by torch autograd."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the float64 reference uses torch autograd")


import arc_warp  # noqa: E402
from conftest import random_scene  # noqa: E402
from reference_splat import (  # noqa: E402
    composite, eval_colors, fragile_fields, margins, project,
)
from test_splat_reference import (  # noqa: E402
    OUTPUTS, PARAMS, arc_grads, arc_outputs, assert_forward_close, assert_grads_close,
    cotangents, ref_camera, torch_params, warp_inputs,
)

EPS2D = 0.3


def reference_aa(scene, params, background=(0.0, 0.0, 0.0)):
    """Float64 render with compensated opacities -> (RefRender, compensated opacities)."""
    cam = ref_camera(scene)
    p = params
    dilated = project(p["means"], p["quats"], p["scales"], p["opacities"], cam, EPS2D).cov2d
    s = dilated - EPS2D * torch.eye(2, dtype=dilated.dtype)
    det_orig = s[:, 0, 0] * s[:, 1, 1] - s[:, 0, 1] * s[:, 1, 0]
    det = dilated[:, 0, 0] * dilated[:, 1, 1] - dilated[:, 0, 1] * dilated[:, 1, 0]
    ratio = det_orig / det
    comp = torch.sqrt(torch.where(ratio > 0, ratio, torch.zeros_like(ratio)))
    opacities = p["opacities"] * comp
    proj = project(p["means"], p["quats"], p["scales"], opacities, cam, EPS2D)
    rgb = eval_colors(p["means"], p["colors"], cam, scene.sh_degree)
    return composite(proj, opacities, rgb, cam, background), opacities


def robust_aa_scene(rng, **kw):
    """Small Gaussians (the filter matters below a few pixels), away from discrete
    decisions in float32 (see test_splat_reference.robust_scene)."""
    for _ in range(40):
        scene = random_scene(rng, size_px_range=(0.3, 3.0), **kw)
        with torch.no_grad():
            ref, opac = reference_aa(scene, torch_params(scene))
            if not fragile_fields(margins(ref, opac, ref_camera(scene))):
                return scene
    raise RuntimeError("no robust scene")


def render_aa(scene, device, background=(0.0, 0.0, 0.0), reduce="arc", antialiased=True):
    cam = arc_warp.Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                          world_to_camera=scene.world_to_camera, near=scene.near, far=scene.far)
    settings = arc_warp.RenderSettings(sh_degree=scene.sh_degree, background=background,
                                       reduce=reduce, antialiased=antialiased)
    i = warp_inputs(scene, device)
    return arc_warp.render_gaussians(i["means"], i["quats"], i["scales"], i["opacities"],
                                     i["colors"], cam, settings)


@pytest.mark.parametrize("sh_degree", [None, 2])
def test_antialiased_forward_matches_reference(rng, device, sh_degree):
    scene = robust_aa_scene(rng, n=80, width=37, height=29, sh_degree=sh_degree)
    bg = (0.2, 0.4, 0.6)
    with torch.no_grad():
        ref, opac = reference_aa(scene, torch_params(scene), bg)
    # The filter changes this scene well beyond the tolerance: it is tested, not bypassed.
    comp = (opac / torch_params(scene)["opacities"]).numpy()
    assert comp.min() < 0.5
    out = render_aa(scene, device, bg)
    assert_forward_close(arc_outputs(out), ref)
    plain = render_aa(scene, device, bg, antialiased=False).color.numpy()
    assert np.abs(plain - ref.color.numpy()).max() > 1e-2


@pytest.mark.parametrize("reduce", ["atomic", "arc"])
def test_antialiased_gradients_match_reference(rng, device, reduce):
    scene = robust_aa_scene(rng, n=60, width=31, height=23, sh_degree=1,
                            opacity_range=(0.3, 0.99))
    bg = (0.25, 0.5, 0.75)
    cot = cotangents(rng, scene)
    p = torch_params(scene, requires_grad=True)
    ref, _ = reference_aa(scene, p, bg)
    loss = sum((getattr(ref, k) * torch.tensor(cot[k], dtype=torch.float64)).sum()
               for k in OUTPUTS)
    loss.backward()
    want = {k: p[k].grad.numpy() for k in PARAMS}
    out = render_aa(scene, device, bg, reduce=reduce)
    assert_grads_close(arc_grads(out, cot, device), want)
