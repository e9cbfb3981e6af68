"""arc_warp's 3DGS renderer against the dense float64 reference in reference_splat.py.

The reference is first checked on its own (SH basis, finite differences of its autograd,
the box property that lets a dense evaluation stand in for a tiled one); then the renderer's
forward outputs and hand-written gradients are compared with it on small random CPU scenes.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the float64 reference needs torch")
wp = pytest.importorskip("warp")

import arc_warp  # noqa: E402

from conftest import cpu_blocks_enabled, random_scene  # noqa: E402
from reference_splat import (  # noqa: E402
    RefCamera, fragile_fields, margins, render_reference, sh_basis,
)

PARAMS = ("means", "quats", "scales", "opacities", "colors")
OUTPUTS = ("color", "alpha", "depth", "expected_depth")

# Forward tolerance, absolute on images in [0, 1]: the renderer works in float32
# (roundoff 6e-8); pixel coordinates up to ~1e2 px carry ~1e-5 px error, which moves a
# Gaussian's alpha by ~1e-5 relative. The reference evaluated in float32 stays within
# ~4e-6 of float64 (test_float32_reference_meets_tolerances). Depth-like outputs scale
# with the largest depth.
IMAGE_ATOL = 1e-5
# means2d: float32 world->camera->pixel chain, |coords| <= ~1e2 px -> ~1e-5 px.
MEANS2D_ATOL = 2e-5
# Gradients, norm-wise relative per parameter: the reference's own float32 evaluation
# reaches ~1e-5; a hand-written backward adds the transmittance division T / (1 - alpha)
# (roundoff amplified up to 1e3x near alpha = 0.999, but only on those few terms).
GRAD_RTOL = 1e-4


def ref_camera(scene) -> RefCamera:
    return RefCamera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                     scene.world_to_camera, scene.near, scene.far)


def torch_params(scene, requires_grad=False, dtype=torch.float64) -> dict:
    """Scene parameters as tensors holding exactly the float32 scene values."""
    return {name: torch.tensor(getattr(scene, name), dtype=dtype,
                               requires_grad=requires_grad) for name in PARAMS}


def reference(scene, params, background=(0.0, 0.0, 0.0)):
    return render_reference(params["means"], params["quats"], params["scales"],
                            params["opacities"], params["colors"], ref_camera(scene),
                            scene.sh_degree, background)


def robust_scene(rng, tries=40, **kwargs):
    """A random scene whose float64 render is not within float32 noise of any discrete
    decision (culling, radius rounding, 1/255 cut, 0.999 clamp, 1e-4 termination,
    depth order); near such a point float32 and float64 may legitimately disagree by a
    jump, which would make a comparison test fail by chance rather than by a bug."""
    for _ in range(tries):
        scene = random_scene(rng, **kwargs)
        with torch.no_grad():
            p = torch_params(scene)
            ref = reference(scene, p)
            if not fragile_fields(margins(ref, p["opacities"], ref_camera(scene))):
                return scene
    raise RuntimeError(f"no robust scene in {tries} tries for {kwargs}")


def cotangents(rng, scene) -> dict:
    h, w = scene.height, scene.width
    shapes = {"color": (h, w, 3), "alpha": (h, w), "depth": (h, w), "expected_depth": (h, w)}
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def reference_grads(scene, cot, background=(0.0, 0.0, 0.0), dtype=torch.float64) -> dict:
    p = torch_params(scene, requires_grad=True, dtype=dtype)
    ref = reference(scene, p, background)
    loss = sum((getattr(ref, k) * torch.tensor(cot[k], dtype=dtype)).sum() for k in OUTPUTS)
    loss.backward()
    return {k: p[k].grad.double().numpy() for k in PARAMS}


# --- arc_warp side -------------------------------------------------------------------


def warp_inputs(scene, device, requires_grad=False) -> dict:
    wp_types = {"means": wp.vec3, "quats": wp.vec4, "scales": wp.vec3,
                "opacities": wp.float32, "colors": wp.vec3}
    return {k: wp.array(getattr(scene, k), dtype=wp_types[k], device=device,
                        requires_grad=requires_grad) for k in PARAMS}


def render_arc(scene, device, background=(0.0, 0.0, 0.0), reduce="arc", inputs=None):
    cam = arc_warp.Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                          world_to_camera=scene.world_to_camera, near=scene.near, far=scene.far)
    settings = arc_warp.RenderSettings(sh_degree=scene.sh_degree, background=background,
                                       reduce=reduce)
    inputs = warp_inputs(scene, device) if inputs is None else inputs
    return arc_warp.render_gaussians(inputs["means"], inputs["quats"], inputs["scales"],
                              inputs["opacities"], inputs["colors"], cam, settings)


def arc_grads(out, cot, device) -> dict:
    g = arc_warp.render_gaussians_backward(
        out,
        wp.array(cot["color"], dtype=wp.vec3, device=device),
        grad_alpha=wp.array(cot["alpha"], dtype=wp.float32, device=device),
        grad_depth=wp.array(cot["depth"], dtype=wp.float32, device=device),
        grad_expected_depth=wp.array(cot["expected_depth"], dtype=wp.float32, device=device))
    return {k: getattr(g, k).numpy() for k in PARAMS}


def assert_grads_close(got: dict, want: dict, rtol=GRAD_RTOL):
    for k in PARAMS:
        g, r = np.asarray(got[k], np.float64).reshape(want[k].shape), want[k]
        assert np.all(np.isfinite(g)), f"{k}: non-finite gradient"
        err = np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)
        assert err <= rtol, f"{k}: norm-wise relative error {err:.3e} > {rtol:.0e}"


# --- the reference on its own ----------------------------------------------------------


def test_sh_basis_is_orthonormal():
    # Gauss-Legendre in cos(theta) x uniform phi integrates degree <= 6 products exactly.
    ct, wt = np.polynomial.legendre.leggauss(12)
    phi = np.linspace(0.0, 2 * np.pi, 24, endpoint=False)
    ct_g, phi_g = np.meshgrid(ct, phi, indexing="ij")
    st = np.sqrt(1 - ct_g ** 2)
    dirs = np.stack([st * np.cos(phi_g), st * np.sin(phi_g), ct_g], -1).reshape(-1, 3)
    weights = (wt[:, None] * np.full_like(phi_g, 2 * np.pi / len(phi))).reshape(-1)
    y = sh_basis(3, torch.tensor(dirs)).numpy()
    gram = (y * weights[:, None]).T @ y
    np.testing.assert_allclose(gram, np.eye(16), atol=1e-12)  # exact quadrature, float64


def test_reference_autograd_matches_finite_differences(rng):
    scene = robust_scene(rng, n=50, width=19, height=14, sh_degree=2, opacity_range=(0.6, 0.99),
                         size_px_range=(1.5, 8.0))
    cot = cotangents(rng, scene)
    bg = (0.3, 0.1, 0.6)
    grads = reference_grads(scene, cot, bg)
    base = torch_params(scene)

    def loss_and_state(params):
        with torch.no_grad():
            ref = reference(scene, params, bg)
            loss = sum(float((getattr(ref, k) * torch.tensor(cot[k], dtype=torch.float64)).sum())
                       for k in OUTPUTS)
        return loss, (ref.order.tolist(), ref.valid.numpy().tobytes(), ref.alive.numpy().tobytes())

    with torch.no_grad():
        terminated = bool(reference(scene, base).terminated.any())
    assert terminated, "scene should exercise early termination"
    checked = 0
    for name in PARAMS:
        flat = base[name].reshape(-1)
        for i in rng.permutation(flat.numel())[:6]:
            h = 1e-6 * max(1.0, abs(float(flat[i])))
            plus = {k: v.clone() for k, v in base.items()}
            minus = {k: v.clone() for k, v in base.items()}
            plus[name].reshape(-1)[i] += h
            minus[name].reshape(-1)[i] -= h
            (lp, sp), (lm, sm) = loss_and_state(plus), loss_and_state(minus)
            if sp != sm:  # a discrete event inside [-h, h]: FD is meaningless there
                continue
            fd = (lp - lm) / (2 * h)
            # Central differences in float64: rounding ~1e-16*|loss|/h ~ 1e-8, truncation
            # O(h^2) ~ 1e-12; 1e-6 absolute + 1e-6 relative covers both with margin.
            assert abs(fd - grads[name].reshape(-1)[i]) <= 1e-6 + 1e-6 * abs(fd), (name, i)
            checked += 1
    assert checked >= 24


def test_dense_equals_boxed(rng, make_scene):
    # Every pixel x Gaussian pair that passes the 1/255 cut lies inside the Gaussian's
    # opacity-aware box, so a tiled renderer that only visits the box sees the same pairs.
    for opacity_range in ((0.004, 0.05), (0.05, 1.0)):
        scene = make_scene(rng, n=120, width=37, height=29, opacity_range=opacity_range,
                             size_px_range=(0.3, 12.0))
        with torch.no_grad():
            ref = reference(scene, torch_params(scene))
        proj = ref.projection
        assert bool(ref.valid.any())
        h, w = scene.height, scene.width
        ys, xs = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        m2 = proj.means2d.detach().numpy()[ref.order.numpy()]
        rad = proj.radii.numpy()[ref.order.numpy()]
        inside = ((np.abs(m2[None, :, 0] - xs.reshape(-1, 1)) <= rad[None, :, 0])
                  & (np.abs(m2[None, :, 1] - ys.reshape(-1, 1)) <= rad[None, :, 1]))
        assert not (ref.valid.numpy() & ~inside).any()


# --- renderer versus reference ---------------------------------------------------------

FORWARD_CASES = [
    # sh_degree, width, height, n, background, opaque (dense, hits early termination)
    (None, 37, 29, 80, (0.0, 0.0, 0.0), False),
    (0, 33, 17, 60, (0.2, 0.5, 0.9), False),
    (1, 40, 24, 80, (1.0, 1.0, 1.0), False),
    (2, 21, 35, 70, (0.0, 0.3, 0.0), False),
    (3, 64, 48, 150, (0.1, 0.2, 0.3), False),
    (None, 30, 22, 120, (0.4, 0.4, 0.1), True),
]


def scene_kwargs(width, height, n, opaque, sh_degree):
    kw = dict(n=n, width=width, height=height, sh_degree=sh_degree)
    if opaque:
        kw.update(opacity_range=(0.6, 0.99), size_px_range=(1.5, 8.0))
    return kw


def arc_outputs(out) -> dict:
    """RenderOutput -> numpy images plus means2d (N, 2) and radii (N, 2)."""
    got = {k: getattr(out, k).numpy() for k in OUTPUTS}
    got["means2d"] = out.means2d.numpy().reshape(-1, 2)
    got["radii"] = out.radii.numpy().reshape(-1, 2)
    return got


def assert_forward_close(got: dict, ref):
    img = {k: getattr(ref, k).detach().numpy() for k in OUTPUTS}
    zmax = max(1.0, float(ref.projection.means_cam[:, 2].max()))
    alpha = img["alpha"]
    # expected_depth = depth / alpha, so its error is depth's divided by alpha.
    tol = {"color": IMAGE_ATOL, "alpha": IMAGE_ATOL, "depth": IMAGE_ATOL * zmax,
           "expected_depth": IMAGE_ATOL * zmax / np.where(alpha > 0, alpha, 1.0)}
    for k in OUTPUTS:
        g = np.asarray(got[k], np.float64).reshape(img[k].shape)
        excess = np.abs(g - img[k]) - tol[k]
        worst = np.unravel_index(np.argmax(excess), excess.shape)
        assert excess.max() <= 0, (f"{k}: abs error {abs(g[worst] - img[k][worst]):.3e} at "
                                   f"{worst} (got {g[worst]:.7g}, want {img[k][worst]:.7g}, "
                                   f"alpha {alpha[worst[:2]]:.4g})")
    np.testing.assert_array_equal(got["radii"], ref.projection.radii.numpy())
    vis = ref.projection.visible.numpy()
    np.testing.assert_allclose(np.asarray(got["means2d"], np.float64)[vis],
                               ref.projection.means2d.detach().numpy()[vis], rtol=0,
                               atol=MEANS2D_ATOL)


@pytest.mark.parametrize("kw", [dict(n=120, width=48, height=40, sh_degree=3),
                                dict(n=120, width=30, height=22, opacity_range=(0.6, 0.99),
                                     size_px_range=(1.5, 8.0))], ids=["sh3", "opaque"])
def test_float32_reference_meets_tolerances(rng, kw):
    # The same math in float32 must pass the comparisons below: the tolerances are then
    # what float32 arithmetic allows, not what a particular renderer happens to reach.
    scene = robust_scene(rng, **kw)
    bg = (0.1, 0.2, 0.3)
    with torch.no_grad():
        ref = reference(scene, torch_params(scene), bg)
        ref32 = reference(scene, torch_params(scene, dtype=torch.float32), bg)
    got = {k: getattr(ref32, k).numpy() for k in OUTPUTS}
    got["means2d"] = ref32.projection.means2d.numpy()
    got["radii"] = ref32.projection.radii.numpy()
    assert_forward_close(got, ref)
    cot = cotangents(rng, scene)
    assert_grads_close(reference_grads(scene, cot, bg, torch.float32),
                       reference_grads(scene, cot, bg))


@pytest.mark.parametrize("sh_degree,width,height,n,background,opaque", FORWARD_CASES)
def test_forward_matches_reference(rng, device, sh_degree, width, height, n, background, opaque):
    scene = robust_scene(rng, **scene_kwargs(width, height, n, opaque, sh_degree))
    with torch.no_grad():
        ref = reference(scene, torch_params(scene), background)
    if opaque:
        assert bool(ref.terminated.any()), "opaque scene should exercise early termination"
    out = render_arc(scene, device, background)
    assert_forward_close(arc_outputs(out), ref)


@pytest.mark.parametrize("opaque", [False, True], ids=["sparse", "opaque"])
def test_forward_matches_reference_in_cpu_blocks(rng, opaque):
    # Emulated 32-lane warps ballot over the entries of their two-row strips; an image of
    # two tiles across and down puts entries in every strip and some strips off the image.
    scene = robust_scene(rng, **scene_kwargs(27, 21, 60, opaque, 1))
    bg = (0.3, 0.6, 0.1)
    with torch.no_grad():
        ref = reference(scene, torch_params(scene), bg)
    with cpu_blocks_enabled(True):
        out = render_arc(scene, "cpu", bg)
    assert_forward_close(arc_outputs(out), ref)


@pytest.mark.parametrize("reduce", ["atomic", "warp", "serial", "arc", "deterministic"])
def test_gradients_match_reference(rng, device, reduce, cpu_blocks):
    if cpu_blocks:
        # Fibers emulate 256-lane blocks: keep the image to a couple of tiles.
        kw = dict(n=40, width=19, height=13, sh_degree=1, opacity_range=(0.3, 0.99),
                  size_px_range=(1.0, 6.0))
    else:
        kw = dict(n=70, width=35, height=26, sh_degree=2, opacity_range=(0.3, 0.99),
                  size_px_range=(1.0, 8.0))
    scene = robust_scene(rng, **kw)
    bg = (0.25, 0.5, 0.75)
    cot = cotangents(rng, scene)
    want = reference_grads(scene, cot, bg)
    out = render_arc(scene, device, bg, reduce=reduce)
    assert_grads_close(arc_grads(out, cot, device), want)


@pytest.mark.parametrize("reduce", ["atomic", "arc", "deterministic"])
def test_gradients_match_reference_where_warps_skip_most_entries(rng, device, reduce, cpu_blocks):
    # Splats 0.2-1.5 px wide reach few of a tile's 8x4 warp blocks: the backward passes
    # over the entries whose subtile mask lacks a warp's block (warp_skips; emulated CPU
    # blocks only over those reaching none), and must still restore what the forward composited.
    from test_splat_pipeline import SUB_COUNT, staged_subtile_masks

    kw = dict(n=50, width=19, height=13) if cpu_blocks else dict(n=150, width=35, height=26)
    scene = robust_scene(rng, sh_degree=1, opacity_range=(0.3, 0.99), size_px_range=(0.2, 1.5), **kw)
    bg = (0.25, 0.5, 0.75)
    cot = cotangents(rng, scene)
    want = reference_grads(scene, cot, bg)
    out = render_arc(scene, device, bg, reduce=reduce)
    masks = staged_subtile_masks(out)
    if device == "cpu" and cpu_blocks:
        skipped = (masks == 0).mean()  # entries every warp of the block skips
    else:
        skipped = 1.0 - np.unpackbits(masks.astype(np.uint8)[:, None], axis=1).mean()  # (entry, warp) pairs
    assert skipped > (0.0 if device == "cpu" and cpu_blocks else 0.5), skipped
    with torch.no_grad():
        assert_forward_close(arc_outputs(out), reference(scene, torch_params(scene), bg))
    assert_grads_close(arc_grads(out, cot, device), want)


def test_tape_path_matches_reference(rng, device):
    scene = robust_scene(rng, n=40, width=24, height=18, sh_degree=1)
    cot = cotangents(rng, scene)
    want = reference_grads(scene, cot)
    inputs = warp_inputs(scene, device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = render_arc(scene, device, inputs=inputs)
    tape.backward(grads={
        out.color: wp.array(cot["color"], dtype=wp.vec3, device=device),
        out.alpha: wp.array(cot["alpha"], dtype=wp.float32, device=device),
        out.depth: wp.array(cot["depth"], dtype=wp.float32, device=device),
        out.expected_depth: wp.array(cot["expected_depth"], dtype=wp.float32, device=device),
    })
    assert_grads_close({k: inputs[k].grad.numpy() for k in PARAMS}, want)


def test_finite_differences_through_renderer(rng, device):
    # A few wide, half-transparent Gaussians centred in a small image: every pixel sees
    # every Gaussian above the 1/255 cut and no pixel terminates, so the loss is smooth in
    # all parameters and float32 central differences are meaningful without event checks.
    scene = robust_scene(rng, n=6, width=20, height=14, opacity_range=(0.3, 0.7),
                         size_px_range=(8.0, 16.0), border_px=0.0, sh_degree=1)
    cot = cotangents(rng, scene)
    got = arc_grads(render_arc(scene, device), cot, device)
    want = reference_grads(scene, cot)

    def loss(s):
        out = render_arc(s, device)
        # float64 reduction of float32 images keeps the sum's own rounding out of the FD.
        return sum(float((getattr(out, k).numpy().astype(np.float64).reshape(cot[k].shape)
                          * cot[k]).sum()) for k in OUTPUTS)

    def ref_loss_state(s):
        with torch.no_grad():
            ref = reference(s, torch_params(s))
            value = sum(float((getattr(ref, k) * torch.tensor(cot[k], dtype=torch.float64)).sum())
                        for k in OUTPUTS)
        return value, bool(ref.valid.all()), bool(ref.alive.all())

    for name, comp in (("means", 0), ("quats", 2), ("scales", 1), ("opacities", 0),
                       ("colors", 1)):
        g = want[name].reshape(len(scene.opacities), -1)
        gi = int(np.argmax(np.abs(g[:, comp])))
        idx = np.unravel_index(gi * g.shape[1] + comp, getattr(scene, name).shape)
        x0 = float(getattr(scene, name)[idx])
        # Steps of 1 % of the Gaussian's own scale: float32 images carry ~1e-7 noise per
        # pixel, ~1e-6 on the loss, so the FD noise is ~1e-6 / h, far below these gradients.
        h = 1e-2 * {"means": float(scene.scales[gi].max()),
                    "quats": float(np.linalg.norm(scene.quats[gi]))}.get(name, abs(x0) or 1.0)
        plus, minus = _perturbed(scene, name, idx, x0 + h), _perturbed(scene, name, idx, x0 - h)
        (rp, *sp), (rm, *sm) = ref_loss_state(plus), ref_loss_state(minus)
        assert sp == sm == [True, True], "the scene should have no discrete event nearby"
        step = float(np.float32(x0 + h)) - float(np.float32(x0 - h))  # as stored in float32
        fd = (loss(plus) - loss(minus)) / step
        ana, ref_ana = float(got[name].reshape(g.shape)[gi, comp]), float(g[gi, comp])
        # The step's truncation error, measured on the float64 reference at the same step,
        # plus 0.5 % for float32 noise in the rendered images (observed ~1e-4 relative).
        truncation = abs((rp - rm) / step - ref_ana)
        assert abs(fd - ana) <= truncation + 5e-3 * abs(ana), (name, fd, ana, truncation)


def _perturbed(scene, name, idx, value):
    arr = getattr(scene, name).copy()
    arr[idx] = value
    fields = dict(scene.__dict__)
    fields[name] = arr
    return type(scene)(**fields)


def test_dense_vs_tiled_edge_cases(rng, device):
    # A few Gaussians wide enough to cover every tile, some ordinary ones, one straddling
    # the near plane (centre just in front of the camera but behind `near`: culled) and
    # some behind the camera (culled): outputs and gradients must match the dense
    # reference and culled Gaussians must get radii (0, 0) and zero gradients.
    base = robust_scene(rng, n=30, width=45, height=37, sh_degree=1)
    view = base.world_to_camera
    to_world = lambda c: (np.asarray(c) - view[:3, 3]) @ np.linalg.inv(view[:3, :3]).T
    extra_cam = np.array([
        [0.1, -0.2, 2.0], [-0.3, 0.2, 3.0],  # covering the whole image
        [0.0, 0.0, 0.005],  # straddles the near plane (0.01)
        [0.2, 0.1, -1.0], [0.0, 0.0, -3.0],  # behind the camera
    ])
    k = len(extra_cam)
    sizes = np.array([[2.0, 1.5, 1.0], [3.0, 2.0, 2.5], [0.5, 0.5, 0.5], [0.4, 0.3, 0.2],
                      [1.0, 1.0, 1.0]])
    fields = dict(base.__dict__)
    fields["means"] = np.concatenate([base.means, to_world(extra_cam)]).astype(np.float32)
    fields["quats"] = np.concatenate([base.quats, rng.normal(size=(k, 4))]).astype(np.float32)
    fields["scales"] = np.concatenate([base.scales, sizes]).astype(np.float32)
    fields["opacities"] = np.concatenate([base.opacities, [0.3, 0.2, 0.9, 0.9, 0.9]])
    fields["opacities"] = fields["opacities"].astype(np.float32)
    extra_colors = rng.normal(scale=0.4, size=(k,) + base.colors.shape[1:])
    fields["colors"] = np.concatenate([base.colors, extra_colors]).astype(np.float32)
    scene = type(base)(**fields)

    with torch.no_grad():
        p = torch_params(scene)
        ref = reference(scene, p)
        assert not fragile_fields(margins(ref, p["opacities"], ref_camera(scene)))
    vis = ref.projection.visible.numpy()
    assert vis[-5:-3].all() and not vis[-3:].any()
    big_rad = ref.projection.radii.numpy()[-5:-3]
    assert (big_rad[:, 0] >= scene.width).all() and (big_rad[:, 1] >= scene.height).all()

    out = render_arc(scene, device)
    assert_forward_close(arc_outputs(out), ref)
    cot = cotangents(rng, scene)
    got = arc_grads(out, cot, device)
    assert_grads_close(got, reference_grads(scene, cot))
    for name in PARAMS:
        assert not np.any(got[name].reshape(len(vis), -1)[-3:]), f"{name}: culled got gradient"


def test_all_culled_gives_background(rng, device, make_scene):
    scene = make_scene(rng, n=8, width=20, height=12)
    view = scene.world_to_camera
    behind = np.stack([np.zeros(8), np.zeros(8), -np.linspace(0.5, 4.0, 8)], -1)
    scene.means = ((behind - view[:3, 3]) @ np.linalg.inv(view[:3, :3]).T).astype(np.float32)
    bg = (0.2, 0.4, 0.6)
    out = render_arc(scene, device, bg)
    np.testing.assert_array_equal(out.radii.numpy().reshape(-1, 2), 0)
    np.testing.assert_array_equal(out.color.numpy().reshape(-1, 3),
                                  np.tile(np.float32(bg), (20 * 12, 1)))
    for k in ("alpha", "depth", "expected_depth"):
        assert not np.any(getattr(out, k).numpy()), k
