"""texture against the float64 reference: filter modes x boundary modes, mip pyramids of
square, non-square, NPOT and 1x1 textures, gradients into tex / uv / uv_da / bias in
every reduce mode, tape and validation."""

import numpy as np
import pytest
import warp as wp

import arc_warp.mesh as mesh
from mesh_scenes import REDUCE_CASES, REDUCE_IDS, cpu_blocks, needs_sm90_nvrtc, sm90_ptx, t64, wa
from reference_mesh import texture as ref_texture

wp.config.log_level = wp.LOG_WARNING
H, W = 9, 13
MODES = ["nearest", "linear", "linear-mipmap-nearest", "linear-mipmap-linear"]


def inputs(rng, tex_shape=(2, 16, 8, 3), batch=2, scale=1.0):
    tex = rng.uniform(0, 1, tex_shape).astype(np.float32)
    uv = rng.uniform(-0.3, 1.3, (batch, H, W, 2)).astype(np.float32)
    # footprints from ~0.3 to ~6 texels: magnified and minified pixels
    uv_da = (rng.standard_normal((batch, H, W, 4)) * np.exp(rng.uniform(-1.5, 1.8, (batch, H, W, 1))) * scale
             / 16).astype(np.float32)
    bias = rng.uniform(-0.5, 0.5, (batch, H, W)).astype(np.float32)
    return tex, uv, uv_da, bias


def away_from_steps(uv, tex_shape, margin=1e-3):
    """Pixels whose texel coordinates are not within ``margin`` of a nearest/linear step
    (float32 vs float64 may round those to the other texel)."""
    ok = np.ones(uv.shape[:3], bool)
    for level in range(6):
        for axis, size in ((0, tex_shape[2]), (1, tex_shape[1])):
            s = max(size >> level, 1)
            for off in (0.0, 0.5):
                t = uv[..., axis] * s - off
                ok &= np.abs(t - np.round(t)) > margin
    return ok


@pytest.mark.parametrize("boundary", ["wrap", "clamp", "zero"])
@pytest.mark.parametrize("filter_mode", MODES)
def test_forward_matches_reference(rng, filter_mode, boundary):
    tex, uv, uv_da, bias = inputs(rng)
    da = uv_da if "mipmap" in filter_mode else None
    b = bias if "mipmap" in filter_mode else None
    out = mesh.texture(wa(tex), wa(uv), wa(da) if da is not None else None, wa(b) if b is not None else None,
                       filter_mode=filter_mode, boundary_mode=boundary).numpy()
    ref = ref_texture(t64(tex), t64(uv), t64(da) if da is not None else None, t64(b) if b is not None else None,
                      filter_mode, boundary).numpy()
    ok = away_from_steps(uv, tex.shape)
    assert ok.mean() > 0.8
    # float32 weights of values in [0, 1]: a few ulps; lod floors may flip near integers,
    # which the reference-vs-float32 lod check below excludes
    diff = np.abs(out - ref).max(-1)
    assert np.mean(diff[ok] < 1e-5) > 0.97, np.sort(diff[ok])[-5:]


@pytest.mark.parametrize("shape,levels", [((1, 1, 1, 2), None), ((1, 12, 20, 1), 2), ((1, 1, 8, 4), None),
                                          ((2, 6, 10, 3), 1)], ids=["1x1", "npot_12x20", "1x8", "npot_6x10"])
def test_sizes(rng, shape, levels):
    tex, uv, uv_da, bias = inputs(rng, tex_shape=shape, batch=2 if shape[0] == 2 else 1)
    if levels is not None:  # NPOT: the full pyramid reaches an odd side, as in nvdiffrast
        with pytest.raises(ValueError, match="max_mip_level"):
            mesh.texture(wa(tex), wa(uv), wa(uv_da))
    out = mesh.texture(wa(tex), wa(uv), wa(uv_da), max_mip_level=levels).numpy()
    ref = ref_texture(t64(tex), t64(uv), t64(uv_da), None, "linear-mipmap-linear", "wrap", levels).numpy()
    ok = away_from_steps(uv, tex.shape)
    assert np.mean(np.abs(out - ref).max(-1)[ok] < 1e-5) > 0.97


def reference_grads(tex, uv, uv_da, bias, filter_mode, boundary, g):
    ts = [t64(x).requires_grad_(True) if x is not None else None for x in (tex, uv, uv_da, bias)]
    out = ref_texture(*ts, filter_mode, boundary)
    (out * t64(g)).sum().backward()
    return [t.grad.numpy() if t is not None and t.grad is not None else None for t in ts]


@pytest.mark.parametrize("blocks,mode,threshold", REDUCE_CASES, ids=REDUCE_IDS)
def test_backward_modes(rng, blocks, mode, threshold):
    # magnified (many pixels per texel): the contended case ARC merges
    tex, uv, uv_da, bias = inputs(rng, tex_shape=(1, 4, 4, 4), scale=0.1)
    ok = away_from_steps(uv, tex.shape, margin=2e-3)
    g = (rng.standard_normal((2, H, W, 4)) * ok[..., None]).astype(np.float32)  # no cotangent near steps
    with cpu_blocks(blocks):
        got = mesh.texture_backward(wa(tex), wa(uv), wa(g), wa(uv_da), None, filter_mode="linear-mipmap-linear",
                                    reduce=mode, threshold=threshold)
        # tex's gradient not wanted: no texel scatter or fold, the per-pixel gradients unchanged
        skip = mesh.texture_backward(wa(tex), wa(uv), wa(g), wa(uv_da), None, filter_mode="linear-mipmap-linear",
                                     reduce=mode, threshold=threshold, tex_grad=False)
    assert skip[0] is None
    np.testing.assert_array_equal(skip[1].numpy(), got[1].numpy())
    np.testing.assert_array_equal(skip[2].numpy(), got[2].numpy())
    want = reference_grads(tex, uv, uv_da, None, "linear-mipmap-linear", "wrap", g)
    # texel gradients sum ~230 terms |g w| <~ 3: float32 round-off ~1e-5 relative to the largest
    np.testing.assert_allclose(got[0].numpy(), want[0], atol=2e-5 * np.abs(want[0]).max())
    np.testing.assert_allclose(got[1].numpy(), want[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[2].numpy(), want[2], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("filter_mode,boundary", [("nearest", "zero"), ("linear", "clamp"),
                                                   ("linear-mipmap-nearest", "wrap"), ("linear-mipmap-linear", "zero")])
def test_backward_filters(rng, filter_mode, boundary):
    tex, uv, uv_da, bias = inputs(rng, tex_shape=(2, 8, 16, 2))
    uv = np.clip(uv, -0.2, 1.2)
    use_mip = "mipmap" in filter_mode
    da, b = (uv_da, bias) if use_mip else (None, None)
    ok = away_from_steps(uv, tex.shape, margin=2e-3)
    g = (rng.standard_normal((2, H, W, 2)) * ok[..., None]).astype(np.float32)  # no cotangent near steps
    got = mesh.texture_backward(wa(tex), wa(uv), wa(g), wa(da) if use_mip else None, wa(b) if use_mip else None,
                                filter_mode=filter_mode, boundary_mode=boundary)
    want = reference_grads(tex, uv, da, b, filter_mode, boundary, g)
    np.testing.assert_allclose(got[0].numpy(), want[0], atol=2e-5 * np.abs(want[0]).max())
    if filter_mode != "nearest":
        np.testing.assert_allclose(got[1].numpy(), want[1], rtol=1e-4, atol=2e-4)
    if filter_mode == "linear-mipmap-linear":
        # lod gradients: the reference differentiates the clamp too; compare where unclamped
        np.testing.assert_allclose(got[3].numpy(), want[3], rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(got[2].numpy(), want[2], rtol=1e-3, atol=2e-4)


@pytest.mark.parametrize("prebuilt", [False, True], ids=["mip_inside", "mip_prebuilt"])
def test_tape(rng, prebuilt):
    tex, uv, uv_da, _ = inputs(rng, tex_shape=(1, 8, 8, 3))
    t = wa(tex, requires_grad=True)
    u = wa(uv, requires_grad=True)
    stack = mesh.build_mip(t) if prebuilt else None
    tape = wp.Tape()
    with tape:
        out = mesh.texture(t, u, wa(uv_da), mip=stack)
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.grad.assign(g)
    tape.backward()
    gt, gu, _, _ = mesh.texture_backward(wa(tex), wa(uv), wa(g), wa(uv_da))
    np.testing.assert_allclose(t.grad.numpy(), gt.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(u.grad.numpy(), gu.numpy(), rtol=1e-6, atol=1e-7)


def test_validation(rng):
    tex, uv, uv_da, _ = inputs(rng)
    with pytest.raises(ValueError, match="filter_mode"):
        mesh.texture(wa(tex), wa(uv), filter_mode="cubic")
    with pytest.raises(ValueError, match="cube"):
        mesh.texture(wa(tex), wa(uv), boundary_mode="cube")
    with pytest.raises(ValueError, match="uv_da or mip_level_bias"):
        mesh.texture(wa(tex), wa(uv), filter_mode="linear-mipmap-linear")
    with pytest.raises(ValueError, match="minibatch"):
        mesh.texture(wa(np.zeros((3, 4, 4, 1), np.float32)), wa(uv))
    with pytest.raises(ValueError, match="uv"):
        mesh.texture(wa(tex), wa(uv[..., :1]))


@pytest.mark.parametrize("shape,levels", [((1, 16, 8, 3), None), ((2, 8, 32, 2), None), ((1, 16, 4, 2), None),
                                          ((1, 1, 8, 4), None), ((1, 12, 20, 1), 2), ((2, 6, 10, 3), 1),
                                          ((1, 1, 1, 2), None)],
                         ids=["16x8", "8x32", "4x16", "1x8", "npot_12x20", "npot_6x10", "1x1"])
def test_mip_stack_bits(rng, shape, levels):
    """build_mip (two levels per launch) has the bits of float32 2x2 means taken level by
    level in row order; out= and mip_shape give the same stack."""
    tex = rng.uniform(0, 1, shape).astype(np.float32)
    b, c = shape[0], shape[3]
    want = [tex]
    while len(want) - 1 != levels and want[-1].shape[1:3] != (1, 1):
        t = want[-1]
        if t.shape[1] == 1:
            t = t.reshape(b, 1, -1, 2, c)
            want.append(np.float32(0.5) * (t[..., 0, :] + t[..., 1, :]))
        elif t.shape[2] == 1:
            t = t.reshape(b, -1, 2, 1, c)
            want.append(np.float32(0.5) * (t[:, :, 0] + t[:, :, 1]))
        else:
            want.append(np.float32(0.25) * (t[:, ::2, ::2] + t[:, ::2, 1::2] + t[:, 1::2, ::2] + t[:, 1::2, 1::2]))
    want = np.concatenate([w.reshape(-1, c) for w in want])
    stack = mesh.build_mip(wa(tex), levels)
    np.testing.assert_array_equal(stack.data.numpy(), want)
    out = wp.empty(mesh.mip_shape(shape, levels), dtype=wp.float32)
    mesh.build_mip(wa(tex), levels, out=out)
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("filter_mode", ["nearest", "linear-mipmap-linear"])
def test_channel_chunks(rng, filter_mode):
    # 20 channels move as two 10-vectors per texel (chunking): chunk c of texel t is vector
    # t * 2 + c of the stack, of the cotangent and of the gradients
    tex, uv, uv_da, bias = inputs(rng, tex_shape=(1, 8, 16, 20), batch=1)
    use_mip = "mipmap" in filter_mode
    da, b = (uv_da, bias) if use_mip else (None, None)
    ok = away_from_steps(uv, tex.shape, margin=2e-3)
    out = mesh.texture(wa(tex), wa(uv), wa(da) if use_mip else None, wa(b) if use_mip else None,
                       filter_mode=filter_mode).numpy()
    ref = ref_texture(t64(tex), t64(uv), t64(da) if use_mip else None, t64(b) if use_mip else None,
                      filter_mode, "wrap").numpy()
    assert np.mean(np.abs(out - ref).max(-1)[ok] < 1e-5) > 0.97  # as test_forward_matches_reference
    g = (rng.standard_normal((1, H, W, 20)) * ok[..., None]).astype(np.float32)
    got = mesh.texture_backward(wa(tex), wa(uv), wa(g), wa(da) if use_mip else None, wa(b) if use_mip else None,
                                filter_mode=filter_mode)
    want = reference_grads(tex, uv, da, b, filter_mode, "wrap", g)
    # tolerances as test_backward_filters (20 channels: dot products of 20 terms)
    np.testing.assert_allclose(got[0].numpy(), want[0], atol=2e-5 * np.abs(want[0]).max())
    if use_mip:
        np.testing.assert_allclose(got[1].numpy(), want[1], rtol=1e-4, atol=2e-4)
        np.testing.assert_allclose(got[3].numpy(), want[3], rtol=1e-3, atol=1e-4)


def test_backward_adds_into_given_gradients(rng):
    # grad_* arrays are added into (the tape accumulates several uses of an input)
    tex, uv, uv_da, bias = inputs(rng, tex_shape=(1, 8, 8, 4), batch=2)
    g = rng.standard_normal((2, H, W, 4)).astype(np.float32)
    args = (wa(tex), wa(uv), wa(g), wa(uv_da), wa(bias))
    fresh = [a.numpy() for a in mesh.texture_backward(*args)]
    base = [rng.standard_normal(a.shape).astype(np.float32) for a in fresh]
    got = mesh.texture_backward(*args, grad_tex=wa(base[0]), grad_uv=wa(base[1]), grad_uv_da=wa(base[2]),
                                grad_mip_level_bias=wa(base[3]))
    for name, a, b, f in zip(("tex", "uv", "uv_da", "bias"), got, base, fresh):
        np.testing.assert_allclose(a.numpy(), b + f, rtol=1e-6, atol=1e-6, err_msg=name)  # one float32 add


@needs_sm90_nvrtc
def test_sm90_code_moves_rgba_texels_as_vectors(tmp_path):
    # NVRTC compiles without a GPU. An RGBA texel, a cotangent and uv_da are one 128-bit
    # read-only load each, uv one 64-bit load; no vector indexed at run time spills to
    # local memory.
    from arc_warp._src.mesh.texture_kernels import MIP_LINEAR, make_mip_fold, make_tex_bwd, make_tex_fwd

    for kernel in (make_tex_fwd(MIP_LINEAR, 4, 1), make_tex_bwd("arc", MIP_LINEAR, 4, 1), make_mip_fold(4, 1)):
        ptx = sm90_ptx(kernel, tmp_path)
        assert "ld.global.nc.v4.f32" in ptx, kernel.key
        assert ".local" not in ptx, kernel.key
        if kernel.key.startswith("make_tex"):
            assert "ld.global.nc.v2.f32" in ptx, kernel.key
