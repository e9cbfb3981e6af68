"""The INRIA drop-in behaves as diff_gaussian_rasterization where INRIA's train.py depends
on it: radii (its visibility filter and the max_radii2D > 20 pruning) and antialiasing.

The reference is INRIA's preprocess written plainly in float64 numpy from its definition:
depth > 0.2; 2D covariance J W Sigma W^T J^T + 0.3 I with tan(fov)-clamped J; radius
ceil(3 sqrt(max(l1, l2))) with l = mid +- sqrt(max(0.1, mid^2 - det)); culled when the
3-sigma square touches no 16 px tile (pixel centres at integers, C truncation)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the drop-in is a torch API")

from arc_warp_torch import rasterization  # noqa: E402
from arc_warp_torch.inria import GaussianRasterizer  # noqa: E402
from conftest import random_scene  # noqa: E402
from test_torch_plugin import cameras_of, inria_settings, params_of  # noqa: E402


def reference_radii(means, quats, scales, w2c, width, height, tanfovx, tanfovy):
    """-> (radii (N,) int64, fragile (N,) bool): fragile where float32 may round a ceil or
    a tile boundary the other way."""
    fx, fy = width / (2 * tanfovx), height / (2 * tanfovy)
    t = means.astype(np.float64) @ w2c[:3, :3].T + w2c[:3, 3]
    out, fragile = np.zeros(len(t), np.int64), np.zeros(len(t), bool)
    for i, (p, q, s) in enumerate(zip(t, quats.astype(np.float64), scales.astype(np.float64))):
        if p[2] <= 0.2:
            fragile[i] = abs(p[2] - 0.2) < 1e-5
            continue
        x = np.clip(p[0] / p[2], -1.3 * tanfovx, 1.3 * tanfovx) * p[2]
        y = np.clip(p[1] / p[2], -1.3 * tanfovy, 1.3 * tanfovy) * p[2]
        jac = np.array([[fx / p[2], 0, -fx * x / p[2] ** 2], [0, fy / p[2], -fy * y / p[2] ** 2]])
        w, a, b, c = q / np.linalg.norm(q)
        rot = np.array([[1 - 2 * (b * b + c * c), 2 * (a * b - w * c), 2 * (a * c + w * b)],
                        [2 * (a * b + w * c), 1 - 2 * (a * a + c * c), 2 * (b * c - w * a)],
                        [2 * (a * c - w * b), 2 * (b * c + w * a), 1 - 2 * (a * a + b * b)]])
        m = w2c[:3, :3] @ rot @ np.diag(s)
        cov = jac @ m @ m.T @ jac.T + 0.3 * np.eye(2)
        det = cov[0, 0] * cov[1, 1] - cov[0, 1] ** 2
        mid = 0.5 * (cov[0, 0] + cov[1, 1])
        three_sigma = 3 * np.sqrt(mid + np.sqrt(max(0.1, mid * mid - det)))
        r = np.ceil(three_sigma)
        u, v = fx * p[0] / p[2] + 0.5 * width - 0.5, fy * p[1] / p[2] + 0.5 * height - 0.5
        grid = ((width + 15) // 16, (height + 15) // 16)
        span = []
        for centre, g in ((u, grid[0]), (v, grid[1])):
            lo, hi = (centre - r) / 16, (centre + r + 15) / 16
            span.append(min(max(int(hi), 0), g) - min(max(int(lo), 0), g))
            fragile[i] |= min(abs(lo - round(lo)), abs(hi - round(hi))) < 1e-4
        fragile[i] |= abs(three_sigma - round(three_sigma)) < 1e-3
        out[i] = r if det != 0 and span[0] * span[1] > 0 else 0
    return out, fragile


def _import_shim(folder: str):
    """plugins/<folder>'s diff_gaussian_rasterization, imported as INRIA's train.py would,
    then removed from sys.path and sys.modules again."""
    import importlib
    import os
    import sys

    shim = os.path.join(os.path.dirname(__file__), "..", "plugins", folder)
    sys.path.insert(0, shim)
    try:
        return importlib.import_module("diff_gaussian_rasterization")
    finally:
        sys.path.remove(shim)
        sys.modules.pop("diff_gaussian_rasterization", None)


def _views(rng, n=300, cameras=4):
    """One cloud seen from `cameras` poses: Gaussians of 0.2..40 px, some behind the
    camera or off the image, so every culling rule and the > 20 px pruning take part."""
    base = random_scene(rng, n=n, width=40, height=30, sh_degree=0, size_px_range=(0.2, 40.0),
                        border_px=30.0, depth_range=(0.05, 6.0))
    # Isotropic ones: there INRIA's eigenvalue floor max(0.1, mid^2 - det) decides.
    base.scales[:60] = base.scales[:60, :1]
    views = []
    for k in range(cameras):
        ang = 0.15 * k
        turn = np.array([[np.cos(ang), 0, np.sin(ang)], [0, 1, 0], [-np.sin(ang), 0, np.cos(ang)]])
        w2c = base.world_to_camera.copy()
        w2c[:3, :3] = turn @ w2c[:3, :3]
        w2c[:3, 3] = turn @ w2c[:3, 3] + [0.1 * k, 0, 0]
        views.append(w2c.astype(np.float32).astype(np.float64))
    tx, ty = 0.5 * base.width / base.fx, 0.5 * base.height / base.fy
    return base, views, tx, ty


def _bookkeeping(radii_per_view, n):
    """INRIA train.py: visibility_filter = radii > 0; max_radii2D over the visible; denom
    (densification statistic count) += 1 where visible; prune where max_radii2D > 20."""
    max_radii2d, denom = torch.zeros(n), torch.zeros(n)
    for radii in radii_per_view:
        visibility_filter = radii > 0
        max_radii2d[visibility_filter] = torch.max(max_radii2d[visibility_filter],
                                                   radii[visibility_filter].float())
        denom[visibility_filter] += 1
    return max_radii2d, denom, max_radii2d > 20


def test_radii_and_densification_bookkeeping_match_inria(rng):
    base, views, tx, ty = _views(rng)
    p = params_of(base, requires_grad=False)
    ours, ref, fragile = [], [], np.zeros(len(base.means), bool)
    for w2c in views:
        settings = inria_settings(base.width, base.height, tx, ty, w2c, torch.zeros(3), 0)
        _, radii, _ = GaussianRasterizer(settings)(
            means3D=p["means"], means2D=torch.zeros_like(p["means"]),
            opacities=p["opacities"][:, None], shs=p["colors"], scales=p["scales"],
            rotations=p["quats"])
        assert radii.dtype == torch.int32
        want, frag = reference_radii(base.means, base.quats, base.scales, w2c, base.width,
                                     base.height, tx, ty)
        ours.append(radii)
        ref.append(torch.as_tensor(want))
        fragile |= frag
    keep = torch.as_tensor(~fragile)
    assert keep.float().mean() > 0.95
    for got, want in zip(ours, ref):
        np.testing.assert_array_equal(got[keep].numpy(), want[keep].numpy())
    a, b = _bookkeeping(ours, len(keep)), _bookkeeping(ref, len(keep))
    for name, x, y in zip(("max_radii2D", "denom", "prune"), a, b):
        assert torch.equal(x[keep], y[keep]), name
    # The scene exercises culling and pruning both ways.
    visible = torch.stack(ref) > 0
    assert visible.any() and not visible.all()
    assert a[2][keep].any() and not a[2][keep].all()


def test_antialiasing_renders_as_rasterization_antialiased(rng):
    scene = random_scene(rng, n=30, width=24, height=20, sh_degree=1, border_px=-2.0,
                         size_px_range=(0.3, 2.0))
    scene.cx, scene.cy = 0.5 * scene.width, 0.5 * scene.height
    tx, ty = 0.5 * scene.width / scene.fx, 0.5 * scene.height / scene.fy
    bg = torch.tensor([0.1, 0.2, 0.3])
    p = params_of(scene, requires_grad=False)
    images = {}
    for aa in (False, True):
        settings = inria_settings(scene.width, scene.height, tx, ty, scene.world_to_camera,
                                  bg, 1)._replace(antialiasing=aa)
        images[aa], _, _ = GaussianRasterizer(settings)(
            means3D=p["means"], means2D=torch.zeros_like(p["means"]),
            opacities=p["opacities"][:, None], shs=p["colors"], scales=p["scales"],
            rotations=p["quats"])
    viewmats, ks = cameras_of(scene)
    gs, _, _ = rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                             viewmats, ks, scene.width, scene.height, sh_degree=1,
                             near_plane=0.2, backgrounds=bg, rasterize_mode="antialiased")
    # Same renderer and camera up to float32 rounding of fx = W / (2 tanfovx).
    np.testing.assert_allclose(images[True].numpy(), gs[0].permute(2, 0, 1).numpy(), atol=1e-5)
    assert (images[True] - images[False]).abs().max() > 1e-2  # the filter did something
    with pytest.raises(ValueError, match="rasterize_mode"):
        rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                      viewmats, ks, scene.width, scene.height, rasterize_mode="mip")


def test_separate_dc_as_inria_current_train_py(rng):
    """INRIA's current render() passes dc=features_dc [N,1,3] and shs=features_rest [N,K,3]
    when its rasterizer exports SparseGaussianAdam: the image and each part's gradient are
    those of shs = cat(dc, rest). The shim package serves the same objects."""
    import importlib

    scene = random_scene(rng, n=40, width=24, height=20, sh_degree=2)
    tx, ty = 0.5 * scene.width / scene.fx, 0.5 * scene.height / scene.fy
    settings = inria_settings(scene.width, scene.height, tx, ty, scene.world_to_camera,
                              torch.tensor([0.1, 0.2, 0.3]), 2)
    p = params_of(scene, requires_grad=False)
    geo = dict(means3D=p["means"], means2D=torch.zeros_like(p["means"]),
               opacities=p["opacities"][:, None], scales=p["scales"], rotations=p["quats"])
    weights = torch.tensor(rng.normal(size=(3, scene.height, scene.width)), dtype=torch.float32)
    joint = p["colors"].clone().requires_grad_(True)
    want, _, _ = GaussianRasterizer(settings)(**geo, shs=joint)
    (want * weights).sum().backward()
    dc = p["colors"][:, :1].clone().requires_grad_(True)
    rest = p["colors"][:, 1:].clone().requires_grad_(True)
    got, _, _ = GaussianRasterizer(settings)(**geo, dc=dc, shs=rest)
    (got * weights).sum().backward()
    np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
    np.testing.assert_array_equal(dc.grad.numpy(), joint.grad[:, :1].numpy())
    np.testing.assert_array_equal(rest.grad.numpy(), joint.grad[:, 1:].numpy())
    with pytest.raises(ValueError, match="dc"):
        GaussianRasterizer(settings)(**geo, dc=dc[:, :, :2], shs=rest)

    module = _import_shim("inria_shim")
    assert module.GaussianRasterizer is GaussianRasterizer
    with pytest.raises(ImportError):
        importlib.import_module("diff_gaussian_rasterization._C")


def test_shim_2023_returns_color_and_radii(rng):
    """plugins/inria_shim_2023 serves INRIA's 2023 API: two outputs, the drop-in's first two,
    and no SparseGaussianAdam (so such a train.py keeps its torch Adam)."""
    module = _import_shim("inria_shim_2023")
    assert not hasattr(module, "SparseGaussianAdam")
    scene = random_scene(rng, n=30, width=20, height=16, sh_degree=1)
    tx, ty = 0.5 * scene.width / scene.fx, 0.5 * scene.height / scene.fy
    settings = inria_settings(scene.width, scene.height, tx, ty, scene.world_to_camera,
                              torch.zeros(3), 1)
    p = params_of(scene, requires_grad=False)
    kw = dict(means3D=p["means"], means2D=torch.zeros_like(p["means"]),
              opacities=p["opacities"][:, None], shs=p["colors"], scales=p["scales"],
              rotations=p["quats"])
    old = module.GaussianRasterizer(raster_settings=module.GaussianRasterizationSettings(
        *settings))(**kw)
    new = GaussianRasterizer(settings)(**kw)
    assert len(old) == 2
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_viewmatrix_stays_on_the_device(rng):
    """On CUDA the drop-in reads the viewmatrix on the device (DeviceCameras; radii in torch
    on the device): its image equals rasterization() given the same camera on the host,
    and its radii equal the float64 reference."""
    base, views, tx, ty = _views(rng, cameras=1)
    p = params_of(base, requires_grad=False, device="cuda")
    settings = inria_settings(base.width, base.height, tx, ty, views[0], torch.zeros(3, device="cuda"), 0)
    settings = settings._replace(viewmatrix=settings.viewmatrix.cuda())
    color, radii, _ = GaussianRasterizer(settings)(
        means3D=p["means"], means2D=torch.zeros_like(p["means"]), opacities=p["opacities"][:, None],
        shs=p["colors"], scales=p["scales"], rotations=p["quats"])
    w, h = base.width, base.height
    ks = torch.tensor([[[w / (2 * tx), 0.0, 0.5 * w], [0.0, h / (2 * ty), 0.5 * h], [0.0, 0.0, 1.0]]])
    viewmats = torch.tensor(views[0][None], dtype=torch.float32)
    ref, _, _ = rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], viewmats, ks,
                              w, h, near_plane=0.2)
    torch.testing.assert_close(color, ref[0].permute(2, 0, 1), atol=1e-5, rtol=1e-5)
    want, fragile = reference_radii(base.means, base.quats, base.scales, views[0], w, h, tx, ty)
    keep = ~fragile
    np.testing.assert_array_equal(radii.cpu().numpy()[keep], want[keep])
