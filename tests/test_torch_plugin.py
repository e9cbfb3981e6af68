"""arc_warp_torch: the torch.autograd bridge, the gsplat-like `rasterization` and the
INRIA drop-in, on small CPU scenes (a GPU test runs only where CUDA is available)."""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="arc_warp_torch needs torch")
wp = pytest.importorskip("warp")

from arc_warp import Camera, RenderSettings, render_gaussians, render_gaussians_backward  # noqa: E402
from arc_warp_torch import RenderContext, rasterization  # noqa: E402
from arc_warp_torch.inria import GaussianRasterizationSettings, GaussianRasterizer  # noqa: E402
from conftest import random_scene  # noqa: E402

PARAMS = ("means", "quats", "scales", "opacities", "colors")


def params_of(scene, requires_grad=True, device="cpu"):
    """Scene parameters as float32 leaf tensors."""
    return {k: torch.tensor(getattr(scene, k), device=device).requires_grad_(requires_grad)
            for k in PARAMS}


def cameras_of(*scenes, device="cpu"):
    """[C, 4, 4] viewmats and [C, 3, 3] Ks of scenes that share an image size."""
    vm = torch.tensor(np.stack([s.world_to_camera for s in scenes]), dtype=torch.float32,
                      device=device)
    ks = torch.tensor([[[s.fx, 0.0, s.cx], [0.0, s.fy, s.cy], [0.0, 0.0, 1.0]] for s in scenes],
                      dtype=torch.float32, device=device)
    return vm, ks


def render(p, scene, viewmats=None, ks=None, **kwargs):
    if viewmats is None:
        viewmats, ks = cameras_of(scene, device=p["means"].device)
    return rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                         viewmats, ks, scene.width, scene.height, **kwargs)


def warp_camera(scene):
    return Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                  world_to_camera=scene.world_to_camera, near=scene.near, far=scene.far)


def test_import_arc_warp_does_not_import_torch():
    code = "import sys, arc_warp; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "False"


def test_grads_equal_direct_warp_backward(rng):
    """The autograd bridge hands torch exactly what render_gaussians_backward computes."""
    scene = random_scene(rng, n=24, width=24, height=20, sh_degree=1)
    p = params_of(scene)
    colors, alphas, meta = render(p, scene, render_mode="RGB+D")
    meta["means2d"].retain_grad()  # gsplat habit; harmless on our leaf tensor
    g_color = torch.tensor(rng.normal(size=colors.shape), dtype=torch.float32)
    g_alpha = torch.tensor(rng.normal(size=alphas.shape), dtype=torch.float32)
    ((colors * g_color).sum() + (alphas * g_alpha).sum()).backward()

    arrays = {k: wp.array(getattr(scene, k), dtype=dt, device="cpu")
              for k, dt in zip(PARAMS, (wp.vec3, wp.vec4, wp.vec3, wp.float32, wp.vec3))}
    out = render_gaussians(*arrays.values(), warp_camera(scene),
                           RenderSettings(sh_degree=1, absgrad=True))
    wg = [wp.array(g[0].numpy(), dtype=dt, device="cpu")
          for g, dt in ((g_color[..., :3], wp.vec3), (g_alpha[..., 0], wp.float32),
                        (g_color[..., 3], wp.float32))]
    grads = render_gaussians_backward(out, wg[0], wg[1], wg[2])

    # Same kernels, same inputs, same launch order on the CPU: results must be identical.
    np.testing.assert_array_equal(colors[0, ..., :3].detach().numpy(), out.color.numpy())
    np.testing.assert_array_equal(colors[0, ..., 3].detach().numpy(), out.depth.numpy())
    np.testing.assert_array_equal(alphas[0, ..., 0].detach().numpy(), out.alpha.numpy())
    np.testing.assert_array_equal(meta["radii"][0].numpy(), out.radii.numpy())
    np.testing.assert_array_equal(meta["means2d"][0].detach().numpy(), out.means2d.numpy())
    for k in PARAMS:
        np.testing.assert_array_equal(p[k].grad.numpy(), getattr(grads, k).numpy(), err_msg=k)
    np.testing.assert_array_equal(meta["means2d"].grad[0].numpy(), out.means2d_grad.numpy())
    assert np.abs(out.means2d_grad.numpy()).max() > 0.0


REL_STEP = {"means": 2e-4, "scales": 3e-4}  # relative FD steps; 1e-3 for the others


def test_grads_match_finite_differences(rng):
    """Torch grads vs central differences of the whole torch -> Warp -> torch pipeline."""
    scene = random_scene(rng, n=6, width=20, height=16, sh_degree=1, opacity_range=(0.3, 0.8),
                         size_px_range=(1.5, 4.0), border_px=-3.0)
    p = params_of(scene)
    viewmats, ks = cameras_of(scene)
    bg = torch.tensor([0.2, 0.5, 0.1], requires_grad=True)
    w_rgb = torch.tensor(rng.uniform(-1, 1, size=(1, 16, 20, 4)), dtype=torch.float32)
    w_alpha = torch.tensor(rng.uniform(-1, 1, size=(1, 16, 20, 1)), dtype=torch.float32)

    def loss_fn(q, background):
        colors, alphas, _ = rasterization(q["means"], q["quats"], q["scales"], q["opacities"],
                                          q["colors"], viewmats, ks, 20, 16,
                                          backgrounds=background, render_mode="RGB+D")
        # float64 sum so that the loss adds no roundoff beyond the float32 images
        return (colors.double() * w_rgb).sum() + (alphas.double() * w_alpha).sum()

    loss_fn(p, bg).backward()

    def central_difference(flat, i, h):
        orig = flat[i].item()
        flat[i] = orig + h
        lp = loss_fn(p, bg).item()
        flat[i] = orig - h
        lm = loss_fn(p, bg).item()
        flat[i] = orig
        return (lp - lm) / (2 * h)

    with torch.no_grad():
        for name, x in list(p.items()) + [("bg", bg)]:
            flat, got = x.view(-1), x.grad.view(-1).double()
            kept = 0
            typical = flat.abs().mean().item()
            for i in range(flat.shape[0]):
                # Step relative to the value (floor: the tensor's mean magnitude). Means and
                # scales move Gaussian edges across pixels, so they take smaller steps to
                # meet fewer cuts (see below); float32 image rounding (~1e-6 on the loss)
                # still stays below ~1e-3 of each quotient.
                h = REL_STEP.get(name, 1e-3) * max(abs(flat[i].item()), typical)
                fd, fd_half = central_difference(flat, i, h), central_difference(flat, i, h / 2)
                # The renderer is only piecewise smooth (1/255 alpha cut, integer radii of
                # the support box): a step that moves a pixel across a cut adds a jump
                # ~1/255 / h to the quotient, which then changes with the step size. Such
                # coordinates say nothing about the gradient and are skipped.
                if abs(fd - fd_half) > 0.02 * abs(fd) + 2e-3:
                    continue
                kept += 1
                # 5 % + 3e-3: 2.5x the step-size agreement demanded above, plus float32
                # noise of ~1e-3 (observed errors over 12 random scenes: <= 2 % + 3e-3).
                assert abs(got[i] - fd) <= 0.05 * abs(fd) + 3e-3, \
                    f"{name}[{i}]: autograd {got[i]:.6g}, finite difference {fd:.6g}"
            # Jumps hit a few coordinates (at worst 28 % of the means over 12 random
            # scenes); most must still be checked or the test says nothing.
            assert kept >= 0.6 * flat.shape[0], f"{name}: only {kept}/{flat.shape[0]} smooth"


def test_adam_trains_rasterization(rng):
    """Adam through `rasterization` recovers a scene from two target views."""
    gt = random_scene(rng, n=16, width=24, height=20, opacity_range=(0.5, 0.9))
    viewmats, ks = cameras_of(gt, gt)
    viewmats[1, :3, 3] += torch.tensor([0.3, -0.2, 0.1])  # second view, shifted sideways
    with torch.no_grad():
        target, _, _ = render(params_of(gt, requires_grad=False), gt, viewmats, ks)

    means = torch.tensor(gt.means + rng.normal(scale=0.05, size=gt.means.shape).astype(np.float32),
                         requires_grad=True)
    log_scales = torch.tensor(np.log(gt.scales) + 0.3, requires_grad=True)
    quats = torch.tensor(rng.normal(size=gt.quats.shape).astype(np.float32), requires_grad=True)
    logit_op = torch.zeros(16, requires_grad=True)
    rgb = torch.full((16, 3), 0.5, requires_grad=True)
    opt = torch.optim.Adam([means, log_scales, quats, logit_op, rgb], lr=0.02)
    losses = []
    for _ in range(60):
        colors, _, _ = rasterization(means, quats, log_scales.exp(), torch.sigmoid(logit_op), rgb,
                                     viewmats, ks, 24, 20)
        loss = (colors - target).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # A working gradient path cuts the L1 error ~10x in 60 steps (0.07..0.12 of the start
    # over 6 random scenes); 0.25 leaves room while a broken path stays far above it.
    assert losses[-1] < 0.25 * losses[0], losses


def inria_settings(scene_w, scene_h, tanfovx, tanfovy, w2c, bg, sh_degree):
    """INRIA-style settings: transposed (column-major) view matrix, full projection, campos."""
    view_t = torch.tensor(w2c.T, dtype=torch.float32)
    znear, zfar = 0.01, 100.0
    proj = torch.zeros(4, 4)
    proj[0, 0], proj[1, 1] = 1.0 / tanfovx, 1.0 / tanfovy
    proj[3, 2], proj[2, 2], proj[2, 3] = 1.0, zfar / (zfar - znear), -zfar * znear / (zfar - znear)
    full = view_t @ proj.T
    campos = torch.linalg.inv(view_t)[3, :3]
    return GaussianRasterizationSettings(
        image_height=scene_h, image_width=scene_w, tanfovx=tanfovx, tanfovy=tanfovy, bg=bg,
        scale_modifier=1.0, viewmatrix=view_t, projmatrix=full, sh_degree=sh_degree,
        campos=campos, prefiltered=False, debug=False, antialiasing=False)


def inria_scene(rng, sh_degree=1, n=20):
    """A random scene re-targeted to INRIA intrinsics (principal point at the centre)."""
    scene = random_scene(rng, n=n, width=24, height=20, sh_degree=sh_degree, border_px=-2.0)
    tanfovx, tanfovy = 0.5 * scene.width / scene.fx, 0.5 * scene.height / scene.fy
    scene.cx, scene.cy = 0.5 * scene.width, 0.5 * scene.height
    return scene, tanfovx, tanfovy


def test_inria_matches_rasterization(rng):
    scene, tx, ty = inria_scene(rng)
    bg = torch.tensor([0.1, 0.2, 0.3])
    settings = inria_settings(scene.width, scene.height, tx, ty, scene.world_to_camera, bg, 1)
    p = params_of(scene)
    screen = torch.zeros(scene.means.shape, requires_grad=True) + 0  # INRIA's pattern
    screen.retain_grad()
    color, radii, invdepth = GaussianRasterizer(settings)(
        means3D=p["means"], means2D=screen, opacities=p["opacities"][:, None], shs=p["colors"],
        scales=p["scales"], rotations=p["quats"])
    w_color = torch.tensor(rng.normal(size=color.shape), dtype=torch.float32)
    (color * w_color).sum().backward()

    q = params_of(scene)
    viewmats, ks = cameras_of(scene)
    rgba, alphas, meta = rasterization(q["means"], q["quats"], q["scales"], q["opacities"],
                                       q["colors"], viewmats, ks, scene.width, scene.height,
                                       sh_degree=1, near_plane=0.2, backgrounds=bg,
                                       render_mode="RGB+ED")
    (rgba[0, ..., :3].permute(2, 0, 1) * w_color).sum().backward()

    assert color.shape == (3, scene.height, scene.width)
    assert radii.shape == (scene.means.shape[0],) and invdepth.shape == (1, scene.height, scene.width)
    # Same renderer and camera, so equal up to float32 rounding of fx = W / (2 tanfovx)
    # (1 ulp of fx moves a mean by ~1e-5 px, the image by < 1e-5).
    np.testing.assert_allclose(color.detach().numpy(),
                               rgba[0, ..., :3].permute(2, 0, 1).detach().numpy(), atol=1e-5)
    # radii are INRIA's (tests/test_inria_fidelity.py); every Gaussian we draw is visible.
    assert torch.all(radii[(meta["radii"][0] > 0).all(-1)] > 0)
    ed, a = rgba[0, ..., 3].detach(), alphas[0, ..., 0].detach()
    np.testing.assert_allclose(invdepth[0].detach().numpy(),
                               torch.where(ed > 0, a / ed.clamp_min(1e-12), 0.0).numpy(),
                               rtol=1e-5, atol=1e-7)  # float32 rounding of two formulas
    # means2D.grad: pixel gradient scaled to INRIA's NDC units, third column zero.
    scale = torch.tensor([0.5 * scene.width, 0.5 * scene.height])
    np.testing.assert_allclose(screen.grad[:, :2].numpy(), (meta["means2d"].grad[0] * scale).numpy(),
                               rtol=1e-5, atol=1e-6)  # see the image tolerance above
    assert torch.all(screen.grad[:, 2] == 0)
    behind = torch.tensor(np.linalg.inv(scene.world_to_camera)[:3, 3], dtype=torch.float32)
    visible = GaussianRasterizer(settings).markVisible(torch.cat([p["means"].detach(), behind[None]]))
    assert visible[:-1].all() and not visible[-1]  # scene depths 1.5..5; the camera centre: 0
    for k, name in (("means", "means"), ("colors", "colors")):
        np.testing.assert_allclose(p[k].grad.numpy(), q[name].grad.numpy(), rtol=1e-4, atol=1e-5)


def test_inria_training_loop(rng):
    """The INRIA API swapped into a minimal 3DGS-style loop: loss falls, means2D.grad fills."""
    gt, tx, ty = inria_scene(rng, sh_degree=1, n=16)
    bg = torch.zeros(3)
    settings = inria_settings(gt.width, gt.height, tx, ty, gt.world_to_camera, bg, 1)
    rasterizer = GaussianRasterizer(raster_settings=settings)
    g = params_of(gt, requires_grad=False)
    with torch.no_grad():
        target, _, _ = rasterizer(means3D=g["means"], means2D=torch.zeros_like(g["means"]),
                                  opacities=g["opacities"][:, None], shs=g["colors"],
                                  scales=g["scales"], rotations=g["quats"])

    xyz = torch.tensor(gt.means + rng.normal(scale=0.05, size=gt.means.shape).astype(np.float32),
                       requires_grad=True)
    features = torch.zeros(16, 4, 3)
    features[:, 0] = 0.3
    features.requires_grad_(True)
    scaling = torch.tensor(np.log(gt.scales) + 0.2, requires_grad=True)
    rotation = torch.tensor(gt.quats, requires_grad=True)
    opacity = torch.zeros(16, 1, requires_grad=True)
    opt = torch.optim.Adam([xyz, features, scaling, rotation, opacity], lr=0.02)
    grad_accum = torch.zeros(16)
    losses = []
    for _ in range(50):
        screenspace = torch.zeros_like(xyz, requires_grad=True) + 0
        screenspace.retain_grad()
        image, radii, _ = rasterizer(means3D=xyz, means2D=screenspace,
                                     opacities=torch.sigmoid(opacity), shs=features,
                                     colors_precomp=None, scales=scaling.exp(),
                                     rotations=torch.nn.functional.normalize(rotation),
                                     cov3D_precomp=None)
        loss = (image - target).abs().mean()
        opt.zero_grad()
        loss.backward()
        visible = radii > 0
        grad_accum[visible] += screenspace.grad[visible, :2].norm(dim=-1)
        assert torch.all(screenspace.grad[~visible] == 0)
        opt.step()
        losses.append(loss.item())
    # Same bar as the rasterization training test (observed 0.06..0.09 of the start).
    assert losses[-1] < 0.25 * losses[0], losses
    assert grad_accum.max() > 0.0


@pytest.mark.parametrize("mode, channels", [("RGB", 3), ("D", 1), ("ED", 1), ("RGB+D", 4),
                                            ("RGB+ED", 4)])
def test_batched_cameras_shapes(rng, mode, channels):
    a = random_scene(rng, n=12, width=20, height=14, sh_degree=2)
    b = random_scene(rng, n=12, width=20, height=14)
    p = params_of(a)
    viewmats, ks = cameras_of(a, b)
    colors, alphas, meta = render(p, a, viewmats, ks, render_mode=mode,
                                  backgrounds=torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    assert colors.shape == (2, 14, 20, channels) and colors.dtype == torch.float32
    assert alphas.shape == (2, 14, 20, 1)
    assert meta["means2d"].shape == (2, 12, 2) and meta["radii"].shape == (2, 12, 2)
    assert (meta["width"], meta["height"], meta["n_cameras"]) == (20, 14, 2)
    # Each camera of the batch is the render of that camera alone.
    for i in range(2):
        single, _, m1 = render(p, a, viewmats[i:i + 1], ks[i:i + 1], render_mode=mode,
                               backgrounds=torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])[i])
        np.testing.assert_array_equal(single[0].detach().numpy(), colors[i].detach().numpy())
        np.testing.assert_array_equal(m1["radii"][0].numpy(), meta["radii"][i].numpy())
    colors.sum().backward()
    assert meta["means2d"].grad.shape == (2, 12, 2)


def test_grad_options(rng):
    """Only requested grads; no_grad renders carry no graph; float64 in, float64 grads out;
    absgrad fills meta["means2d"].absgrad."""
    scene = random_scene(rng, n=10, width=16, height=12)
    full = params_of(scene)
    colors, _, _ = render(full, scene)
    colors.sum().backward()

    p = params_of(scene, requires_grad=False)
    p["colors"] = p["colors"].double().requires_grad_(True)
    colors, _, meta = render(p, scene, absgrad=True)
    colors.sum().backward()
    assert all(p[k].grad is None for k in PARAMS if k != "colors")
    assert p["colors"].grad.dtype == torch.float64
    np.testing.assert_array_equal(p["colors"].grad.float().numpy(), full["colors"].grad.numpy())
    absgrad = meta["means2d"].absgrad
    assert absgrad.shape == (1, 10, 2)
    assert torch.all(absgrad >= meta["means2d"].grad.abs() - 1e-6)  # |sum| <= sum |.|
    assert absgrad.max() > 0

    with torch.no_grad():
        colors, alphas, meta = render(full, scene)
    assert colors.grad_fn is None and not meta["means2d"].requires_grad

    # `reduce` reaches the renderer: "floor" (timing only) issues no rasteriser atomics.
    floor = params_of(scene)
    colors, _, _ = render(floor, scene, reduce="floor")
    colors.sum().backward()
    assert torch.all(floor["colors"].grad == 0) and full["colors"].grad.abs().max() > 0


def test_reused_context_follows_shapes_and_leaves(rng):
    """One RenderContext across renders whose sizes and leaf patterns change: its kept
    gradient layouts never hand a render another's shapes, gradients equal those of a
    fresh context, and computed inputs' gradients lie in their own buffer, apart from the
    leaves' .grad (so the activations' backward frees them)."""
    from arc_warp_torch import RenderContext

    shared = RenderContext("cpu")
    for n, computed in ((12, False), (12, True), (17, True), (12, False)):
        a, b = random_scene(rng, n=n, width=16, height=12), random_scene(rng, n=n, width=16, height=12)
        viewmats, ks = cameras_of(a, b)
        grads = []
        for context in (shared, RenderContext("cpu")):
            p = params_of(a)
            inputs = dict(p)
            seen = {}
            if computed:  # non-leaf quats, scales and opacities, as after activations
                for k in ("quats", "scales", "opacities"):
                    inputs[k] = p[k] * 1.0
                    inputs[k].register_hook(lambda g, k=k: seen.__setitem__(k, g))
            colors, alphas, meta = render(inputs, a, viewmats, ks, context=context)
            (colors.square().sum() + alphas.sum()).backward()
            assert meta["means2d"].grad.shape == (2, n, 2)
            for k, g in seen.items():
                assert g.shape == p[k].shape
                assert g.untyped_storage().data_ptr() != p["means"].grad.untyped_storage().data_ptr(), k
            grads.append([p[k].grad for k in PARAMS] + [meta["means2d"].grad])
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_double_backward_raises(rng):
    scene = random_scene(rng, n=8, width=16, height=12)
    p = params_of(scene)
    colors, _, _ = render(p, scene)
    (g,) = torch.autograd.grad((colors ** 2).sum(), p["means"], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


def test_bad_inputs_raise(rng):
    scene = random_scene(rng, n=8, width=16, height=12, sh_degree=1)
    p = params_of(scene, requires_grad=False)
    vm, ks = cameras_of(scene)

    def call(**over):
        args = dict(p, viewmats=vm, Ks=ks, width=16, height=12)
        args.update(over)
        return rasterization(**args)

    cases = [
        (ValueError, "means: expected shape", dict(means=p["means"][:, :2])),
        (TypeError, "quats: expected a floating", dict(quats=p["quats"].int())),
        (ValueError, "opacities: expected shape", dict(opacities=p["opacities"][:, None])),
        (ValueError, "scales: expected shape", dict(scales=p["scales"][:5])),
        (ValueError, "K >= 9", dict(colors=p["colors"], sh_degree=2)),
        (ValueError, "K = \\(d\\+1\\)\\^2", dict(colors=p["colors"][:, :3])),
        (ValueError, "sh_degree", dict(colors=p["colors"][:, 0], sh_degree=1)),
        (ValueError, "device", dict(scales=p["scales"].to("meta"))),
        (ValueError, "cpu or cuda", dict(means=p["means"].to("meta"))),
        (ValueError, "viewmats", dict(viewmats=vm[0])),
        (ValueError, "Ks", dict(Ks=ks.repeat(2, 1, 1))),
        (ValueError, "camera gradients", dict(viewmats=vm.clone().requires_grad_(True))),
        (ValueError, "render_mode", dict(render_mode="RGBD")),
        (ValueError, "width", dict(width=0)),
        (ValueError, "backgrounds", dict(backgrounds=torch.zeros(2))),
        (TypeError, "torch.Tensor", dict(means=scene.means)),
    ]
    for exc, match, over in cases:
        with pytest.raises(exc, match=match):
            call(**over)

    settings = inria_settings(16, 12, 0.5, 0.4, scene.world_to_camera, torch.zeros(3), 1)
    rast = GaussianRasterizer(settings)
    base = dict(means3D=p["means"], means2D=torch.zeros_like(p["means"]),
                opacities=p["opacities"], scales=p["scales"], rotations=p["quats"])
    with pytest.raises(NotImplementedError, match="scales"):
        rast(**dict(base, scales=None, rotations=None), shs=p["colors"],
             cov3D_precomp=torch.zeros(8, 6))
    with pytest.raises(ValueError, match="exactly one"):
        rast(**base, shs=p["colors"], colors_precomp=p["colors"][:, 0])
    with pytest.raises(ValueError, match="viewmatrix"):
        GaussianRasterizer(settings._replace(viewmatrix=torch.eye(3)))(**base, shs=p["colors"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_side_stream_matches_default_stream(rng):
    """CUDA tensors, zero-copy, launched on a non-default torch stream, agree with the same
    render on the default stream (the CPU path is covered by every other test here), over
    repeated steps on that stream."""
    from arc_warp_torch import RenderContext

    scene = random_scene(rng, n=64, width=48, height=32, sh_degree=2)
    results = []
    for use_side_stream in (False, True):
        gpu = params_of(scene, device="cuda")
        context = RenderContext("cuda")
        stream = torch.cuda.Stream() if use_side_stream else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            viewmats, ks = cameras_of(scene, device="cuda")
            for _ in range(5):
                for k in PARAMS:
                    gpu[k].grad = None
                colors_g, _, meta_g = render(gpu, scene, viewmats, ks, context=context)
                colors_g.square().sum().backward()
        torch.cuda.synchronize()
        results.append((colors_g.detach().cpu().numpy(), meta_g["radii"].cpu().numpy(),
                        {k: gpu[k].grad.cpu().numpy() for k in PARAMS}))
    (c0, r0, g0), (c1, r1, g1) = results
    np.testing.assert_array_equal(c1, c0)
    np.testing.assert_array_equal(r1, r0)
    for k in PARAMS:
        # Atomics land in another order: float32 reassociation only, which is small
        # against the gradient's scale but not against entries that nearly cancel.
        np.testing.assert_allclose(g1[k], g0[k], rtol=0, atol=1e-4 * np.abs(g0[k]).max(), err_msg=k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_cameras_stay_on_the_device(rng):
    """viewmats/Ks on the GPU are read there (DeviceCameras, no host copy) and render like
    the same cameras given on the host; a NaN in them raises ValueError (from the backward
    of a render with grad, whose checks are deferred there, or from the render)."""
    scene = random_scene(rng, n=64, width=48, height=32, sh_degree=2)
    results = []
    for where in ("cuda", "cpu"):
        gpu = params_of(scene, device="cuda")
        viewmats, ks = cameras_of(scene, device=where)
        colors_g, _, _ = render(gpu, scene, viewmats, ks)
        colors_g.square().sum().backward()
        results.append((colors_g.detach().cpu().numpy(), gpu["means"].grad.cpu().numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-3, atol=1e-4 * np.abs(results[1][1]).max())
    viewmats, ks = cameras_of(scene, device="cuda")
    viewmats[0, 0, 0] = float("nan")
    colors, _, _ = render(params_of(scene, device="cuda"), scene, viewmats, ks)  # queued, not waited for
    colors.sum().backward()
    with pytest.raises(ValueError, match="viewmat/K.*previous render"):
        render(params_of(scene, device="cuda"), scene)
    with pytest.raises(ValueError, match="viewmat/K"), torch.no_grad():
        render(params_of(scene, device="cuda"), scene, viewmats, ks, context=RenderContext("cuda", check=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_cameras_of_the_last_call_are_rechecked_where_they_can_change(rng):
    """The same viewmats/Ks tensors as the last call skip their checks, but not past what
    can change behind the same object: values changed in place render the new values,
    and a tensor that now requires grad raises."""
    scene = random_scene(rng, n=64, width=48, height=32, sh_degree=2)
    p = params_of(scene, device="cuda")
    viewmats, ks = cameras_of(scene, device="cuda")
    first, _, _ = render(p, scene, viewmats, ks)
    first = first.detach().clone()
    moved = viewmats.clone()
    moved[0, 0, 3] += 0.05
    want, _, _ = render(p, scene, moved, ks)
    viewmats.copy_(moved)  # in place: same object, same memory
    got, _, _ = render(p, scene, viewmats, ks)
    assert (got - first).abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="camera gradients"):
        render(p, scene, viewmats.requires_grad_(True), ks)


def test_rgb_mode_allocates_and_writes_no_depth_images(rng):
    """render_mode="RGB" renders the same colours, alphas and gradients as "RGB+D" (whose
    depth channel is the depth sum), but its colours' block holds 3 planes, not 5 (with
    depth and expected depth): the depth images are neither allocated nor written; the
    alpha image is not in that block (it shares the projected means' allocation)."""
    scene = random_scene(rng, n=30, width=24, height=18, sh_degree=1)
    got = {}
    for mode in ("RGB", "RGB+D"):
        p = params_of(scene)
        colors, alphas, _ = render(p, scene, render_mode=mode)
        weights = torch.linspace(0.0, 1.0, 3 * scene.height * scene.width).view(1, scene.height, scene.width, 3)
        ((colors[..., :3] * weights).sum() + alphas.sum()).backward()
        got[mode] = colors.detach(), alphas.detach(), {k: p[k].grad for k in PARAMS}, colors
    rgb, rgbd = got["RGB"], got["RGB+D"]
    assert (rgbd[0][..., 3] > 0).any()
    torch.testing.assert_close(rgb[0], rgbd[0][..., :3], rtol=0, atol=0)
    torch.testing.assert_close(rgb[1], rgbd[1], rtol=0, atol=0)
    for k in PARAMS:
        torch.testing.assert_close(rgb[2][k], rgbd[2][k], rtol=0, atol=0, msg=k)
    assert rgb[3].untyped_storage().nbytes() == 3 * scene.height * scene.width * 4
