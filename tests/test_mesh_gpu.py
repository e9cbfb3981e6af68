"""The mesh ops on CUDA agree with the CPU (which the float64 references check), in every
reduce mode; the drop-in runs on torch CUDA tensors. Skipped without a GPU; run on the
accelerator with ``pytest -m gpu tests/test_mesh_gpu.py``."""

import numpy as np
import pytest
import warp as wp

import arc_warp.mesh as mesh
from mesh_scenes import random_mesh

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")]
H, W = 37, 53
MODES = ("atomic", "warp", "serial", "arc")


def on(device, *arrays, ints=()):
    return [wp.array(a, dtype=wp.int32 if i in ints else wp.float32, device=device) for i, a in enumerate(arrays)]


def run_all(device, mode, pos, tri, attr, tex, color, g):
    """Every op's forward and backward on ``device``; numpy results."""
    p, t, a, tx, c = on(device, pos, tri, attr, tex, color, ints=(1,))
    rast, db = mesh.rasterize(p, t, (H, W))
    out, da = mesh.interpolate(a, rast, t, db, diff_attrs="all")
    uv = wp.array(out.numpy()[..., :2], dtype=wp.float32, device=device)
    uv_da = wp.array(da.numpy()[..., :4], dtype=wp.float32, device=device)
    col = mesh.texture(tx, uv, uv_da, filter_mode="linear-mipmap-linear")
    aa = mesh.antialias(c, rast, p, t)
    gs = lambda n: wp.array(g[..., :n], dtype=wp.float32, device=device)  # noqa: E731
    res = {"rast": rast.numpy(), "db": db.numpy(), "interp": out.numpy(), "tex": col.numpy(), "aa": aa.numpy()}
    res["g_pos"] = mesh.rasterize_backward(p, t, rast, gs(4), gs(4), reduce=mode).numpy()
    ga, gr, gdb = mesh.interpolate_backward(a, rast, t, gs(attr.shape[-1]), db, gs(2 * attr.shape[-1]), "all",
                                            reduce=mode)
    res.update(g_attr=ga.numpy(), g_rast=gr.numpy())
    gt, guv, gda, _ = mesh.texture_backward(tx, uv, gs(tex.shape[-1]), uv_da, filter_mode="linear-mipmap-linear",
                                            reduce=mode)
    res.update(g_tex=gt.numpy(), g_uv=guv.numpy())
    gc, gp = mesh.antialias_backward(c, rast, p, t, gs(color.shape[-1]), reduce=mode)
    res.update(g_color=gc.numpy(), g_aa_pos=gp.numpy())
    return res


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.skipif(not wp.is_cpu_available(), reason="needs Warp's CPU backend too")
def test_cuda_matches_cpu(mode):
    rng = np.random.default_rng(0)
    pos, tri = random_mesh(rng, batch=2, n_tri=200, n_vert=120, spread=1.0)
    attr = rng.uniform(0, 1, (1, pos.shape[1], 4)).astype(np.float32)
    tex = rng.uniform(0, 1, (1, 64, 32, 4)).astype(np.float32)
    color = rng.uniform(0, 1, (2, H, W, 3)).astype(np.float32)
    g = rng.standard_normal((2, H, W, 8)).astype(np.float32)
    cpu = run_all("cpu", "atomic", pos, tri, attr, tex, color, g)
    gpu = run_all("cuda:0", mode, pos, tri, attr, tex, color, g)
    same_ids = cpu["rast"][..., 3] == gpu["rast"][..., 3]
    assert same_ids.mean() > 0.999  # FMA contraction may move a rare edge pixel
    for key in cpu:
        scale = max(np.abs(cpu[key]).max(), 1e-6)
        # float32 sums in another order (and FMAs): 1e-4 of the largest value
        diff = np.abs(cpu[key] - gpu[key])
        if key in ("rast", "db", "interp", "tex", "g_rast"):
            diff = diff[same_ids]
        assert diff.max() <= 1e-4 * scale, (key, diff.max(), scale)


def test_depth_test_deterministic_on_cuda():
    rng = np.random.default_rng(1)
    pos, tri = random_mesh(rng, batch=1, n_tri=2000, n_vert=600)
    p, t = on("cuda:0", pos, tri, ints=(1,))
    a = mesh.rasterize(p, t, (256, 256))[0].numpy()
    b = mesh.rasterize(p, t, (256, 256))[0].numpy()
    assert a.tobytes() == b.tobytes()


def test_torch_dropin_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import arc_warp_torch.mesh as dr

    v, uv, f = mesh.uv_sphere(8, 16)
    pos = torch.from_numpy(np.concatenate([v[:, :2], v[:, 2:] * 0.3, v[:, 2:] + 2.5], 1)[None]).cuda()
    pos.requires_grad_(True)
    tri = torch.from_numpy(f).cuda()
    tex = torch.rand(1, 32, 32, 3, device="cuda", requires_grad=True)
    rast, db = dr.rasterize(dr.RasterizeCudaContext(), pos, tri, (64, 64))
    texc, texd = dr.interpolate(torch.from_numpy(uv).cuda()[None], rast, tri, rast_db=db, diff_attrs="all")
    out = dr.antialias(dr.texture(tex, texc, texd, filter_mode="linear-mipmap-linear"), rast, pos, tri)
    out.square().sum().backward()
    assert torch.isfinite(pos.grad).all() and pos.grad.abs().sum() > 0 and tex.grad.abs().sum() > 0


def test_dropin_runs_on_the_current_torch_stream():
    """The drop-in's launches run on torch's current stream: a chain on a side stream
    gives the default stream's results."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import arc_warp_torch.mesh as dr

    v, uv, f = mesh.uv_sphere(8, 16)
    pos0 = torch.from_numpy(np.concatenate([v[:, :2], v[:, 2:] * 0.3, v[:, 2:] + 2.5], 1)[None]).cuda()
    tri, uv = torch.from_numpy(f).cuda(), torch.from_numpy(uv).cuda()[None]

    def run():
        pos = pos0.clone().requires_grad_(True)
        rast, db = dr.rasterize(None, pos, tri, (64, 64))
        out, _ = dr.interpolate(uv, rast, tri, rast_db=db, diff_attrs="all")
        dr.antialias(out, rast, pos, tri).square().sum().backward()
        return rast.detach(), pos.grad

    want = run()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = run()
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)  # atomics add in another order


def test_triangle_check_waits_only_in_the_functions():
    """On CUDA a function waits for its triangle check and raises; an object's forward
    leaves the check on the device (no wait) and its next forward raises for it."""
    rng = np.random.default_rng(2)
    pos, tri = random_mesh(rng, batch=1, n_tri=20, n_vert=30)
    p, t = on("cuda:0", pos, np.concatenate([tri, [[0, 1, 30]]]), ints=(1,))
    with pytest.raises(ValueError, match="rasterize: triangle 20 of tri"):
        mesh.rasterize(p, t, (H, W))
    op = mesh.Rasterizer((H, W), 1, 21, device="cuda:0")
    op.forward(p, t)
    with pytest.raises(ValueError, match="triangle 20 of tri .* previous call"):
        op.forward(p, t)


@pytest.mark.parametrize("channels", [4, 2])
def test_texture_unaligned_views_match_aligned(channels):
    # vector_io moves RGBA (RG) texels, cotangents and outputs in 128 (64)-bit accesses
    # when a base is aligned; arrays one float off their allocation take the float path
    rng = np.random.default_rng(3)
    tex = rng.uniform(0, 1, (1, 16, 16, channels)).astype(np.float32)
    uv = rng.uniform(-0.2, 1.2, (1, H, W, 2)).astype(np.float32)
    g = rng.standard_normal((1, H, W, channels)).astype(np.float32)

    def shifted(a):  # a copy of ``a`` one float past an aligned allocation
        buf = wp.zeros(a.size + 1, dtype=wp.float32, device="cuda")
        out = wp.array(ptr=buf.ptr + 4, dtype=wp.float32, shape=a.shape, device="cuda")
        out.assign(a)
        return out, buf

    def run(tx, u, gg, out):
        col = mesh.texture(tx, u, filter_mode="linear", out=out)
        gt, gu, _, _ = mesh.texture_backward(tx, u, gg, filter_mode="linear")
        return col.numpy(), gt.numpy(), gu.numpy()

    want = run(*on("cuda", tex, uv, g), None)
    (tx, keep_t), (u, keep_u), (gg, keep_g), (out, keep_o) = (shifted(a) for a in (tex, uv, g, np.zeros_like(want[0])))
    got = run(tx, u, gg, out)
    # the texel gradients are float32 sums of many atomic adds, whose order varies from run
    # to run (measured 4e-6 relative apart once); a wrong access path is off by O(1)
    for w_, g_, tol in zip(want, got, (1e-6, 2e-5, 1e-6)):
        np.testing.assert_allclose(g_, w_, rtol=tol, atol=tol)
