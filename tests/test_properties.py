"""Property-based tests (hypothesis) of the public torch entry points: random sizes, input
dtypes, input layouts (strided, transposed, expanded views) and upstream-gradient layouts
(dense, expanded as ``out.sum()`` hands it, strided, of another dtype), on every device.

Each result equals, bit for bit, the same computation given dense contiguous float32
tensors (the layout step made explicit with ``.contiguous().float()``), or the call raises
the documented TypeError / ValueError naming the argument. Examples are derandomised and
few: the whole file stays well under a minute on a CPU."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arc_warp_torch.mesh as dr
from arc_warp_torch import rasterization
from arc_warp_torch.inria import GaussianRasterizationSettings, GaussianRasterizer
from conftest import random_scene

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PROPERTY = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
LAYOUTS = ("dense", "strided", "transposed", "expanded")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
UPSTREAM = ("dense", "expanded", "strided", "float64")


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` (differentiable) in another memory layout: every other row of a buffer twice
    as long, a column-major copy, or its first row broadcast over the others."""
    if layout == "strided":
        return torch.stack([t, torch.zeros_like(t)], 1).flatten(0, 1)[::2]
    if layout == "transposed" and t.dim() > 1:
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "expanded":
        return t[:1].expand_as(t)
    return t


def upstream_loss(outputs, weights, kind: str) -> torch.Tensor:
    """A loss whose cotangent of each output reaches the renderer's backward in ``kind``'s
    layout; "dense" is the reference for every kind but "expanded", whose reference is
    a dense all-ones weight."""
    loss = 0.0
    for out, w in zip(outputs, weights):
        if kind == "expanded":
            loss = loss + out.sum()
        elif kind == "strided":
            loss = loss + (out.transpose(1, 2) * w.transpose(1, 2).contiguous()).sum()
        elif kind == "float64":
            loss = loss + (out.double() * w.double()).sum()
        else:
            loss = loss + (out * w).sum()
    return loss


def reference_kind(kind: str) -> str:
    return "expanded_dense" if kind == "expanded" else "dense"


def dense_weights(outputs, kind, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.ones_like(o) if kind == "expanded_dense" else torch.randn(o.shape, generator=g).to(o.device)
            for o in outputs]


def grads_of(leaves: dict, make_inputs, render, kind: str, seed: int):
    """(outputs, gradients of the leaves) of ``render(make_inputs(leaves))`` under a loss
    whose cotangents come in ``kind``'s layout."""
    for leaf in leaves.values():
        leaf.grad = None
    outputs = render(make_inputs(leaves))
    ones = kind in ("expanded", "expanded_dense")  # `.sum()`'s cotangent, and its dense reference
    weights = dense_weights(outputs, "expanded_dense" if ones else "dense", seed)
    upstream_loss(outputs, weights, "dense" if kind == "expanded_dense" else kind).backward()
    return [o.detach().clone() for o in outputs], {k: v.grad.clone() for k, v in leaves.items()}


def assert_same(got, want):
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], rtol=0, atol=0, msg=name)


@PROPERTY
@given(n=st.integers(0, 24), cameras=st.integers(1, 2), sh_degree=st.sampled_from([None, 0, 1]),
       dtype=st.sampled_from(DTYPES), layouts=st.lists(st.sampled_from(LAYOUTS), min_size=5, max_size=5),
       upstream=st.sampled_from(UPSTREAM), seed=st.integers(0, 2**16), device=st.sampled_from(DEVICES))
def test_rasterization_equals_the_dense_path(n, cameras, sh_degree, dtype, layouts, upstream, seed, device):
    scene = random_scene(np.random.default_rng(seed), n=n, width=13, height=9, sh_degree=sh_degree)
    names = ("means", "quats", "scales", "opacities", "colors")
    base = {k: torch.tensor(getattr(scene, k)) for k in names}
    vm = torch.tensor(np.stack([scene.world_to_camera] * cameras), dtype=torch.float32, device=device)
    ks = torch.tensor([[[scene.fx, 0, scene.cx], [0, scene.fy, scene.cy], [0, 0, 1]]] * cameras,
                      dtype=torch.float32, device=device)

    def leaves():
        return {k: v.to(device, dtype).requires_grad_(True) for k, v in base.items()}

    def render(inputs):
        colors, alphas, _ = rasterization(*inputs, vm, ks, scene.width, scene.height, sh_degree=sh_degree)
        return colors, alphas

    def given_layouts(ls):
        return [laid_out(ls[k], layout) for k, layout in zip(names, layouts)]

    def dense_layouts(ls):
        return [laid_out(ls[k], layout).contiguous().float() for k, layout in zip(names, layouts)]

    got = grads_of(leaves(), given_layouts, render, upstream, seed)
    want = grads_of(leaves(), dense_layouts, render, reference_kind(upstream), seed)
    assert_same(got, want)


@PROPERTY
@given(n=st.integers(1, 16), dtype=st.sampled_from(DTYPES[:2]),
       layouts=st.lists(st.sampled_from(LAYOUTS[:3]), min_size=5, max_size=5),
       upstream=st.sampled_from(UPSTREAM), seed=st.integers(0, 2**16), device=st.sampled_from(DEVICES))
def test_inria_rasterizer_equals_the_dense_path(n, dtype, layouts, upstream, seed, device):
    scene = random_scene(np.random.default_rng(seed), n=n, width=12, height=10, sh_degree=1)
    view = torch.tensor(scene.world_to_camera.T, dtype=torch.float32, device=device)
    raster = GaussianRasterizer(GaussianRasterizationSettings(
        image_height=scene.height, image_width=scene.width, tanfovx=scene.width / (2 * scene.fx),
        tanfovy=scene.height / (2 * scene.fy), bg=torch.zeros(3, device=device), scale_modifier=1.0,
        viewmatrix=view, projmatrix=view, sh_degree=1, campos=torch.zeros(3, device=device), prefiltered=False))
    names = ("means", "opacities", "colors", "scales", "quats")
    base = {"means": scene.means, "opacities": scene.opacities[:, None], "colors": scene.colors,
            "scales": scene.scales, "quats": scene.quats}
    base = {k: torch.tensor(v) for k, v in base.items()}

    def leaves():
        return {k: v.to(device, dtype).requires_grad_(True) for k, v in base.items()}

    def render(inputs):
        means, opacities, shs, scales, rotations = inputs
        means2d = torch.zeros(n, 3, device=device, requires_grad=True)
        color, radii = raster(means3D=means, means2D=means2d, opacities=opacities, shs=shs, scales=scales,
                              rotations=rotations)[:2]
        return (color[None].permute(0, 2, 3, 1),)  # [1, H, W, 3]: upstream_loss's layout

    got = grads_of(leaves(), lambda ls: [laid_out(ls[k], lay) for k, lay in zip(names, layouts)], render,
                   upstream, seed)
    want = grads_of(leaves(), lambda ls: [laid_out(ls[k], lay).contiguous().float() for k, lay in zip(names, layouts)],
                    render, reference_kind(upstream), seed)
    assert_same(got, want)


def _mesh_scene(rng, triangles: int, device):
    """Random triangles in front of the camera (clip space, w in [2, 3]), uv coordinates
    and a small texture."""
    verts = 3 * triangles
    xy = rng.uniform(-1.5, 1.5, (verts, 2))
    w = rng.uniform(2.0, 3.0, (verts, 1))
    pos = np.concatenate([xy * w, rng.uniform(-0.5, 0.5, (verts, 1)) * w, w], 1)[None]
    tri = np.arange(verts, dtype=np.int32).reshape(triangles, 3)
    uv = rng.uniform(0.0, 1.0, (verts, 2))
    tex = rng.uniform(0.0, 1.0, (1, 8, 8, 3))
    f32 = dict(dtype=torch.float32, device=device)
    return (torch.tensor(pos, **f32), torch.tensor(tri, device=device), torch.tensor(uv, **f32),
            torch.tensor(tex, **f32))


@PROPERTY
@given(triangles=st.integers(1, 6), size=st.tuples(st.integers(4, 12), st.integers(4, 12)),
       layouts=st.lists(st.sampled_from(LAYOUTS[:3]), min_size=3, max_size=3),
       upstream=st.sampled_from(UPSTREAM), seed=st.integers(0, 2**16), device=st.sampled_from(DEVICES))
def test_mesh_chain_equals_the_dense_path(triangles, size, layouts, upstream, seed, device):
    pos, tri, uv, tex = _mesh_scene(np.random.default_rng(seed), triangles, device)
    base = {"pos": pos, "uv": uv, "tex": tex}

    def leaves():
        return {k: v.clone().requires_grad_(True) for k, v in base.items()}

    def render(inputs):
        p, u, t = inputs
        rast, rast_db = dr.rasterize(None, p, tri, resolution=list(size))
        texc, texd = dr.interpolate(u, rast, tri, rast_db=rast_db, diff_attrs="all")
        color = dr.texture(t, texc, texd, filter_mode="linear-mipmap-linear", boundary_mode="wrap")
        return (dr.antialias(color, rast, p, tri),)

    def given_layouts(ls, dense=False):
        out = []
        for (k, leaf), layout in zip(ls.items(), layouts):
            # the batch dimension of pos and tex has size 1: lay out their second one instead
            moved = leaf.transpose(0, 1) if k != "uv" else leaf
            laid = laid_out(moved, layout)
            laid = laid.transpose(0, 1) if k != "uv" else laid
            out.append(laid.contiguous() if dense else laid)
        return out

    got = grads_of(leaves(), given_layouts, render, upstream, seed)
    want = grads_of(leaves(), lambda ls: given_layouts(ls, True), render, reference_kind(upstream), seed)
    assert_same(got, want)


@PROPERTY
@given(argument=st.sampled_from(("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks")),
       fault=st.sampled_from(("shape", "dtype", "type")), device=st.sampled_from(DEVICES))
def test_rasterization_bad_arguments_raise_naming_them(argument, fault, device):
    """A wrong shape or a non-float dtype is a ValueError / TypeError naming the argument,
    raised before any work."""
    scene = random_scene(np.random.default_rng(0), n=5, width=8, height=6)
    args = {k: torch.tensor(getattr(scene, k), device=device) for k in ("means", "quats", "scales", "opacities",
                                                                          "colors")}
    args["viewmats"] = torch.tensor(scene.world_to_camera[None], dtype=torch.float32, device=device)
    args["Ks"] = torch.tensor([[[scene.fx, 0, scene.cx], [0, scene.fy, scene.cy], [0, 0, 1]]], device=device)
    t = args[argument]
    if fault == "shape":
        args[argument] = torch.cat([t, t[..., :1]], -1)  # one more column
    elif fault == "dtype":
        args[argument] = t.to(torch.int32)
    else:
        args[argument] = t.tolist()
    with pytest.raises((TypeError, ValueError), match=argument):
        rasterization(*args.values(), scene.width, scene.height)
