"""Screen-space gradients (``means2d_grad``, ``means2d_absgrad``) against the float64 oracle.

Densification reads both, so each gets an independent reference: ``means2d_grads`` in
reference_splat.py differentiates a dense compositing in which every pixel holds its own
copy of each 2D mean, so autograd yields per-pixel gradients; their sum is dL/dmeans2d
and the sum of their absolute values is gsplat's absgrad.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the float64 reference needs torch")
wp = pytest.importorskip("warp")

import arc_warp  # noqa: E402

from reference_splat import composite, eval_colors, means2d_grads, project, render_reference  # noqa: E402
from test_splat_reference import cotangents, ref_camera, robust_scene, torch_params, warp_inputs  # noqa: E402

# Norm-wise relative, as GRAD_RTOL of test_splat_reference: the float32 backward of
# the same sums (hand-written, T / (1 - alpha) amplifies roundoff only near alpha=0.999).
RTOL = 1e-4


def oracle(scene, cot, bg):
    p = torch_params(scene)
    return means2d_grads(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                         ref_camera(scene), cot, scene.sh_degree, bg)


def render_screen_grads(scene, cot, bg, device, reduce):
    cam = arc_warp.Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                          world_to_camera=scene.world_to_camera, near=scene.near, far=scene.far)
    settings = arc_warp.RenderSettings(sh_degree=scene.sh_degree, background=bg, reduce=reduce, absgrad=True)
    x = warp_inputs(scene, device)
    out = arc_warp.render_gaussians(x["means"], x["quats"], x["scales"], x["opacities"], x["colors"], cam, settings)
    arc_warp.render_gaussians_backward(
        out,
        wp.array(cot["color"], dtype=wp.vec3, device=device),
        grad_alpha=wp.array(cot["alpha"], dtype=wp.float32, device=device),
        grad_depth=wp.array(cot["depth"], dtype=wp.float32, device=device),
        grad_expected_depth=wp.array(cot["expected_depth"], dtype=wp.float32, device=device))
    return out.means2d_grad.numpy().astype(np.float64), out.means2d_absgrad.numpy().astype(np.float64)


def assert_close(got, want, name):
    assert np.all(np.isfinite(got)), f"{name}: non-finite"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= RTOL, f"{name}: norm-wise relative error {err:.3e} > {RTOL:.0e}"


def check_scene(scene, rng, device, reduce):
    bg = (0.25, 0.5, 0.75)
    cot = cotangents(rng, scene)
    want_grad, want_abs = oracle(scene, cot, bg)
    # absgrad must carry information the signed sum does not (cancellation across pixels)
    assert np.linalg.norm(want_abs - np.abs(want_grad)) > 0.1 * np.linalg.norm(want_abs)
    got_grad, got_abs = render_screen_grads(scene, cot, bg, device, reduce)
    assert_close(got_grad, want_grad, "means2d_grad")
    assert_close(got_abs, want_abs, "means2d_absgrad")


def test_oracle_sums_to_autograd_of_means2d(rng, make_scene):
    # The per-pixel oracle summed over pixels equals plain autograd through means2d.
    scene = make_scene(rng, n=30, width=21, height=17, sh_degree=1)
    cot = cotangents(rng, scene)
    p = torch_params(scene)
    cam = ref_camera(scene)
    proj = project(p["means"], p["quats"], p["scales"], p["opacities"], cam)
    leaf = proj.means2d.detach().requires_grad_(True)
    proj.means2d = leaf
    ref = composite(proj, p["opacities"], eval_colors(p["means"], p["colors"], cam, 1), cam, (0.1, 0.2, 0.3))
    sum((getattr(ref, k) * torch.as_tensor(v, dtype=torch.float64)).sum() for k, v in cot.items()).backward()
    grad, absgrad = means2d_grads(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], cam, cot, 1,
                                  (0.1, 0.2, 0.3))
    np.testing.assert_allclose(grad, leaf.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert np.all(absgrad >= np.abs(grad) - 1e-12)


@pytest.mark.parametrize("reduce", ["atomic", "arc"])
def test_screen_space_grads_match_oracle(rng, device, reduce, cpu_blocks):
    if cpu_blocks:  # fibers emulate 256-lane blocks: a couple of tiles
        kw = dict(n=40, width=19, height=13, sh_degree=1, opacity_range=(0.3, 0.99), size_px_range=(1.0, 6.0))
    else:
        kw = dict(n=70, width=35, height=26, sh_degree=2, opacity_range=(0.3, 0.99), size_px_range=(1.0, 8.0))
    check_scene(robust_scene(rng, **kw), rng, device, reduce)


# One 16x16 tile under 280 faint Gaussians wider than the tile: its list holds more than
# one 256-entry batch, every pair is far above the 1/255 cut and transmittance stays
# above the 1e-4 floor, so the backward walks two batches for every pixel.
CROWDED = dict(n=280, width=16, height=16, sh_degree=None, opacity_range=(0.02, 0.04),
               size_px_range=(12.0, 24.0), border_px=0.0, depth_range=(1.0, 100.0))


def assert_crowded(scene):
    p = torch_params(scene)
    ref = render_reference(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], ref_camera(scene))
    assert int(ref.projection.visible.sum()) > 256
    alive = ref.alive & ref.valid
    last = torch.where(alive, torch.arange(alive.shape[1]), -1).amax(1)
    assert int(last.min()) >= 256, "every pixel's last contributor must lie past the first batch"


@pytest.mark.parametrize("reduce", ["atomic", "arc"])
def test_crowded_tile_screen_space_grads(rng, device, reduce, cpu_blocks):
    scene = robust_scene(rng, **CROWDED)
    assert_crowded(scene)
    check_scene(scene, rng, device, reduce)
