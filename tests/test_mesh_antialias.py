"""antialias against the float64 reference: blended colours, gradients into colour and
positions in every reduce mode, topology hash, tape, validation."""

import numpy as np
import pytest
import torch
import warp as wp

import arc_warp.mesh as mesh
from arc_warp._src.mesh.primitives import uv_sphere
from mesh_scenes import REDUCE_CASES, REDUCE_IDS, cpu_blocks, t64, wa
from reference_mesh import antialias as ref_antialias

wp.config.log_level = wp.LOG_WARNING
H, W = 12, 14


def scene(rng, batch=2):
    """A closed sphere (silhouettes from back-facing neighbours) plus one loose triangle
    (boundary edges), seen from slightly different places per image."""
    v, _, f = uv_sphere(6, 8)
    pos = []
    for _ in range(batch):
        c = rng.uniform(-0.2, 0.2, 3)
        s = v * 0.55 + c
        w = 2.0 + s[:, 2]
        pos.append(np.concatenate([s[:, :2] * w[:, None] / 2.0 * 1.6, (s[:, 2:3] * 0.3), w[:, None]], 1))
    pos = np.stack(pos)
    loose = np.array([[-0.9, -0.9, -0.5, 1.0], [-0.2, -0.8, -0.5, 1.0], [-0.7, -0.1, -0.5, 1.0]])
    pos = np.concatenate([pos, np.repeat(loose[None], batch, 0)], 1).astype(np.float32)
    n = v.shape[0]
    tri = np.concatenate([f, [[n, n + 1, n + 2]]]).astype(np.int32)
    rast, _ = mesh.rasterize(wa(pos), wa(tri, wp.int32), (H, W))
    color = rng.uniform(0, 1, (batch, H, W, 3)).astype(np.float32)
    return color, rast.numpy(), pos, tri


def test_forward_matches_reference(rng):
    color, rast, pos, tri = scene(rng)
    topo = mesh.antialias_construct_topology_hash(wa(tri, wp.int32))
    out = mesh.antialias(wa(color), wa(rast), wa(pos), wa(tri, wp.int32), topology_hash=topo).numpy()
    ref = ref_antialias(t64(color), t64(rast), t64(pos), torch.from_numpy(tri), topo.opposite.numpy()).numpy()
    changed = np.abs(ref - color).max(-1) > 0
    assert changed.sum() > 15  # silhouettes exist
    # float32 crossing points of O(10)-pixel coordinates: ~1e-6 relative
    np.testing.assert_allclose(out, ref, atol=2e-5)


def test_topology_hash():
    tri = np.array([[0, 1, 2], [2, 1, 3], [0, 0, 4], [4, 5, 6]], np.int32)
    opp = mesh.antialias_construct_topology_hash(wa(tri, wp.int32)).opposite.numpy()
    np.testing.assert_array_equal(opp[0], [3, -1, -1])  # edge (1, 2) is shared with triangle 1
    np.testing.assert_array_equal(opp[1], [-1, -1, 0])
    np.testing.assert_array_equal(opp[2], [-1, -1, -1])  # degenerate: ignored
    np.testing.assert_array_equal(opp[3], [-1, -1, -1])


@pytest.mark.parametrize("blocks,mode,threshold", REDUCE_CASES, ids=REDUCE_IDS)
def test_backward_matches_reference(rng, blocks, mode, threshold):
    color, rast, pos, tri = scene(rng)
    topo = mesh.antialias_construct_topology_hash(wa(tri, wp.int32))
    g = rng.standard_normal(color.shape).astype(np.float32)
    with cpu_blocks(blocks):
        gc, gp = mesh.antialias_backward(wa(color), wa(rast), wa(pos), wa(tri, wp.int32), wa(g), topo,
                                         pos_gradient_boost=1.0, reduce=mode, threshold=threshold)
    c, p = t64(color).requires_grad_(True), t64(pos).requires_grad_(True)
    ref = ref_antialias(c, t64(rast), p, torch.from_numpy(tri), topo.opposite.numpy())
    (ref * t64(g)).sum().backward()
    np.testing.assert_allclose(gc.numpy(), c.grad.numpy(), atol=1e-5)
    want = p.grad.numpy()
    assert np.abs(want).max() > 0.1
    # float32 sums of a few edge terms of O(10): 1e-4 relative to the largest
    np.testing.assert_allclose(gp.numpy(), want, atol=1e-4 * np.abs(want).max())


def test_tape_and_boost(rng):
    color, rast, pos, tri = scene(rng, batch=1)
    c = wa(color, requires_grad=True)
    p = wa(pos, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = mesh.antialias(c, wa(rast), p, wa(tri, wp.int32), pos_gradient_boost=3.0)
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.grad.assign(g)
    tape.backward()
    gc, gp = mesh.antialias_backward(wa(color), wa(rast), wa(pos), wa(tri, wp.int32), wa(g))
    np.testing.assert_allclose(c.grad.numpy(), gc.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(p.grad.numpy(), 3.0 * gp.numpy(), rtol=1e-5, atol=1e-6)


def test_validation(rng):
    color, rast, pos, tri = scene(rng, batch=1)
    with pytest.raises(ValueError, match="color"):
        mesh.antialias(wa(color[:, :5]), wa(rast), wa(pos), wa(tri, wp.int32))
    with pytest.raises(ValueError, match="minibatch"):
        mesh.antialias(wa(np.repeat(color, 2, 0)), wa(np.repeat(rast, 2, 0)), wa(np.repeat(pos, 3, 0)),
                       wa(tri, wp.int32))
    with pytest.raises(TypeError, match="topology_hash"):
        mesh.antialias(wa(color), wa(rast), wa(pos), wa(tri, wp.int32), topology_hash=tri)
