"""rasterization(surface_colors=, surface_depths=) and arc_warp_torch.surface_from_mesh: the
torch path of the hybrid composite against the Warp path (tests/test_hybrid.py's helpers;
the same kernels and launches on the CPU, so bit for bit where no background is added in
torch), the background rule, the whole chain through the nvdiffrast drop-in against the
Warp tape and finite differences, and bad input."""

import numpy as np
import pytest
from conftest import needs_cpu_kernels

torch = pytest.importorskip("torch", reason="arc_warp_torch needs torch")
wp = pytest.importorskip("warp")

import arc_warp  # noqa: E402
import arc_warp_torch.mesh as dr  # noqa: E402
from arc_warp_torch import rasterization, surface_from_mesh  # noqa: E402

from test_hybrid import (  # noqa: E402
    _sphere_scene, camera_of, clip_matrix, cotangent_arrays, mesh_surface, robust_hybrid, surface_arrays,
    to_clip,
)
from test_splat_reference import PARAMS, cotangents, warp_inputs  # noqa: E402


def tensors(scene, requires_grad=True):
    return {k: torch.tensor(getattr(scene, k)).requires_grad_(requires_grad) for k in PARAMS}


def cameras(scene, c=1):
    vm = torch.tensor(np.stack([scene.world_to_camera] * c), dtype=torch.float32)
    ks = torch.tensor([[[scene.fx, 0.0, scene.cx], [0.0, scene.fy, scene.cy], [0.0, 0.0, 1.0]]] * c,
                      dtype=torch.float32)
    return vm, ks


def render(p, scene, c=1, **kwargs):
    return rasterization(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"], *cameras(scene, c),
                         scene.width, scene.height, near_plane=scene.near, **kwargs)


def test_surfaces_match_the_warp_path(rng):
    # two cameras, two surfaces: images, Gaussian gradients and surface-colour gradients
    # bit for bit those of render_gaussians(surface_colors=, surface_depths=) + its backward
    scene, surface = robust_hybrid(rng, n=40, width=24, height=18, sh_degree=1)
    _, surface2 = robust_hybrid(rng, scene=scene)
    sc = torch.tensor(np.stack([surface[0], surface2[0]]), requires_grad=True)
    sd = torch.tensor(np.stack([surface[1], surface2[1]]))
    p = tensors(scene)
    colors, alphas, _ = render(p, scene, c=2, render_mode="RGB+D", surface_colors=sc, surface_depths=sd)
    cots = [cotangents(rng, scene) for _ in range(2)]
    g_color = torch.tensor(np.stack([np.concatenate([c["color"], c["depth"][..., None]], -1) for c in cots]))
    g_alpha = torch.tensor(np.stack([c["alpha"] for c in cots]))[..., None]
    ((colors * g_color).sum() + (alphas * g_alpha).sum()).backward()

    inputs = warp_inputs(scene, "cpu")
    grads = arc_warp.GaussianGrads(*(wp.zeros_like(inputs[k]) for k in PARAMS))
    for i, (surf, cot) in enumerate(zip((surface, surface2), cots)):
        out = arc_warp.render_gaussians(*inputs.values(), camera_of(scene), arc_warp.RenderSettings(sh_degree=1),
                                        surface_colors=surface_arrays(surf, "cpu")[0],
                                        surface_depths=surface_arrays(surf, "cpu")[1])
        np.testing.assert_array_equal(colors[i, ..., :3].detach().numpy(), out.color.numpy())
        np.testing.assert_array_equal(colors[i, ..., 3].detach().numpy(), out.depth.numpy())
        np.testing.assert_array_equal(alphas[i, ..., 0].detach().numpy(), out.alpha.numpy())
        grad_surface = wp.zeros((scene.height, scene.width), dtype=wp.vec3)
        color_cot, alpha_cot, depth_cot, _ = cotangent_arrays(cot, "cpu")
        arc_warp.render_gaussians_backward(out, color_cot, alpha_cot, depth_cot, grads=grads,
                                           grad_surface_colors=grad_surface)
        np.testing.assert_array_equal(sc.grad[i].numpy(), grad_surface.numpy())
    assert sc.grad.abs().max() > 0
    for k in PARAMS:
        # the bridge writes camera 0 and adds camera 1 (the Warp loop above adds both into
        # zeros): equal up to the float32 sum's rounding
        np.testing.assert_allclose(p[k].grad.numpy(), getattr(grads, k).numpy(), rtol=1e-5,
                                   atol=1e-6 * np.abs(getattr(grads, k).numpy()).max(), err_msg=k)


def test_background_shows_only_where_there_is_no_surface(rng):
    scene, surface = robust_hybrid(rng, n=30, width=20, height=14)
    bg = (0.2, 0.5, 0.8)
    p = tensors(scene)
    sc, sd = (torch.tensor(a)[None] for a in surface)
    colors, alphas, _ = render(p, scene, backgrounds=torch.tensor(bg), surface_colors=sc, surface_depths=sd)
    inputs = warp_inputs(scene, "cpu")
    out = arc_warp.render_gaussians(*inputs.values(), camera_of(scene), arc_warp.RenderSettings(background=bg),
                                    surface_colors=surface_arrays(surface, "cpu")[0],
                                    surface_depths=surface_arrays(surface, "cpu")[1])
    # rgb + (1 - alpha) bg in torch against T bg in the kernel: float32 rounding
    np.testing.assert_allclose(colors[0].detach().numpy(), out.color.numpy(), atol=1e-6)
    # where a surface shows through a transparent pixel, no background is added
    clear = np.isfinite(surface[1]) & (alphas[0, ..., 0].detach().numpy() < 0.5)
    assert clear.any()
    np.testing.assert_allclose(colors[0].detach().numpy()[clear],
                               (out.color.numpy())[clear], atol=1e-6)
    plain, _, _ = render(p, scene, surface_colors=sc, surface_depths=sd)
    np.testing.assert_array_equal(colors[0].detach().numpy()[clear], plain[0].detach().numpy()[clear])


def test_surface_from_mesh_matches_the_warp_helper(rng):
    scene, world, tri_np, vcol_np = _sphere_scene(rng)
    cam = camera_of(scene)
    for y_up in (True, False):
        clip_np = to_clip(world, clip_matrix(cam, y_up=y_up))
        want_c, want_d, *_ = mesh_surface(wp.array(clip_np, dtype=wp.float32), wp.array(tri_np, dtype=wp.int32),
                                          wp.array(vcol_np, dtype=wp.float32), (scene.height, scene.width), y_up)
        clip, tri = torch.tensor(clip_np), torch.tensor(tri_np)
        vcol = torch.tensor(vcol_np, requires_grad=True)
        rast, _ = dr.rasterize(None, clip, tri, (scene.height, scene.width), grad_db=False)
        color = dr.antialias(dr.interpolate(vcol, rast, tri)[0], rast, clip, tri)
        colors, depths = surface_from_mesh(color, rast, clip, tri, flip_y=y_up)
        np.testing.assert_array_equal(colors.detach().numpy(), want_c.numpy())
        np.testing.assert_array_equal(depths.numpy(), want_d.numpy())
        assert np.isfinite(depths.numpy()).any() and np.isinf(depths.numpy()).any()
        assert not depths.requires_grad and colors.requires_grad
        # the colours' gradient is the mesh image's, row for row
        g = torch.tensor(rng.normal(size=colors.shape), dtype=torch.float32)
        (color_grad,) = torch.autograd.grad((colors * g).sum(), color)
        np.testing.assert_array_equal(color_grad.numpy(), (g.flip(1) if y_up else g).numpy())


def _torch_chain(scene, clip, tri, vcol, p, cot):
    rast, _ = dr.rasterize(None, clip, tri, (scene.height, scene.width), grad_db=False)
    color = dr.antialias(dr.interpolate(vcol, rast, tri)[0], rast, clip, tri)
    colors, depths = surface_from_mesh(color, rast, clip, tri, flip_y=True)
    image, _, _ = render(p, scene, surface_colors=colors, surface_depths=depths)
    return (image[0].double() * cot).sum()


def test_chain_through_the_drop_in_matches_the_warp_tape_and_finite_differences(rng):
    # drop-in mesh ops -> surface_from_mesh -> rasterization: the gradients of the clip
    # positions, vertex colours and Gaussians equal the Warp tape's over the same chain,
    # and the vertex colours' (the loss is linear in them) central differences
    scene, world, tri_np, vcol_np = _sphere_scene(rng)
    clip_np = to_clip(world, clip_matrix(camera_of(scene), y_up=True))
    cot_np = rng.normal(size=(scene.height, scene.width, 3))
    clip = torch.tensor(clip_np, requires_grad=True)
    vcol = torch.tensor(vcol_np, requires_grad=True)
    p = tensors(scene)
    tri = torch.tensor(tri_np)
    loss = _torch_chain(scene, clip, tri, vcol, p, torch.tensor(cot_np))
    loss.backward()

    w_clip = wp.array(clip_np, dtype=wp.float32, requires_grad=True)
    w_vcol = wp.array(vcol_np, dtype=wp.float32, requires_grad=True)
    inputs = warp_inputs(scene, "cpu", requires_grad=True)
    tape = wp.Tape()
    with tape:
        colors, depths, *_ = mesh_surface(w_clip, wp.array(tri_np, dtype=wp.int32), w_vcol,
                                          (scene.height, scene.width), True)
        out = arc_warp.render_gaussians(*inputs.values(), camera_of(scene), surface_colors=colors[0],
                                        surface_depths=depths[0])
    tape.backward(grads={out.color: wp.array(cot_np.astype(np.float32), dtype=wp.vec3)})
    assert np.abs(clip.grad.numpy()).max() > 0 and np.abs(vcol.grad.numpy()).max() > 0
    # same kernels in the same order, but the drop-in adds each op's gradient into zeros
    # where the tape adds into the running .grad: float32 rounding of those sums
    np.testing.assert_allclose(clip.grad.numpy(), w_clip.grad.numpy(), rtol=1e-5,
                               atol=1e-6 * np.abs(w_clip.grad.numpy()).max())
    np.testing.assert_allclose(vcol.grad.numpy(), w_vcol.grad.numpy(), rtol=1e-5, atol=1e-7)
    for k in PARAMS:
        want = inputs[k].grad.numpy()
        np.testing.assert_allclose(p[k].grad.numpy(), want, rtol=1e-5, atol=1e-6 * np.abs(want).max(), err_msg=k)

    def loss_at(colors_np):
        with torch.no_grad():
            return float(_torch_chain(scene, torch.tensor(clip_np), tri, torch.tensor(colors_np), tensors(scene, False),
                                      torch.tensor(cot_np)))

    order = np.argsort(-np.abs(vcol.grad.numpy()).ravel())[:6]
    for flat in order:
        v, k = divmod(int(flat), 3)
        plus, minus = vcol_np.copy(), vcol_np.copy()
        plus[v, k] += 0.05
        minus[v, k] -= 0.05
        step = float(np.float32(vcol_np[v, k] + 0.05)) - float(np.float32(vcol_np[v, k] - 0.05))
        fd = (loss_at(plus) - loss_at(minus)) / step
        # linear in the colours: only the float32 renders' rounding (~1e-7 of the loss)
        assert abs(fd - vcol.grad[v, k].item()) <= 1e-4 * abs(fd) + 1e-4, (v, k, fd, vcol.grad[v, k].item())


def test_bad_surfaces_raise(rng):
    scene, surface = robust_hybrid(rng, n=10, width=12, height=8)
    p = tensors(scene, requires_grad=False)
    sc, sd = (torch.tensor(a)[None] for a in surface)
    with pytest.raises(ValueError, match="go together"):
        render(p, scene, surface_colors=sc)
    with pytest.raises(ValueError, match=r"surface_depths: expected shape \[1, 8, 12\], got \[1, 8, 11\]"):
        render(p, scene, surface_colors=sc, surface_depths=sd[..., :11])
    with pytest.raises(ValueError, match=r"surface_colors: expected shape \[2, 8, 12, 3\]"):
        render(p, scene, c=2, surface_colors=sc, surface_depths=sd.expand(2, -1, -1))
    with pytest.raises(TypeError, match="surface_depths: expected a floating-point tensor"):
        render(p, scene, surface_colors=sc, surface_depths=sd.to(torch.int32))
    nan = sd.clone()
    nan[0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="surface_depths has NaN"):
        render(p, scene, surface_colors=sc, surface_depths=nan)
    with pytest.raises(TypeError, match="flip_y"):
        surface_from_mesh(torch.zeros(1, 8, 12, 3), torch.zeros(1, 8, 12, 4), torch.zeros(3, 4),
                          torch.zeros(1, 3, dtype=torch.int32), flip_y=1)
    with pytest.raises(ValueError, match=r"rast must have shape \(1, 8, 12, 4\)"):
        surface_from_mesh(torch.zeros(1, 8, 12, 3), torch.zeros(1, 8, 11, 4), torch.zeros(3, 4),
                          torch.zeros(1, 3, dtype=torch.int32), flip_y=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@needs_cpu_kernels
def test_surface_on_another_device_raises(rng):
    scene, surface = robust_hybrid(rng, n=10, width=12, height=8)
    p = {k: v.cuda() for k, v in tensors(scene, requires_grad=False).items()}
    sc, sd = (torch.tensor(a)[None] for a in surface)
    with pytest.raises(ValueError, match="surface_colors: expected device cuda"):
        render(p, scene, surface_colors=sc, surface_depths=sd.cuda())
    colors, alphas, _ = render(p, scene, surface_colors=sc.cuda(), surface_depths=sd.cuda())
    want, _, _ = render(tensors(scene, requires_grad=False), scene, surface_colors=sc, surface_depths=sd)
    np.testing.assert_allclose(colors.cpu().numpy(), want.numpy(), atol=1e-5)
    # the torch helper over CUDA drop-in outputs
    clip = torch.tensor(to_clip(np.array([[0.0, 0.0, 3.0], [1.0, 0.0, 3.0], [0.0, 1.0, 3.0]]),
                                clip_matrix(arc_warp.Camera.from_fov(50.0, 12, 8), y_up=True)), device="cuda")
    tri = torch.tensor([[0, 1, 2]], dtype=torch.int32, device="cuda")
    rast, _ = dr.rasterize(None, clip, tri, (8, 12))
    colors, depths = surface_from_mesh(torch.ones(1, 8, 12, 3, device="cuda"), rast, clip, tri, flip_y=True)
    assert depths.device.type == "cuda" and torch.isfinite(depths).any()
