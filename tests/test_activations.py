"""Activations inside the projection (``RenderSettings.scale_activation="exp"``,
``opacity_activation="sigmoid"``; the torch API's ``scales_activation`` /
``opacities_activation``): renders of raw log-scales / logits equal renders of the
activated values, and their gradients are those of the raw parameters (the chain rule
applied to the plain path's gradients, and the float64 reference differentiated by torch
autograd through exp / sigmoid)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the float64 reference and the torch API need torch")
wp = pytest.importorskip("warp")

import arc_warp  # noqa: E402
from arc_warp import GaussianGrads, RenderSettings, Workspace, render_gaussians  # noqa: E402
from arc_warp_torch import RenderContext, rasterization  # noqa: E402
from conftest import random_scene  # noqa: E402
from test_antialiased import reference_aa, robust_aa_scene  # noqa: E402
from test_splat_reference import (  # noqa: E402
    OUTPUTS, PARAMS, arc_outputs, assert_forward_close, assert_grads_close, cotangents, reference,
    robust_scene,
)

ACTIVATED = dict(scale_activation="exp", opacity_activation="sigmoid")
WP_TYPES = {"means": wp.vec3, "quats": wp.vec4, "scales": wp.vec3, "opacities": wp.float32, "colors": wp.vec3}


def raw_of(scene) -> dict:
    """float32 raw parameters: log-scales and logits of the scene's scales / opacities."""
    s = scene.scales.astype(np.float64)
    o = scene.opacities.astype(np.float64)
    return {"scales": np.log(s).astype(np.float32), "opacities": np.log(o / (1.0 - o)).astype(np.float32)}


def behind_camera(scene, index: int):
    """Moves Gaussian ``index`` one unit behind the camera, where the projection culls it."""
    view = scene.world_to_camera
    scene.means[index] = (view[:3, :3].T @ (np.array([0.0, 0.0, -1.0]) - view[:3, 3])).astype(np.float32)
    return scene


def activated_of(raw: dict) -> dict:
    """The raw values activated in float64 and rounded once to float32 (what a float32
    exp / sigmoid gives, to within an ulp)."""
    x = raw["opacities"].astype(np.float64)
    return {"scales": np.exp(raw["scales"].astype(np.float64)).astype(np.float32),
            "opacities": (0.5 * (1.0 + np.tanh(0.5 * x))).astype(np.float32)}


def arrays_of(scene, values: dict, device) -> dict:
    return {k: wp.array(values[k] if k in values else getattr(scene, k), dtype=WP_TYPES[k], device=device)
            for k in PARAMS}


def camera_of(scene):
    return arc_warp.Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                           world_to_camera=scene.world_to_camera, near=scene.near, far=scene.far)


def render(scene, arrays, device=None, **settings):
    s = RenderSettings(sh_degree=scene.sh_degree, **settings)
    return render_gaussians(*(arrays[k] for k in PARAMS), camera_of(scene), s)


def cotangent_arrays(cot, device):
    return (wp.array(cot["color"], dtype=wp.vec3, device=device),
            wp.array(cot["alpha"], dtype=wp.float32, device=device),
            wp.array(cot["depth"], dtype=wp.float32, device=device),
            wp.array(cot["expected_depth"], dtype=wp.float32, device=device))


def backward(out, cot, device, start=None, accumulate=True) -> dict:
    """render_gaussians_backward into grads holding ``start`` (numpy by name)."""
    inputs = out._state.gaussians
    grads = GaussianGrads(*(wp.array(start[k], dtype=a.dtype, device=device)
                            for k, a in zip(PARAMS, inputs.arrays)))
    arc_warp.render_gaussians_backward(out, *cotangent_arrays(cot, device), grads=grads, accumulate=accumulate)
    return {k: getattr(grads, k).numpy().astype(np.float64) for k in PARAMS}


def assert_images_equal(got, want, atol=1e-6):
    zmax = max(1.0, float(np.abs(want.depth.numpy()).max()))
    for k, tol in (("color", atol), ("alpha", atol), ("depth", atol * zmax)):
        np.testing.assert_allclose(getattr(got, k).numpy(), getattr(want, k).numpy(), rtol=0, atol=tol, err_msg=k)
    np.testing.assert_array_equal(got.radii.numpy(), want.radii.numpy())
    np.testing.assert_array_equal(got.means2d.numpy(), want.means2d.numpy())


def norm_close(got, want, rtol, name):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), f"{name}: non-finite"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= rtol, f"{name}: norm-wise relative error {err:.3e} > {rtol:.0e}"


# --- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize("field,value", [("scale_activation", "log"), ("scale_activation", "sigmoid"),
                                         ("scale_activation", None), ("opacity_activation", "exp"),
                                         ("opacity_activation", "Sigmoid"), ("opacity_activation", 1)])
def test_settings_reject_unknown_activations(field, value):
    with pytest.raises(ValueError, match=field) as err:
        RenderSettings(**{field: value})
    assert "'none'" in str(err.value)  # names the allowed values


def test_settings_default_to_no_activation():
    s = RenderSettings()
    assert (s.scale_activation, s.opacity_activation) == ("none", "none")
    assert RenderSettings(**ACTIVATED) != s and hash(RenderSettings(**ACTIVATED)) != hash(s)  # graph keys differ


# --- core: forward and gradients --------------------------------------------------------


@pytest.mark.parametrize("antialiased", [False, True], ids=["classic", "antialiased"])
@pytest.mark.parametrize("which", ["both", "scales", "opacities"])
def test_forward_equals_preactivated_inputs(rng, device, antialiased, which):
    scene = robust_scene(rng, n=90, width=37, height=29, sh_degree=2)
    raw = raw_of(scene)
    act = activated_of(raw)
    use = {"both": ("scales", "opacities"), "scales": ("scales",), "opacities": ("opacities",)}[which]
    settings = {"scale_activation": "exp" if "scales" in use else "none",
                "opacity_activation": "sigmoid" if "opacities" in use else "none"}
    got = render(scene, arrays_of(scene, {k: raw[k] for k in use}, device), antialiased=antialiased, **settings)
    want = render(scene, arrays_of(scene, {k: act[k] for k in use}, device), antialiased=antialiased)
    assert_images_equal(got, want)
    assert (want.radii.numpy()[:, 0] > 0).sum() > 20  # a scene, not an empty image


@pytest.mark.parametrize("accumulate", [False, True], ids=["write", "accumulate"])
@pytest.mark.parametrize("reduce,antialiased", [("deterministic", False), ("atomic", False), ("arc", False),
                                                ("deterministic", True), ("atomic", True)])
def test_gradients_are_the_chain_rule_of_the_plain_path(rng, device, reduce, antialiased, accumulate):
    scene = behind_camera(robust_scene(rng, n=70, width=35, height=26, sh_degree=1, opacity_range=(0.1, 0.99)), 3)
    raw = raw_of(scene)
    act = activated_of(raw)
    cot = cotangents(rng, scene)
    # accumulate: the gradients add into what the buffers hold; write: every entry is
    # written, so the NaN the buffers hold must be gone
    start = {k: (rng.normal(size=np.shape(getattr(scene, k))) if accumulate
                 else np.full(np.shape(getattr(scene, k)), np.nan)).astype(np.float32) for k in PARAMS}
    got = backward(render(scene, arrays_of(scene, raw, device), reduce=reduce, antialiased=antialiased,
                          **ACTIVATED), cot, device, start, accumulate)
    zero = {k: np.zeros_like(v) for k, v in start.items()}
    plain = backward(render(scene, arrays_of(scene, act, device), reduce=reduce, antialiased=antialiased),
                     cot, device, zero, False)
    s = act["scales"].astype(np.float64)
    o = act["opacities"].astype(np.float64)
    want = dict(plain, scales=plain["scales"] * s, opacities=plain["opacities"] * o * (1.0 - o))
    base = {k: start[k].astype(np.float64) if accumulate else 0.0 for k in PARAMS}
    for k in PARAMS:
        norm_close(got[k] - base[k], want[k], 1e-5, k)
    culled = render(scene, arrays_of(scene, act, device)).radii.numpy()[:, 0] == 0
    assert culled.any()  # culled Gaussians get exactly what the buffers held (write: 0)
    for k in ("scales", "opacities"):
        np.testing.assert_array_equal(got[k][culled], np.broadcast_to(base[k], got[k].shape)[culled], err_msg=k)


def reference_raw(scene, raw, cot, background, antialiased, requires_grad=True):
    """The float64 reference rendered from raw float32 values activated by torch, and (with
    cotangents) torch autograd's gradients on the raw leaves."""
    p = {k: torch.tensor(raw[k] if k in raw else getattr(scene, k), dtype=torch.float64,
                         requires_grad=requires_grad) for k in PARAMS}
    act = dict(p, scales=torch.exp(p["scales"]), opacities=torch.sigmoid(p["opacities"]))
    ref = reference_aa(scene, act, background)[0] if antialiased else reference(scene, act, background)
    if cot is None:
        return ref, None
    loss = sum((getattr(ref, k) * torch.tensor(cot[k], dtype=torch.float64)).sum() for k in OUTPUTS)
    loss.backward()
    return ref, {k: p[k].grad.numpy() for k in PARAMS}


@pytest.mark.parametrize("reduce,antialiased", [("deterministic", False), ("arc", False), ("atomic", False),
                                                ("deterministic", True)])
def test_raw_parameters_match_float64_reference(rng, device, reduce, antialiased):
    kw = dict(n=60, width=31, height=23, sh_degree=1, opacity_range=(0.3, 0.99))
    scene = robust_aa_scene(rng, **kw) if antialiased else robust_scene(rng, size_px_range=(1.0, 8.0), **kw)
    raw = raw_of(scene)
    bg = (0.25, 0.5, 0.75)
    cot = cotangents(rng, scene)
    ref, want = reference_raw(scene, raw, cot, bg, antialiased)
    out = render(scene, arrays_of(scene, raw, device), background=bg, reduce=reduce, antialiased=antialiased,
                 **ACTIVATED)
    with torch.no_grad():
        assert_forward_close(arc_outputs(out), ref)
    zero = {k: np.zeros(np.shape(getattr(scene, k)), np.float32) for k in PARAMS}
    assert_grads_close(backward(out, cot, device, zero, False), want)


def test_tape_backward_reaches_the_raw_inputs(rng, device):
    scene = robust_scene(rng, n=40, width=24, height=18, sh_degree=1)
    raw = raw_of(scene)
    cot = cotangents(rng, scene)
    _, want = reference_raw(scene, raw, cot, (0.0, 0.0, 0.0), False)
    arrays = {k: wp.array(v.numpy(), dtype=v.dtype, device=device, requires_grad=True)
              for k, v in arrays_of(scene, raw, device).items()}
    tape = wp.Tape()
    with tape:
        out = render(scene, arrays, **ACTIVATED)
    tape.backward(grads=dict(zip((out.color, out.alpha, out.depth, out.expected_depth),
                                 cotangent_arrays(cot, device))))
    assert_grads_close({k: arrays[k].grad.numpy() for k in PARAMS}, want)


def test_extreme_logits_and_overflowing_log_scales(rng):
    scene = random_scene(rng, n=30, width=24, height=18)
    raw = raw_of(scene)
    seen = np.flatnonzero(render(scene, arrays_of(scene, {}, "cpu")).radii.numpy()[:, 0] > 0)
    # logits far past float32's sigmoid saturation stay finite, and their slope keeps the
    # exp(-|x|) tail instead of o (1 - o) rounding to 0
    raw["opacities"][seen[:3]] = (40.0, -40.0, 3e38)
    act = activated_of(raw)
    assert act["opacities"][seen[0]] == 1.0  # saturated in float32
    out = render(scene, arrays_of(scene, raw, "cpu"), **ACTIVATED)
    cot = cotangents(rng, scene)
    zero = {k: np.zeros(np.shape(getattr(scene, k)), np.float32) for k in PARAMS}
    g = backward(out, cot, "cpu", zero, False)
    assert all(np.all(np.isfinite(v)) for v in g.values())
    plain = backward(render(scene, arrays_of(scene, act, "cpu")), cot, "cpu", zero, False)
    assert plain["opacities"][seen[0]] != 0.0
    norm_close(g["opacities"][seen[0]], plain["opacities"][seen[0]] * np.exp(-40.0), 1e-4, "slope at logit 40")
    # a log-scale whose exp overflows float32 is a non-finite scale
    raw["scales"][5, 1] = 100.0
    with pytest.raises(ValueError, match="non-finite.*scales"):
        render(scene, arrays_of(scene, raw, "cpu"), **ACTIVATED)
    raw["scales"][5, 1] = -np.inf  # exp(-inf) = 0 is finite, the raw value is not
    with pytest.raises(ValueError, match="non-finite.*scales"):
        render(scene, arrays_of(scene, raw, "cpu"), **ACTIVATED)
    raw["scales"][5, 1] = 0.0
    raw["opacities"][7] = np.nan
    with pytest.raises(ValueError, match="non-finite.*opacities"):
        render(scene, arrays_of(scene, raw, "cpu"), **ACTIVATED)


def test_workspace_renders_follow_activation_changes(rng):
    """The same arrays rendered with and without activations, alternating, through one
    workspace (a renderer per setting, its launches prepared once) equal renders made
    afresh for each call."""
    scene = random_scene(rng, n=50, width=32, height=24, sh_degree=1)
    arrays = arrays_of(scene, raw_of(scene), "cpu")
    cot = cotangents(rng, scene)
    settings = [RenderSettings(sh_degree=1, reduce="atomic"), RenderSettings(sh_degree=1, reduce="atomic",
                                                                             **ACTIVATED)]

    def loop(ws):
        grads = GaussianGrads(*(wp.zeros_like(a) for a in arrays.values()))
        results = []
        camera = camera_of(scene)
        for step in range(6):
            out = render_gaussians(*arrays.values(), camera, settings[(step // 2) % 2], ws)
            arc_warp.render_gaussians_backward(out, *cotangent_arrays(cot, "cpu"), grads=grads, accumulate=False)
            results.append([out.color.numpy().copy()] + [getattr(grads, k).numpy().copy() for k in PARAMS])
        return results

    want = loop(None)
    assert np.abs(want[0][0] - want[2][0]).max() > 1e-3  # the two settings render differently
    ws = Workspace("cpu")
    got = loop(ws)
    assert len(ws.renderers()) == 2
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}, result {i}")


def test_activation_kernels_are_stable():
    """The kernels' sigmoid and its slope against float64 over the whole float32 range."""
    from arc_warp._src.splat.project_kernels import sigmoid, sigmoid_slope

    @wp.kernel
    def evaluate(x: wp.array(dtype=float), o: wp.array(dtype=float), d: wp.array(dtype=float)):
        i = wp.tid()
        o[i] = sigmoid(x[i])
        d[i] = sigmoid_slope(x[i])

    x = np.concatenate([np.linspace(-100.0, 100.0, 2001), [-3e38, 3e38, 0.0]]).astype(np.float32)
    o, d = wp.zeros(x.size, dtype=float), wp.zeros(x.size, dtype=float)
    wp.launch(evaluate, x.size, [wp.array(x, dtype=float)], [o, d])
    xd = x.astype(np.float64)
    t = np.exp(-np.abs(xd))
    want_o = np.where(xd >= 0, 1.0 / (1.0 + t), t / (1.0 + t))
    want_d = t / (1.0 + t) ** 2
    for name, got, want in (("sigmoid", o.numpy(), want_o), ("slope", d.numpy(), want_d)):
        tiny = want < 1e-37  # float32 denormals / underflow
        np.testing.assert_allclose(got[~tiny], want[~tiny], rtol=1e-5, atol=0, err_msg=name)
        assert np.all(got[tiny] <= 1e-37), name


# --- torch API --------------------------------------------------------------------------


def _torch_setup(rng, n=40, cameras=2):
    scene = robust_scene(rng, n=n, width=30, height=22, sh_degree=1)
    raw = raw_of(scene)
    vm = torch.tensor(np.stack([scene.world_to_camera] * cameras), dtype=torch.float32)
    vm[1:, 0, 3] += 0.05  # a second, shifted view
    ks = torch.tensor([[[scene.fx, 0.0, scene.cx], [0.0, scene.fy, scene.cy], [0.0, 0.0, 1.0]]] * cameras,
                      dtype=torch.float32)
    leaves = {k: torch.tensor(raw[k] if k in raw else getattr(scene, k)).requires_grad_(True) for k in PARAMS}
    return scene, leaves, vm, ks


@pytest.mark.parametrize("reduce", ["deterministic", "arc"])
def test_rasterization_options_equal_torch_activations(rng, reduce):
    scene, leaves, vm, ks = _torch_setup(rng)
    g_out = torch.tensor(rng.normal(size=(2, scene.height, scene.width, 4)), dtype=torch.float32)
    g_alpha = torch.tensor(rng.normal(size=(2, scene.height, scene.width, 1)), dtype=torch.float32)
    results = []
    for fused in (True, False):
        p = {k: v.detach().clone().requires_grad_(True) for k, v in leaves.items()}
        if fused:
            args = (p["means"], p["quats"], p["scales"], p["opacities"], p["colors"])
            kw = dict(scales_activation="exp", opacities_activation="sigmoid")
        else:
            args = (p["means"], torch.nn.functional.normalize(p["quats"], dim=-1), torch.exp(p["scales"]),
                    torch.sigmoid(p["opacities"]), p["colors"])
            kw = {}
        colors, alphas, meta = rasterization(*args, vm, ks, scene.width, scene.height, reduce=reduce,
                                             render_mode="RGB+D", **kw)
        ((colors * g_out).sum() + (alphas * g_alpha).sum()).backward()
        results.append((colors.detach(), alphas.detach(), meta, {k: v.grad for k, v in p.items()}))
    (c1, a1, m1, g1), (c0, a0, m0, g0) = results
    assert float(a0.max()) > 0.5
    np.testing.assert_allclose(c1.numpy(), c0.numpy(), rtol=0, atol=1e-5)  # depth channel: world units
    np.testing.assert_allclose(a1.numpy(), a0.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(m1["radii"].numpy(), m0["radii"].numpy())
    norm_close(m1["means2d"].grad.numpy(), m0["means2d"].grad.numpy(), 1e-5, "means2d")
    for k in PARAMS:
        norm_close(g1[k].numpy(), g0[k].numpy(), 1e-5, k)


def test_rasterization_activation_follows_each_call(rng):
    """One context, the same tensors with and without the options: each call renders
    what a fresh context renders."""
    scene, leaves, vm, ks = _torch_setup(rng, cameras=1)
    args = tuple(leaves[k].detach() for k in PARAMS)
    ctx = RenderContext(torch.device("cpu"))
    for kw in (dict(scales_activation="exp", opacities_activation="sigmoid"), {},
               dict(opacities_activation="sigmoid"), dict(scales_activation="exp")):
        got = rasterization(*args, vm, ks, scene.width, scene.height, context=ctx, **kw)[0]
        want = rasterization(*args, vm, ks, scene.width, scene.height, context=RenderContext(torch.device("cpu")),
                             **kw)[0]
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=str(kw))


@pytest.mark.parametrize("kw,name", [(dict(scales_activation="log"), "scales_activation"),
                                     (dict(scales_activation="none"), "scales_activation"),
                                     (dict(opacities_activation="exp"), "opacities_activation"),
                                     (dict(opacities_activation=True), "opacities_activation")])
def test_rasterization_rejects_unknown_activations(rng, kw, name):
    scene, leaves, vm, ks = _torch_setup(rng, cameras=1)
    with pytest.raises(ValueError, match=name) as err:
        rasterization(*(leaves[k] for k in PARAMS), vm, ks, scene.width, scene.height, **kw)
    assert "None" in str(err.value)
