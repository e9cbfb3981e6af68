"""interpolate against the float64 reference: values, pixel derivatives, gradients into
attr / rast / rast_db in every reduce mode, broadcasting, tape and validation."""

import numpy as np
import pytest
import torch
import warp as wp

import arc_warp.mesh as mesh
from mesh_scenes import REDUCE_CASES, REDUCE_IDS, cpu_blocks, random_mesh, t64, wa
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
