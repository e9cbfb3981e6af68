"""interpolate against the float64 reference: values, pixel derivatives, gradients into
attr / rast / rast_db in every reduce mode, broadcasting, tape and validation."""

import numpy as np
import pytest
import torch
import warp as wp

import arc_warp.mesh as mesh
from mesh_scenes import REDUCE_CASES, REDUCE_IDS, cpu_blocks, needs_sm90_nvrtc, random_mesh, sm90_ptx, t64, wa
from reference_mesh import interpolate as ref_interpolate

wp.config.log_level = wp.LOG_WARNING
H, W = 11, 14


def scene(rng, batch=2, attrs=5, attr_batch=None):
    pos, tri = random_mesh(rng, batch=batch)
    rast, db = mesh.rasterize(wa(pos), wa(tri, wp.int32), (H, W))
    attr = rng.standard_normal((attr_batch or batch, pos.shape[1], attrs)).astype(np.float32)
    return attr, rast.numpy(), db.numpy(), tri


@pytest.mark.parametrize("attr_batch", [None, 1], ids=["per_image", "broadcast"])
def test_forward_matches_reference(rng, attr_batch):
    attr, rast, db, tri = scene(rng, attr_batch=attr_batch)
    diff = [3, -1, 0]
    out, out_da = mesh.interpolate(wa(attr), wa(rast), wa(tri, wp.int32), wa(db), diff_attrs=diff)
    ref, ref_da = ref_interpolate(t64(attr), t64(rast), torch.from_numpy(tri), t64(db), [3, 4, 0])
    assert (rast[..., 3] > 0).sum() > 50
    # float32 of a 3-term convex combination of O(1) values: a few ulps
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-5)
    np.testing.assert_allclose(out_da.numpy(), ref_da.numpy(), atol=1e-5)
    _, none_da = mesh.interpolate(wa(attr), wa(rast), wa(tri, wp.int32))
    assert none_da.shape == (*rast.shape[:3], 0)


@pytest.mark.parametrize("attrs", [5, 20], ids=["A5", "A20_chunked"])
@pytest.mark.parametrize("blocks,mode,threshold", REDUCE_CASES, ids=REDUCE_IDS)
def test_backward_matches_reference(rng, blocks, mode, threshold, attrs):
    if attrs == 20 and mode not in ("atomic", "warp"):
        pytest.skip("chunking is mode-independent; two modes cover it")
    attr, rast, db, tri = scene(rng, attrs=attrs, attr_batch=1)
    diff = [1, 2]
    g = rng.standard_normal((*rast.shape[:3], attrs)).astype(np.float32)
    gda = rng.standard_normal((*rast.shape[:3], 4)).astype(np.float32)
    with cpu_blocks(blocks):
        ga, gr, gdb = mesh.interpolate_backward(wa(attr), wa(rast), wa(tri, wp.int32), wa(g), wa(db), wa(gda), diff,
                                                reduce=mode, threshold=threshold)
        # attr's gradient not wanted: no scatter, the per-pixel gradients unchanged
        skip = mesh.interpolate_backward(wa(attr), wa(rast), wa(tri, wp.int32), wa(g), wa(db), wa(gda), diff,
                                         reduce=mode, threshold=threshold, attr_grad=False)
    assert skip[0] is None
    np.testing.assert_array_equal(skip[1].numpy(), gr.numpy())
    np.testing.assert_array_equal(skip[2].numpy(), gdb.numpy())
    a, r, d = (t64(x).requires_grad_(True) for x in (attr, rast, db))
    out, out_da = ref_interpolate(a, r, torch.from_numpy(tri), d, diff)
    ((out * t64(g)).sum() + (out_da * t64(gda)).sum()).backward()
    # attr: float32 sums of ~150 per-pixel terms of O(1): 1e-5 relative to the largest
    np.testing.assert_allclose(ga.numpy(), a.grad.numpy(), atol=1e-5 * np.abs(a.grad.numpy()).max() + 1e-5)
    hit = rast[..., 3] > 0
    np.testing.assert_allclose(gr.numpy()[..., :2][hit], r.grad.numpy()[..., :2][hit], atol=1e-4)
    assert not gr.numpy()[..., 2:].any() and not gr.numpy()[~hit].any()
    np.testing.assert_allclose(gdb.numpy(), d.grad.numpy(), atol=1e-4)


def offset_view(x: np.ndarray) -> wp.array:
    """A CPU float32 wp.array of ``x`` starting one float into its buffer: off 8/16-byte
    alignment, so on CUDA the vector loads and stores take their float fallback."""
    buf = wa(np.concatenate([[0.0], np.ravel(x)]))
    return wp.array(ptr=buf.ptr + 4, dtype=wp.float32, shape=x.shape, device=buf.device, deleter=lambda *_: buf)


# A -> (k, chunks): 1 -> (1, 1), 3 -> (3, 1), 8 -> (8, 1), 20 -> (10, 2); diff lists with a
# repeated index (the link table's chains), negatives and every attribute
WIDTHS = [(1, [0, 0]), (3, [2, 0, -1, 2]), (8, "all"), (20, [19, 3, 3, 12, 0])]


@pytest.mark.parametrize("attrs,diff", WIDTHS, ids=[f"A{a}" for a, _ in WIDTHS])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "offset_views"])
def test_widths_and_views(rng, attrs, diff, aligned):
    """Every chunking with derivatives (repeated indices included), forward and backward,
    from arrays at their allocation's start or one float in (inputs, cotangents and given
    outputs)."""
    attr, rast, db, tri = scene(rng, attrs=attrs)
    idx = list(range(attrs)) if diff == "all" else [j % attrs for j in diff]
    g = rng.standard_normal((*rast.shape[:3], attrs)).astype(np.float32)
    gda = rng.standard_normal((*rast.shape[:3], 2 * len(idx))).astype(np.float32)
    arr = wa if aligned else offset_view
    out = (arr(np.zeros((*rast.shape[:3], attrs), np.float32)), arr(np.zeros(gda.shape, np.float32)))
    out, out_da = mesh.interpolate(arr(attr), arr(rast), wa(tri, wp.int32), arr(db), diff_attrs=diff, out=out)
    ga, gr, gdb = mesh.interpolate_backward(arr(attr), arr(rast), wa(tri, wp.int32), arr(g), arr(db), arr(gda), diff)
    a, r, d = (t64(x).requires_grad_(True) for x in (attr, rast, db))
    ref, ref_da = ref_interpolate(a, r, torch.from_numpy(tri), d, idx)
    ((ref * t64(g)).sum() + (ref_da * t64(gda)).sum()).backward()
    # tolerances as in test_forward_matches_reference / test_backward_matches_reference
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(out_da.numpy(), ref_da.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(ga.numpy(), a.grad.numpy(), atol=1e-5 * np.abs(a.grad.numpy()).max() + 1e-5)
    hit = rast[..., 3] > 0
    np.testing.assert_allclose(gr.numpy()[..., :2][hit], r.grad.numpy()[..., :2][hit], atol=1e-4)
    np.testing.assert_allclose(gdb.numpy(), d.grad.numpy(), atol=1e-4)


def test_backward_without_derivative_cotangent(rng):
    """diff_attrs and rast_db given but no cotangent of out_da: the kernel without the
    derivative terms, the same gradients as a zero cotangent, rast_db's gradient zero."""
    attr, rast, db, tri = scene(rng, attrs=4)
    g = rng.standard_normal((*rast.shape[:3], 4)).astype(np.float32)
    zero_da = np.zeros((*rast.shape[:3], 4), np.float32)
    ga, gr, gdb = mesh.interpolate_backward(wa(attr), wa(rast), wa(tri, wp.int32), wa(g), wa(db), None, [1, 3])
    za, zr, zdb = mesh.interpolate_backward(wa(attr), wa(rast), wa(tri, wp.int32), wa(g), wa(db), wa(zero_da), [1, 3])
    np.testing.assert_allclose(ga.numpy(), za.numpy(), atol=1e-6)  # float32 sums of the same terms, reordered
    np.testing.assert_array_equal(gr.numpy(), zr.numpy())
    assert not gdb.numpy().any() and not zdb.numpy().any()


@needs_sm90_nvrtc
def test_sm90_code_moves_attributes_as_vectors(tmp_path):
    # NVRTC compiles without a GPU. 8 attributes (k = 8) are two 128-bit read-only loads
    # per vertex and cotangent, and the forward's output two 128-bit stores; 20 (k = 10)
    # go in 64-bit pieces; the derivative links are walked without local memory.
    from arc_warp._src.mesh.interp_kernels import make_interp_bwd, make_interp_fwd

    for k, chunks, vector in ((8, 1, "v4"), (10, 2, "v2")):
        for with_da in (False, True):
            for kernel in (make_interp_fwd(k, chunks, with_da), make_interp_bwd("arc", k, chunks, with_da)):
                ptx = sm90_ptx(kernel, tmp_path)
                assert f"ld.global.nc.{vector}.f32" in ptx, kernel.key
                assert ".local" not in ptx, kernel.key
                if kernel.key.startswith("make_interp_fwd"):
                    assert f"st.global.{vector}.f32" in ptx, kernel.key


def test_tape_chains_into_rasterize(rng):
    pos, tri = random_mesh(rng, batch=1, n_tri=5)
    attr = wa(rng.standard_normal((pos.shape[1], 3)), requires_grad=True)
    p = wa(pos, requires_grad=True)
    tape = wp.Tape()
    with tape:
        rast, db = mesh.rasterize(p, wa(tri, wp.int32), (H, W))
        out, _ = mesh.interpolate(attr, rast, wa(tri, wp.int32))
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.grad.assign(g)
    tape.backward()
    # the same chain by hand through the explicit backwards
    _, grast, _ = mesh.interpolate_backward(attr, rast, wa(tri, wp.int32), wa(g))
    gpos = mesh.rasterize_backward(p, wa(tri, wp.int32), rast, grast)
    np.testing.assert_allclose(p.grad.numpy(), gpos.numpy(), rtol=1e-6, atol=1e-7)
    assert np.abs(attr.grad.numpy()).sum() > 0


def test_validation(rng):
    attr, rast, db, tri = scene(rng, batch=2)
    with pytest.raises(ValueError, match="minibatch"):
        mesh.interpolate(wa(np.zeros((3, attr.shape[1], 2), np.float32)), wa(rast), wa(tri, wp.int32))
    with pytest.raises(ValueError, match="rast_db"):
        mesh.interpolate(wa(attr), wa(rast), wa(tri, wp.int32), diff_attrs=[0])
    with pytest.raises(ValueError, match="diff_attrs"):
        mesh.interpolate(wa(attr), wa(rast), wa(tri, wp.int32), wa(db), diff_attrs=[7])
    with pytest.raises(ValueError, match="rast"):
        mesh.interpolate(wa(attr), wa(rast[..., :3]), wa(tri, wp.int32))


def test_corrupt_ids_give_zero(rng):
    attr, rast, db, tri = scene(rng, batch=1)
    rast[0, 0, 0, 3] = 1000.0  # no such triangle
    out, _ = mesh.interpolate(wa(attr), wa(rast), wa(tri, wp.int32))
    assert not out.numpy()[0, 0, 0].any()


def test_range_mode(rng):
    pos, tri = random_mesh(rng, batch=1)
    ranges = np.array([[0, 6], [6, 6]], np.int32)
    rast, db = mesh.rasterize(wa(pos[0]), wa(tri, wp.int32), (H, W), ranges=ranges)
    attr = rng.standard_normal((pos.shape[1], 3)).astype(np.float32)  # [V, A], shared by both images
    out, _ = mesh.interpolate(wa(attr), rast, wa(tri, wp.int32))
    ref, _ = ref_interpolate(t64(attr[None]), t64(rast.numpy()), torch.from_numpy(tri))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-5)
    g = rng.standard_normal(out.shape).astype(np.float32)
    ga, _, _ = mesh.interpolate_backward(wa(attr), rast, wa(tri, wp.int32), wa(g))
    a = t64(attr[None]).requires_grad_(True)
    (ref_interpolate(a, t64(rast.numpy()), torch.from_numpy(tri))[0] * t64(g)).sum().backward()
    np.testing.assert_allclose(ga.numpy(), a.grad.numpy()[0], atol=1e-5)
