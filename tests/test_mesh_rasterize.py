"""rasterize against the brute-force float64 reference: coverage, depth test, barycentrics,
their pixel derivatives, the backward into positions in every reduce mode, and edge cases."""

import numpy as np
import pytest
import torch
import warp as wp

import arc_warp.mesh as mesh
from arc_warp import Workspace
from mesh_scenes import REDUCE_CASES, REDUCE_IDS, cpu_blocks, random_mesh, t64, wa
from reference_mesh import barycentrics, rasterize as ref_rasterize

wp.config.log_level = wp.LOG_WARNING
H, W = 13, 17  # not multiples of 16, not square

# Coverage is exact (integer edge tests on both sides); pixels whose depth test is within
# this (in z/w) of flipping may differ between nvdiffrast's 32-bit fixed point and the
# reference's float64 plane, which agree to ~1e-6.
MARGIN = 1e-4


def run(pos, tri, **kw):
    rast, db = mesh.rasterize(wa(pos), wa(tri, wp.int32), (H, W), **kw)
    return rast.numpy(), db.numpy()


def test_forward_matches_reference(rng):
    pos, tri = random_mesh(rng)
    rast, db = run(pos, tri)
    ref, ref_db, margin = (x.numpy() for x in ref_rasterize(t64(pos), torch.from_numpy(tri), H, W))
    clear = margin > MARGIN
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(rast[..., 3][clear], ref[..., 3][clear])
    hit = clear & (ref[..., 3] > 0)
    assert hit.sum() > 100
    # float32 barycentrics of O(1) edge functions: a few ulps of 1, amplified by 1/|S|
    np.testing.assert_allclose(rast[hit][:, :3], ref[hit][:, :3], atol=2e-5)
    np.testing.assert_allclose(db[hit], ref_db[hit], rtol=1e-4, atol=1e-5)
    assert np.all(rast[ref[..., 3] == 0][:, 3][(clear[ref[..., 3] == 0])] == 0)


def test_big_triangles_match_reference(rng):
    # 48x40 pixels: triangles spanning most of the image exceed the per-thread box limit
    # and take the per-pixel path, mixed with small ones that stay per-triangle.
    h, w = 40, 48
    pos, tri = random_mesh(rng, batch=2, n_tri=10, spread=1.3)
    small, small_tri = random_mesh(rng, batch=2, n_tri=30, spread=0.05)
    small[..., :2] += rng.uniform(-0.8, 0.8, (2, 1, 2)).astype(np.float32) * small[..., 3:]
    pos = np.concatenate([pos, small], 1)
    tri = np.concatenate([tri, small_tri + pos.shape[1] - small.shape[1]]).astype(np.int32)
    rast, db = mesh.rasterize(wa(pos), wa(tri, wp.int32), (h, w))
    ref, ref_db, margin = (x.numpy() for x in ref_rasterize(t64(pos), torch.from_numpy(tri), h, w))
    clear = margin > MARGIN
    np.testing.assert_array_equal(rast.numpy()[..., 3][clear], ref[..., 3][clear])
    ids = np.unique(rast.numpy()[..., 3])
    assert (ids > 10).any() and ((ids > 0) & (ids <= 10)).any()  # both paths drew
    hit = clear & (ref[..., 3] > 0)
    np.testing.assert_allclose(rast.numpy()[hit][:, :3], ref[hit][:, :3], atol=2e-5)


def test_scratch_is_left_cleared(rng, monkeypatch):
    """The resolve leaves a Rasterizer's depth keys and big-triangle count cleared, so no
    forward fills them, and a mesh rasterised after another (big triangles queued)
    matches a fresh call: nothing of the earlier mesh leaks into it."""
    h, w = 40, 48
    scenes = [random_mesh(rng, batch=2, n_tri=10, spread=1.3), random_mesh(rng, batch=2, n_tri=10, spread=0.4)] * 2
    op = mesh.Rasterizer((h, w), 2, 10, device="cpu")
    fills = []
    fill, zero = wp.array.fill_, wp.array.zero_
    monkeypatch.setattr(wp.array, "fill_", lambda self, value: fills.append(value) or fill(self, value))
    monkeypatch.setattr(wp.array, "zero_", lambda self: fills.append(0) or zero(self))
    got = []
    for pos, tri in scenes:
        got.append([a.numpy() for a in op.forward(wa(pos), wa(tri, wp.int32))])
        assert op._big_count.numpy()[0] == 0
        assert (op._keys.numpy() == np.iinfo(np.int64).max).all()
    assert fills == []
    for (pos, tri), g in zip(scenes, got):
        want = [a.numpy() for a in mesh.rasterize(wa(pos), wa(tri, wp.int32), (h, w))]
        assert (want[0][..., 3] > 0).any()
        for a, b in zip(g, want):
            np.testing.assert_array_equal(a, b)


def test_deterministic_bits(rng):
    pos, tri = random_mesh(rng, n_tri=40)  # many overlaps
    a, _ = run(pos, tri)
    b, _ = run(pos, tri)
    assert a.tobytes() == b.tobytes()


def test_range_mode_uses_global_ids(rng):
    pos, tri = random_mesh(rng, batch=1)
    ranges = np.array([[0, 5], [5, 7]], np.int32)
    rast, _ = mesh.rasterize(wa(pos[0]), wa(tri, wp.int32), (H, W), ranges=ranges)
    ids = rast.numpy()[..., 3]
    assert ids[0].max() <= 5 and set(np.unique(ids[1])) - {0} <= set(range(6, 13))
    full, _, _ = ref_rasterize(t64(pos), torch.from_numpy(tri[0:5]), H, W)
    np.testing.assert_array_equal(ids[0] > 0, full.numpy()[0, ..., 3] > 0)


def test_watertight_shared_edges():
    # A square split along its diagonal whose corners and diagonal pass exactly
    # through pixel centres: every pixel inside is covered exactly once.
    h = w = 8
    c = [(2 * k + 1) / 8 - 1 for k in (1, 6)]  # NDC of pixel centres 1 and 6
    pos = np.array([[c[0], c[0], 0, 1], [c[1], c[0], 0, 1], [c[1], c[1], 0, 1], [c[0], c[1], 0, 1]], np.float32)
    for tri in ([[0, 1, 2], [0, 2, 3]], [[0, 2, 1], [2, 0, 3]]):
        rast, _ = mesh.rasterize(wa(pos[None]), wa(np.array(tri, np.int32), wp.int32), (h, w))
        ids = rast.numpy()[0, ..., 3]
        inner = np.zeros((h, w), bool)
        inner[2:6, 2:6] = True  # strictly inside the square
        assert np.all(ids[inner] > 0), ids
        # each triangle alone: coverage sets are disjoint (pixels on the diagonal go to one)
        alone = [mesh.rasterize(wa(pos[None]), wa(np.array([t], np.int32), wp.int32), (h, w))[0].numpy()[0, ..., 3] > 0
                 for t in tri]
        assert not (alone[0] & alone[1]).any()
        np.testing.assert_array_equal(alone[0] | alone[1], ids > 0)
        assert all(alone[0][k, k] or alone[1][k, k] for k in range(2, 6))


def grid_pos(verts, size=8):
    """Clip-space positions [1, V, 4] float32 of vertices (x, y, z/w) given on the 1/16-pixel
    grid of a size x size image (see :func:`grid_ids`), w = 1."""
    v = np.asarray(verts, np.float64)
    return np.concatenate([v[:, :2] / (8 * size), v[:, 2:3], np.ones((len(v), 1))], 1).astype(np.float32)[None]


def grid_ids(verts, tri, size=8):
    """Triangle ids [size, size] of an image whose vertices are given on nvdiffrast's grid
    of 1/16 pixel (x, y from the image centre, so 64 units per NDC unit at size 8; pixel
    (4, 4) has its centre at (8, 8)), with z/w and w = 1; checked against the reference."""
    pos = grid_pos(verts, size)
    tri = np.asarray(tri, np.int32)
    rast = mesh.rasterize(wa(pos), wa(tri, wp.int32), (size, size))[0].numpy()[0, ..., 3]
    ref, _, margin = (x.numpy()[0] for x in ref_rasterize(t64(pos), torch.from_numpy(tri), size, size))
    np.testing.assert_array_equal(rast[margin > MARGIN], ref[..., 3][margin > MARGIN])
    return rast


def test_snapping_decides_the_owner():
    # The edge A -> B shared by L (id 1) and R (id 2) passes 0.06 pixel right of pixel
    # (4, 4)'s centre (8, 8), so unsnapped the centre is in L. Snapped (A's x 18.5 goes to
    # 18, half to even, B's 1.2 to 1) the edge passes left of it: nvdiffrast gives it to R.
    a, b = (18.5, -40, 0), (1.2, 40, 0)
    ids = grid_ids([a, b, (-40, 0, 0), (48, 0, 0)], [[2, 0, 1], [3, 1, 0]])
    assert ids[4, 4] == 2
    assert ids[4, 3] == 1 and ids[4, 5] == 2


@pytest.mark.parametrize("axis", [0, 1])
def test_fill_rule_on_a_snapped_edge(axis):
    # The edge shared by two triangles lies 0.3/16 pixel past the centres of row 4
    # (axis 1) or column 4 (axis 0): unsnapped they are on the first triangle's side;
    # snapped the edge runs through them and the fill rule gives them to the triangle on
    # the +y (+x) side.
    xy = lambda p: p if axis == 1 else (p[1], p[0], p[2])  # noqa: E731
    verts = [xy(p) for p in [(-40, 8.3, 0), (40, 8.3, 0), (0, -40, 0), (0, 56, 0)]]
    tri = [[2, 1, 0], [3, 0, 1]] if axis == 1 else [[2, 0, 1], [3, 1, 0]]
    ids = grid_ids(verts, tri)
    line = ids[4, 2:6] if axis == 1 else ids[2:6, 4]
    assert np.all(line == 2), ids
    line = ids[3, 2:6] if axis == 1 else ids[2:6, 3]
    assert np.all(line == 1), ids


def test_equal_depths_go_to_the_later_triangle():
    # Duplicates, one facing away: every covered pixel is a depth tie, won by the last.
    ids = grid_ids([(-40, -40, 0.3), (40, -40, 0.3), (0, 40, 0.3)], [[0, 1, 2], [0, 2, 1], [1, 2, 0]])
    assert (ids == 3).sum() > 10 and set(np.unique(ids)) == {0, 3}


def test_depth_of_the_snapped_triangle():
    # A slopes in z/w by -0.01 per grid unit and is 0.001 behind the flat B (z/w = 0) at
    # pixel (4, 4)'s centre; its vertices are 0.4 units right of the grid, so snapped it
    # moves left and is 0.003 in front there: nvdiffrast's depth test gives A.
    xs = [-39.6, 40.4, 0.4]
    a = [(x, y, -0.01 * (x - 8) + 0.001) for x, y in zip(xs, [-40, -40, 48])]
    ids = grid_ids(a + [(-48, -48, 0), (48, -48, 0), (0, 48, 0)], [[0, 1, 2], [3, 4, 5]])
    assert ids[4, 4] == 1 and ids[4, 3] == 2


def test_wide_image_in_viewport_tiles(rng):
    # 4100 pixels wide: nvdiffrast draws it in three viewports of 1368 pixels, each with
    # its own snapping grid and frustum clipping.
    h, w = 3, 4100
    pos, tri = random_mesh(rng, batch=1, n_tri=8, spread=1.0)
    pos[..., 1] *= 0.2  # thin triangles across the three rows
    rast, _ = mesh.rasterize(wa(pos), wa(tri, wp.int32), (h, w))
    ref, _, margin = (x.numpy() for x in ref_rasterize(t64(pos), torch.from_numpy(tri), h, w))
    clear = margin > MARGIN
    assert clear.mean() > 0.9 and (ref[..., 3] > 0).mean() > 0.1
    np.testing.assert_array_equal(rast.numpy()[..., 3][clear], ref[..., 3][clear])


def test_near_plane_and_behind_camera():
    # One triangle crosses w = 0 (one vertex behind the eye; its z/w reaches -1, the near
    # plane, before w does), one lies wholly behind.
    pos = np.array([[[-0.5, -0.5, 0.0, 1.0], [0.5, -0.5, 0.0, 1.0], [0.0, 0.5, -1.0, -0.5],
                     [-0.5, -0.5, 0.5, -1.0], [0.5, -0.5, 0.5, -1.0], [0.0, 0.5, 0.5, -2.0]]], np.float32)
    tri = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    rast, _ = run(pos, tri)
    ref, _, margin = (x.numpy() for x in ref_rasterize(t64(pos), torch.from_numpy(tri), H, W))
    clear = margin > MARGIN
    np.testing.assert_array_equal(rast[..., 3][clear], ref[..., 3][clear])
    assert 0 < (rast[..., 3] == 1).sum() and not (rast[..., 3] == 2).any()
    zw = rast[..., 2][rast[..., 3] > 0]
    assert np.all((zw >= -1) & (zw <= 1))


def test_corrupt_and_degenerate_triangles_are_skipped(rng):
    pos, tri = random_mesh(rng, batch=1, n_tri=4)
    nan_vertex = np.array([[[np.nan, 0.0, 0.0, 1.0]]], np.float32)
    pos_bad = np.concatenate([pos, nan_vertex], 1)
    v_nan = pos.shape[1]
    extra = [[v_nan, tri[0, 1], tri[0, 2]],  # NaN vertex
             [tri[0, 0], tri[0, 0], tri[0, 1]]]  # zero area
    rast, _ = run(pos_bad, np.concatenate([tri, extra]).astype(np.int32))
    ref, _ = run(pos, tri)
    np.testing.assert_array_equal(rast, ref)
    # out-of-range indices (tests/test_mesh_ops.py): an error, the kernels leave them out
    bad = np.concatenate([tri, [[0, 1, v_nan + 5], [-1, 2, 3]]]).astype(np.int32)
    with pytest.raises(ValueError, match=rf"rasterize: triangle 4 of tri has a vertex index outside \[0, {v_nan + 1}"):
        run(pos_bad, bad)
    op = mesh.Rasterizer((H, W), 1, len(bad), device="cpu")
    np.testing.assert_array_equal(op.forward(wa(pos_bad), wa(bad, wp.int32), check=False)[0].numpy(), ref)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 1)])
def test_tiny_images(rng, shape):
    pos, tri = random_mesh(rng, batch=1)
    rast, db = mesh.rasterize(wa(pos), wa(tri, wp.int32), shape)
    assert rast.shape == (1, *shape, 4) and db.shape == (1, *shape, 4)
    ref, _, margin = (x.numpy() for x in ref_rasterize(t64(pos), torch.from_numpy(tri), *shape))
    clear = margin > MARGIN
    np.testing.assert_array_equal(rast.numpy()[..., 3][clear], ref[..., 3][clear])
    assert np.isfinite(rast.numpy()).all() and np.isfinite(db.numpy()).all()


def test_empty_mesh():
    rast, db = mesh.rasterize(wa(np.zeros((1, 0, 4), np.float32)), wa(np.zeros((0, 3), np.int32), wp.int32), (4, 5))
    assert rast.shape == (1, 4, 5, 4) and not rast.numpy().any() and not db.numpy().any()


def test_validation_errors(rng):
    pos, tri = random_mesh(rng, batch=1)
    with pytest.raises(TypeError, match="pos"):
        mesh.rasterize(pos, wa(tri, wp.int32), (4, 4))
    with pytest.raises(ValueError, match="last axis 4"):
        mesh.rasterize(wa(pos[..., :3]), wa(tri, wp.int32), (4, 4))
    with pytest.raises(TypeError, match="int32"):
        mesh.rasterize(wa(pos), wa(tri.astype(np.float32)), (4, 4))
    with pytest.raises(ValueError, match="ranges"):
        mesh.rasterize(wa(pos[0]), wa(tri, wp.int32), (4, 4))
    with pytest.raises(ValueError, match="outside"):
        mesh.rasterize(wa(pos[0]), wa(tri, wp.int32), (4, 4), ranges=np.array([[3, 100]]))
    with pytest.raises(ValueError, match="resolution"):
        mesh.rasterize(wa(pos), wa(tri, wp.int32), (0, 4))
    with pytest.raises(ValueError, match="reduce mode"):
        mesh.rasterize(wa(pos), wa(tri, wp.int32), (4, 4), reduce="fast")


def reference_pos_grad(pos, tri, ids, g, gdb, clamp=True):
    """float64 dL/dpos [B, V, 4] of L = sum(g (u, v)) + sum(gdb rast_db) at fixed triangle
    ids [B, H, W] (g, gdb [B, H, W, 4]); ``clamp``: of u, v clamped as the forward writes them."""
    p = t64(pos).requires_grad_(True)
    h, w = ids.shape[1:]
    out = barycentrics(p, torch.from_numpy(tri), torch.from_numpy(ids).round().long(), h, w, clamp=clamp)
    loss = (out[0] * t64(g[..., 0])).sum() + (out[1] * t64(g[..., 1])).sum()
    for k in range(4):
        loss = loss + (out[2 + k] * t64(gdb[..., k])).sum()
    loss.backward()
    return p.grad.numpy()


@pytest.mark.parametrize("blocks,mode,threshold", REDUCE_CASES, ids=REDUCE_IDS)
def test_backward_matches_reference(rng, blocks, mode, threshold):
    pos, tri = random_mesh(rng)
    rast, _ = run(pos, tri)
    g = rng.standard_normal(rast.shape).astype(np.float32)
    gdb = rng.standard_normal(rast.shape).astype(np.float32) * 0.1
    with cpu_blocks(blocks):
        got = mesh.rasterize_backward(wa(pos), wa(tri, wp.int32), wa(rast), wa(g), wa(gdb), reduce=mode,
                                      threshold=threshold).numpy()
    want = reference_pos_grad(pos, tri, rast[..., 3], g, gdb)
    assert np.abs(want).max() > 1.0
    # float32 sums of ~200 per-pixel terms each O(|g| / |S|): 1e-4 relative to the largest
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max())
    assert not got[..., 2].any()  # z gets no gradient


@pytest.mark.parametrize("order", [[2, 1, 0], [0, 2, 1], [1, 0, 2]], ids=["u<0", "v<0", "u+v>1"])
def test_backward_where_snapping_covers_a_centre_outside(rng, order):
    # As in test_snapping_decides_the_owner (A at 18.4, snapped to 18): pixel (4, 4)'s
    # centre is 0.08 grid units outside R, across the edge A -> B it shares with L, but
    # inside snapped R. The resolve clamps R's barycentric of C (u, v or 1 - u - v < 0),
    # so the backward must differentiate the clamp: the gradient matches finite
    # differences of the forward, not the derivative of the unclamped barycentrics.
    a, b, c, d = (18.4, -40, 0), (1.2, 40, 0), (48, 0, 0), (-40, 0, 0)
    pos = grid_pos([a, b, c, d])
    tri = np.array([[3, 0, 1], order], np.int32)
    rast, _ = mesh.rasterize(wa(pos), wa(tri, wp.int32), (8, 8))
    ids = rast.numpy()[..., 3]
    assert ids[0, 4, 4] == 2
    g = rng.standard_normal((1, 8, 8, 4)).astype(np.float32)
    gdb = rng.standard_normal((1, 8, 8, 4)).astype(np.float32) * 0.1
    got = mesh.rasterize_backward(wa(pos), wa(tri, wp.int32), rast, wa(g), wa(gdb)).numpy()
    want = reference_pos_grad(pos, tri, ids, g, gdb)
    unclamped = reference_pos_grad(pos, tri, ids, g, gdb, clamp=False)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=1e-4 * scale)
    assert np.abs(unclamped - want).max() > 0.05 * scale  # the clamp matters here

    def loss(q):  # float64 sum of the float32 forward, at the same coverage
        r, db = (x.numpy().astype(np.float64) for x in mesh.rasterize(wa(q), wa(tri, wp.int32), (8, 8)))
        np.testing.assert_array_equal(r[..., 3], ids)
        return (g[..., :2] * r[..., :2]).sum() + (gdb * db).sum()

    eps = 1e-3  # 0.064 grid units: no vertex crosses a rounding boundary of the snap
    for v in range(4):
        for k in (0, 1, 3):
            dp = np.zeros_like(pos)
            dp[0, v, k] = eps
            fd = (loss(pos + dp) - loss(pos - dp)) / (2 * eps)
            # float32 u, v (~1e-7) over 2 eps, summed over 64 pixels
            assert abs(got[0, v, k] - fd) <= 2e-3 * scale, (v, k, got[0, v, k], fd)


def clamp_mask(rast):
    """[B, H, W] bool: the pixels whose u, v the resolve clamps (rast's u, v on the triangle's
    border: u = 0, v = 0 or u + v = 1 to rounding), as benchmarks/mesh.py's clamp_mask."""
    u, v = rast[..., 0].astype(np.float64), rast[..., 1].astype(np.float64)
    return (rast[..., 3] > 0) & ((u <= 1e-6) | (v <= 1e-6) | (u + v >= 1 - 1e-6))


def ours_and_unclamped(pos, tri, rast, g, gdb):
    """(our dL/dpos, the float64 one of the unclamped barycentrics) at ``rast``'s triangles."""
    got = mesh.rasterize_backward(wa(pos), wa(tri, wp.int32), wa(rast), wa(g), wa(gdb)).numpy()
    return got, reference_pos_grad(pos, tri, rast[..., 3], g, gdb, clamp=False)


def test_backward_off_the_clamps_pixels_is_the_unclamped_one(rng):
    # With the upstream gradient zero at the pixels whose u, v the resolve clamps, the
    # gradient is that of the unclamped barycentrics, as nvdiffrast differentiates them: the
    # clamp's derivative adds nothing elsewhere. benchmarks/mesh.py (clamp_mask)
    # compares the two libraries so; with those pixels' gradient kept, the clamp matters.
    pos, tri = random_mesh(rng, n_tri=200, n_vert=300, spread=1.0)  # slivers: snapping covers centres outside
    rast, _ = run(pos, tri)
    clamped = clamp_mask(rast)
    assert clamped.sum() >= 3
    g = rng.standard_normal(rast.shape).astype(np.float32)
    gdb = rng.standard_normal(rast.shape).astype(np.float32) * 0.1
    keep = ~clamped[..., None]
    got, want = ours_and_unclamped(pos, tri, rast, g * keep, gdb * keep)
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())
    got, want = ours_and_unclamped(pos, tri, rast, g, gdb)
    assert np.abs(got - want).max() > 1e-2 * np.abs(want).max()


def tiny_triangle_grid(rng, n):
    """A screen-filling grid of 2 n^2 triangles (pos [1, V, 4], tri [F, 3]), its vertices
    jittered by up to 0.2 of a cell, at w in [0.8, 1.6]."""
    t = np.linspace(-1.0, 1.0, n + 1)
    x, y = (c + rng.uniform(-0.2, 0.2, c.shape) * (t[1] - t[0]) for c in np.meshgrid(t, t))
    w = rng.uniform(0.8, 1.6, x.shape)
    z = rng.uniform(-0.5, 0.5, x.shape)
    pos = np.stack([x * w, y * w, z * w, w], -1).reshape(1, -1, 4).astype(np.float32)
    k = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    a, b, c, d = k[:-1, :-1], k[:-1, 1:], k[1:, 1:], k[1:, :-1]
    return pos, np.concatenate([np.stack([a, b, c], -1), np.stack([a, c, d], -1)]).reshape(-1, 3).astype(np.int32)


def test_backward_of_tiny_triangles_clamps_where_the_forward_does(rng):
    # 15k triangles of ~4 pixels (the density of bench_mesh's 1M-triangle grid at 2048^2):
    # small against their distance from the NDC origin, where edge functions from absolute
    # coordinates nearly cancel (c_i against a_i X + b_i Y; float32 u off by 1e-5, up to
    # 5e-4). The backward takes u, v and the lines relative to the pixel centre, as the
    # resolve: it clamps exactly where the forward did (from absolute coordinates a few
    # centres near an edge fell on its other side, the clamp's derivative dropping their u or
    # v: errors 1e-2 to 2e-1 of the largest) and its derivatives are as precise as float32
    # sums allow (~1e-5 of the largest; 4e-4 from absolute coordinates).
    pos, tri = tiny_triangle_grid(rng, 88)
    rast = mesh.rasterize(wa(pos), wa(tri, wp.int32), (248, 264))[0].numpy()
    keep = ~clamp_mask(rast)[..., None]
    assert keep.mean() > 0.9
    g = rng.standard_normal(rast.shape).astype(np.float32)
    gdb = rng.standard_normal(rast.shape).astype(np.float32) * 0.1
    got, want = ours_and_unclamped(pos, tri, rast, g * keep, gdb * keep)
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())


def test_tape_and_finite_differences(rng):
    pos, tri = random_mesh(rng, batch=1, n_tri=3)
    g = rng.standard_normal((1, H, W, 4)).astype(np.float32)
    p = wa(pos, requires_grad=True)
    tape = wp.Tape()
    with tape:
        rast, db = mesh.rasterize(p, wa(tri, wp.int32), (H, W), grad_db=False)
    rast.grad.assign(g)
    tape.backward()
    ids = rast.numpy()[..., 3]
    got = p.grad.numpy()
    # central differences in float64 of sum(g * (u, v)) at fixed visibility
    def loss(q):
        u, v, *_ = barycentrics(t64(q), torch.from_numpy(tri), torch.from_numpy(ids).round().long(), H, W)
        return float((u * t64(g[..., 0])).sum() + (v * t64(g[..., 1])).sum())
    eps = 1e-4
    for vi, c in [(tri[0, 0], 0), (tri[1, 1], 1), (tri[2, 2], 3)]:
        d = np.zeros_like(pos, dtype=np.float64)
        d[0, vi, c] = eps
        fd = (loss(pos + d) - loss(pos - d)) / (2 * eps)
        # O(eps^2) truncation of a smooth rational function; float32 grad sums ~1e-5 rel
        assert abs(got[0, vi, c] - fd) <= 1e-3 * max(1.0, abs(fd)), (vi, c, got[0, vi, c], fd)


def test_workspace_and_out_match_fresh_arrays(rng):
    """With a Workspace (its Rasterizer keeps scratch and prepared launches) and out=
    arrays, repeated forward + tape backward give the fresh-array results and allocate
    nothing after the first call."""
    pos, tri = random_mesh(rng)
    g = wa(rng.standard_normal((2, H, W, 4)).astype(np.float32))
    p, t = wa(pos, requires_grad=True), wa(tri, wp.int32)

    def step(**kw):
        p.grad.zero_()
        tape = wp.Tape()
        with tape:
            rast, db = mesh.rasterize(p, t, (H, W), **kw)
        tape.backward(grads={rast: g, db: g})
        return rast.numpy(), db.numpy(), p.grad.numpy()

    want = step()
    ws = Workspace("cpu")
    out = (wp.empty((2, H, W, 4), dtype=wp.float32, requires_grad=True),
           wp.empty((2, H, W, 4), dtype=wp.float32, requires_grad=True))
    step(workspace=ws, out=out)
    allocator = wp.get_device("cpu").default_allocator
    allocate, sizes = allocator.allocate, []
    allocator.allocate = lambda size: sizes.append(size) or allocate(size)
    try:
        got = step(workspace=ws, out=out)
    finally:
        allocator.allocate = allocate
    assert sizes == []
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="workspace"):
        mesh.rasterize(wa(pos), wa(tri, wp.int32), (H, W), workspace="cpu")
    with pytest.raises(ValueError, match=r"out\[0\]"):
        mesh.rasterize(wa(pos), wa(tri, wp.int32), (H, W), out=(out[0][:1], out[1]))
