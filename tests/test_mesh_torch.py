"""arc_warp_torch.mesh, the nvdiffrast.torch drop-in: the whole chain (rasterize ->
interpolate with derivatives -> mipmapped texture -> antialias) against the float64
reference through torch.autograd, and the API surface."""

import numpy as np
import pytest
import torch
import warp as wp

import arc_warp.mesh as core
import arc_warp_torch.mesh as dr
from reference_mesh import antialias as ref_antialias
from reference_mesh import barycentrics, interpolate as ref_interpolate, texture as ref_texture

H, W = 12, 14


def cosine(a, b):
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    return float(a @ b / (a.norm() * b.norm()))


def scene(seed=0):
    rng = np.random.default_rng(seed)
    v, uv, f = core.uv_sphere(5, 8)
    angle = 0.4
    rot = np.array([[np.cos(angle), 0, np.sin(angle)], [0, 1, 0], [-np.sin(angle), 0, np.cos(angle)]])
    p = v @ rot.T * 0.7
    w = 2.5 + p[:, 2]
    pos = np.concatenate([p[:, :2] * 3.0, p[:, 2:3] * 0.5, w[:, None]], 1)[None].astype(np.float32)
    tex = rng.uniform(0, 1, (1, 16, 16, 3)).astype(np.float32)
    return torch.from_numpy(pos), torch.from_numpy(f), torch.from_numpy(uv), torch.from_numpy(tex)


def chain(pos, tri, uv, tex, ids=None):
    """The drop-in chain, or (ids given) the float64 reference at that visibility."""
    if ids is None:
        glctx = dr.RasterizeCudaContext()
        rast, rast_db = dr.rasterize(glctx, pos, tri, resolution=[H, W])
        texc, texd = dr.interpolate(uv, rast, tri, rast_db=rast_db, diff_attrs="all")
        color = dr.texture(tex, texc, texd, filter_mode="linear-mipmap-linear", boundary_mode="wrap")
        return dr.antialias(color, rast, pos, tri), rast
    u, v, *db = barycentrics(pos, tri, ids, H, W)
    rast = torch.stack([u, v, torch.zeros_like(u), ids.to(torch.float64)], -1)
    texc, texd = ref_interpolate(uv[None], rast, tri, torch.stack(db, -1), [0, 1])
    color = ref_texture(tex, texc, texd, None, "linear-mipmap-linear", "wrap")
    return color, rast


def test_chain_matches_reference():
    pos, tri, uv, tex = scene()
    p, u, t = (x.clone().requires_grad_(True) for x in (pos, uv, tex))
    out, rast = chain(p, tri, u, t)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * g).sum().backward()

    ids = rast[..., 3].detach().round().long()
    p64, u64, t64 = (x.double().requires_grad_(True) for x in (pos, uv, tex))
    ref_color, ref_rast = chain(p64, tri, u64, t64, ids)
    # antialias on the reference colours, depth from our rast (it picks the nearer triangle)
    ref_rast = torch.cat([ref_rast[..., :2], rast[..., 2:3].double(), ref_rast[..., 3:]], -1)
    topo = core.antialias_construct_topology_hash(dr.to_warp(tri)).opposite.numpy()
    ref_out = ref_antialias(ref_color, ref_rast.detach(), p64, tri, topo)
    (ref_out * g.double()).sum().backward()

    assert (ids > 0).sum() > 40
    # forward: float32 chain vs float64; texel-step pixels may differ slightly
    assert (out.detach().double() - ref_out.detach()).abs().max() < 1e-3
    # gradients: the bar against nvdiffrast, here against the exact float64 chain
    for name, got, want in (("pos", p.grad, p64.grad), ("uv", u.grad, u64.grad), ("tex", t.grad, t64.grad)):
        assert cosine(got, want) > 0.9999, name


def test_contexts_and_modes_agree():
    pos, tri, uv, tex = scene()
    results = []
    for ctx, mode in ((dr.RasterizeGLContext(), "atomic"), (dr.RasterizeCudaContext(device="cuda"), "arc")):
        p = pos.clone().requires_grad_(True)
        rast, db = dr.rasterize(ctx, p, tri, (H, W), reduce=mode)
        attr, _ = dr.interpolate(uv, rast, tri, reduce=mode)
        (attr ** 2).sum().backward()
        results.append((rast, p.grad))
    assert torch.equal(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)


def test_api_errors():
    pos, tri, uv, tex = scene()
    with pytest.raises(TypeError, match="int32"):
        dr.rasterize(None, pos, tri.long(), (H, W))
    with pytest.raises(ValueError, match="last dimension 4"):
        dr.rasterize(None, pos[..., :3], tri, (H, W))
    with pytest.raises(ValueError, match="cube"):
        dr.texture_construct_mip(tex, cube_mode=True)
    mip = dr.texture_construct_mip(tex)
    uv_img = torch.rand(1, H, W, 2)
    out = dr.texture(tex, uv_img, mip_level_bias=torch.full((1, H, W), 1.5), mip=mip)
    assert out.shape == (1, H, W, 3)


def test_repeated_chain_allocates_nothing(monkeypatch):
    """After one step, forward + backward of the chain at the same sizes allocates no Warp
    memory: outputs and gradients are torch tensors, scratch lives in the context's
    workspace, and the same results come back."""
    pos, tri, uv, tex = scene()
    p, t = pos.clone().requires_grad_(True), tex.clone().requires_grad_(True)
    topo = dr.antialias_construct_topology_hash(tri)

    def step():
        p.grad = t.grad = None
        rast, db = dr.rasterize(None, p, tri, (H, W))
        texc, texd = dr.interpolate(uv, rast, tri, rast_db=db, diff_attrs="all")
        color = dr.texture(t, texc, texd, filter_mode="linear-mipmap-linear")
        out = dr.antialias(color, rast, p, tri, topology_hash=topo)
        (out * out).sum().backward()
        return out.detach(), p.grad, t.grad

    first = step()
    device = wp.get_device("cpu")
    allocations = []
    allocate = device.default_allocator.allocate

    def counted(size):
        allocations.append(size)
        return allocate(size)

    monkeypatch.setattr(device.default_allocator, "allocate", counted)
    for _ in range(3):
        again = step()
    assert allocations == []
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_inputs_without_grad_get_none():
    """A fixed texture (or fixed uvs) is not scattered into; the other gradients are the same."""
    pos, tri, uv, tex = scene()
    grads = []
    for tex_grad in (True, False):
        p, t = pos.clone().requires_grad_(True), tex.clone().requires_grad_(tex_grad)
        rast, db = dr.rasterize(None, p, tri, (H, W))
        texc, texd = dr.interpolate(uv, rast, tri, rast_db=db, diff_attrs="all")
        dr.texture(t, texc, texd, filter_mode="linear-mipmap-linear").square().sum().backward()
        assert (t.grad is not None) == tex_grad and uv.grad is None
        grads.append(p.grad)
    assert torch.equal(grads[0], grads[1])


def _op_output(op, p, u, t, seed=0):
    """One drop-in op of the scene's chain, the others' outputs detached: the op's output
    and the leaves whose gradients it alone gives."""
    _, tri, uv, _ = scene(seed)
    rast, db = dr.rasterize(None, p, tri, (H, W))
    if op == "rasterize":
        return rast, (p,)
    if op == "interpolate":
        return dr.interpolate(u, rast.detach(), tri, rast_db=db.detach(), diff_attrs="all")[0], (u,)
    texc, texd = dr.interpolate(uv, rast.detach(), tri, rast_db=db.detach(), diff_attrs="all")
    if op == "texture":
        return dr.texture(t, texc, texd, filter_mode="linear-mipmap-linear"), (t,)
    color = torch.cat([texc, texd], -1).detach()  # 6 channels: two float4 chunks
    return dr.antialias(color, rast.detach(), p, tri), (p,)


@pytest.mark.parametrize("op", ["rasterize", "interpolate", "texture", "antialias"])
@pytest.mark.parametrize("layout", ["expanded", "strided", "fresh"])
def test_upstream_gradient_layouts(op, layout, monkeypatch):
    """Each op's backward given the cotangent torch hands it for `out.sum()` (expanded,
    stride 0), a transposed (strided) one, or a fresh tensor made in the loss equals its
    backward given the same values dense: the copies the bridge makes of such cotangents
    live until their launches have run (issue 37 case 4: they were freed first, and
    `out.sum().backward()` gave inf, NaN or wrong gradients)."""
    import threading

    import arc_warp_torch._autograd as bridge

    for seed in range(3):  # a freed copy is reused by a later allocation some of the time
        pos, _, uv, tex = scene(seed)
        grads = []
        for dense in (False, True):
            # new op objects: their first backward allocates scratch, where a freed copy goes
            monkeypatch.setattr(bridge, "_contexts", threading.local())
            leaves = [x.clone().requires_grad_(True) for x in (pos, uv, tex)]
            out, wanted = _op_output(op, *leaves, seed)
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
            if layout == "expanded":
                loss = out.sum() if not dense else (out * torch.ones_like(out)).sum()
            elif layout == "strided":  # dL/dout arrives as a transposed view of gT
                gt = g.transpose(1, 2).contiguous()
                loss = (out.transpose(1, 2) * gt).sum() if not dense else (out * g).sum()
            else:  # a cotangent of another dtype, converted (a new tensor) by the bridge
                loss = (out.double() * g.double()).sum() if not dense else (out * g).sum()
            loss.backward()
            grads.append([leaf.grad for leaf in wanted])
        for got, want in zip(*grads):
            assert torch.isfinite(got).all(), (op, layout, seed)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_out_of_range_triangles_raise():
    """A vertex index outside [0, V) raises (issue 37 case 7; on the CPU the op's own
    call, which reads the device check at once), naming the op and the triangle."""
    pos, tri, uv, tex = scene()
    bad = torch.cat([tri, torch.tensor([[0, 1, pos.shape[1]]], dtype=torch.int32)])
    with pytest.raises(ValueError, match=f"rasterize: triangle {len(tri)} of tri"):
        dr.rasterize(None, pos, bad, (H, W))
    rast, db = dr.rasterize(None, pos, tri, (H, W))
    with pytest.raises(ValueError, match="interpolate: triangle .* outside \\[0, 5\\)"):
        dr.interpolate(uv[:5], rast, tri)
    with pytest.raises(ValueError, match=f"antialias: triangle {len(tri)} of tri"):
        dr.antialias(torch.zeros(1, H, W, 3), rast, pos, bad)


def test_one_workspace_per_thread_and_device():
    """The drop-in's op objects live in the workspace of the thread's default
    RenderContext, the one the splat path renders with (one registry: each thread and
    device has one workspace, holding renderers and mesh ops by size); another thread
    gets its own workspace and objects, with the same results."""
    import threading

    from arc_warp import GaussianRenderer
    from arc_warp_torch import rasterization
    from arc_warp_torch._autograd import default_context

    pos, tri, uv, tex = scene()
    n = 8
    gauss = [torch.tensor(a, dtype=torch.float32) for a in (
        np.random.default_rng(0).normal(size=(n, 3)) * 0.3 + [0, 0, 3], np.tile([1.0, 0, 0, 0], (n, 1)),
        np.full((n, 3), 0.1), np.full(n, 0.5), np.random.default_rng(1).uniform(size=(n, 3)))]
    ks = torch.tensor([[[20.0, 0, W / 2], [0, 20.0, H / 2], [0, 0, 1]]])
    results, spaces = [], []

    def run():
        p = pos.clone().requires_grad_(True)
        out, _ = chain(p, tri, uv, tex)
        (out * out).sum().backward()
        rasterization(*gauss, torch.eye(4)[None], ks, W, H)
        results.append((out.detach(), p.grad))
        spaces.append(default_context(pos.device).workspace)

    run()
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len({id(ws) for ws in spaces}) == 3
    for ws in spaces:  # the splat renderer and the four mesh ops (and the mip builder's sampler) in one workspace
        kinds = {type(o) for o in ws.objects()}
        assert kinds == {GaussianRenderer, core.Rasterizer, core.Interpolator, core.TextureSampler, core.Antialiaser}
    mine = {id(o) for o in spaces[0].objects()}
    assert not mine & {id(o) for ws in spaces[1:] for o in ws.objects()}
    for out, grad in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(grad, results[0][1])
