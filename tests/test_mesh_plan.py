"""Prepared plans of the mesh ops (arc_warp._src.mesh.plan): with a workspace and given
outputs, a repeated signature reuses the checked, packed call with this call's pointers,
and gives exactly what fresh arrays give."""

import numpy as np
import pytest
import warp as wp

import arc_warp.mesh as mesh
from arc_warp import Workspace
from arc_warp._src.mesh import plan as plan_module
from arc_warp._src.mesh.primitives import uv_sphere
from mesh_scenes import wa

wp.config.log_level = wp.LOG_WARNING


def sphere(rng, batch=2):
    v, uv, f = uv_sphere(5, 8)
    pos = []
    for _ in range(batch):
        s = v * 0.6 + rng.uniform(-0.2, 0.2, 3)
        w = 2.0 + s[:, 2]
        pos.append(np.concatenate([s[:, :2] * w[:, None] * 0.8, s[:, 2:3] * 0.3, w[:, None]], 1))
    return np.stack(pos).astype(np.float32), uv.astype(np.float32), f.astype(np.int32)


def chain(rng, size, ws=None):
    """Forward and backward of rasterize -> interpolate (with derivatives) -> mipmapped
    texture -> antialias on new input arrays (new memory, new values); with ``ws``, every
    output and gradient is a given (new) array. Returns every result as numpy."""
    h, w = size
    pos, uv, f = sphere(rng)
    b = pos.shape[0]
    tex = wa(rng.uniform(0, 1, (1, 16, 16, 3)).astype(np.float32))
    pos, uv, tri = wa(pos), wa(uv[None]), wa(f, wp.int32)
    topo = mesh.antialias_construct_topology_hash(tri)
    g = wa(rng.standard_normal((b, h, w, 3)).astype(np.float32))

    def new(*shape):
        return wp.empty(shape, dtype=wp.float32) if ws is not None else None

    def grads(*like):
        return [wp.zeros(a.shape, dtype=wp.float32) if ws is not None else None for a in like]

    rast, db = mesh.rasterize(pos, tri, size, workspace=ws, out=(new(b, h, w, 4), new(b, h, w, 4)) if ws else None)
    out, out_da = mesh.interpolate(uv, rast, tri, db, "all", workspace=ws,
                                   out=(new(b, h, w, 2), new(b, h, w, 4)) if ws else None)
    mip = mesh.build_mip(tex, out=new(*mesh.mip_shape(tex.shape)), workspace=ws)
    color = mesh.texture(tex, out, out_da, mip=mip, filter_mode="linear-mipmap-linear", workspace=ws,
                         out=new(b, h, w, 3))
    img = mesh.antialias(color, rast, pos, tri, topo, workspace=ws, out=new(b, h, w, 3))
    g_color, g_pos = mesh.antialias_backward(color, rast, pos, tri, g, topo, grad_color=grads(color)[0],
                                             grad_pos=grads(pos)[0], workspace=ws)
    g_tex, g_uv, g_da = grads(tex, out, out_da)
    g_tex, g_uv, g_da, _ = mesh.texture_backward(tex, out, g_color, out_da, mip=mip, filter_mode="linear-mipmap-linear",
                                                 grad_tex=g_tex, grad_uv=g_uv, grad_uv_da=g_da, workspace=ws)
    g_attr, g_rast, g_db = grads(uv, rast, db)
    g_attr, g_rast, g_db = mesh.interpolate_backward(uv, rast, tri, g_uv, db, g_da, "all", grad_attr=g_attr,
                                                     grad_rast=g_rast, grad_rast_db=g_db, workspace=ws)
    g_pos = mesh.rasterize_backward(pos, tri, rast, g_rast, g_db, grad_pos=g_pos, workspace=ws)
    return [a.numpy() for a in (rast, db, out, out_da, mip.data, color, img, g_color, g_tex, g_uv, g_da, g_attr,
                                g_rast, g_db, g_pos)]


def test_reused_plans_match_fresh_arrays(rng, monkeypatch):
    """Three calls of one size, then of another, each on new arrays: the third of each
    plans nothing anew (the first allocates scratch, which drops the workspace's plans),
    and every result equals a call without workspace on the same values."""
    ws = Workspace("cpu")
    builds = []
    bind = plan_module.Plan.bind
    monkeypatch.setattr(plan_module.Plan, "bind", lambda self, ptrs: builds.append(1) or bind(self, ptrs))
    for size in [(20, 24), (16, 16)]:
        for i in range(3):
            seed = int(rng.integers(1 << 30))
            builds.clear()
            got = chain(np.random.default_rng(seed), size, ws)
            want = chain(np.random.default_rng(seed), size)
            assert (want[0][..., 3] > 0).any() and np.abs(want[-1]).max() > 0
            for k, (a, b) in enumerate(zip(got, want)):
                np.testing.assert_array_equal(a, b, err_msg=f"size {size} call {i} result {k}")
        assert not builds  # the third call reused every plan


def test_bad_input_after_a_plan_still_raises(rng):
    ws = Workspace("cpu")
    pos, _, f = sphere(rng)
    out = (wp.empty((2, 8, 8, 4), dtype=wp.float32), wp.empty((2, 8, 8, 4), dtype=wp.float32))
    for _ in range(3):
        mesh.rasterize(wa(pos), wa(f, wp.int32), (8, 8), workspace=ws, out=out)
    with pytest.raises(TypeError, match="tri must have dtype int32"):
        mesh.rasterize(wa(pos), wa(f.astype(np.float32)), (8, 8), workspace=ws, out=out)
    with pytest.raises(ValueError, match=r"out\[0\] \(rast\): expected shape"):
        mesh.rasterize(wa(pos), wa(f, wp.int32), (8, 8), workspace=ws, out=(out[0][:1], out[1]))


@pytest.mark.parametrize("keyed", [7, 33])
def test_mesh_backwards_use_the_keyed_threshold(rng, monkeypatch, keyed):
    """The mesh backwards read the workspace's keyed threshold (not the splat renderer's);
    at 33 (never reduce) `arc` is compiled as `atomic`, with atomic's results."""
    from arc_warp._src.mesh import antialias_ops, interp_ops, raster_ops, texture_ops

    compiled = []
    for module, name in ((texture_ops, "make_tex_bwd"), (interp_ops, "make_interp_bwd"),
                         (raster_ops, "make_raster_bwd"), (antialias_ops, "make_aa_bwd")):
        make = getattr(module, name)
        monkeypatch.setattr(module, name, lambda mode, *a, _make=make: compiled.append(mode) or _make(mode, *a))
    ws = Workspace("cpu")
    ws.threshold, ws.keyed_threshold = 31, keyed  # 31: no other argument of these launches
    seed = int(rng.integers(1 << 30))
    got = chain(np.random.default_rng(seed), (12, 16), ws)
    assert compiled and set(compiled) == {"arc" if keyed < 33 else "atomic"}
    launches = []
    launch = plan_module.Plan.launch
    monkeypatch.setattr(plan_module.Plan, "launch", lambda self, kernel, dim, inputs, *a, **k:
                        launches.append(inputs) or launch(self, kernel, dim, inputs, *a, **k))
    chain(np.random.default_rng(seed), (12, 16), ws)
    assert any(keyed in inputs for inputs in launches), "the keyed T is a kernel argument"
    assert not any(31 in inputs for inputs in launches), "the splat renderer's T reached a mesh kernel"
    want = chain(np.random.default_rng(seed), (12, 16), Workspace("cpu", threshold=keyed))
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"result {k}")
