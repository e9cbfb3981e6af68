"""Binning that cannot overflow or skip: intersection totals beyond one sort, huge and
overflowing covariances, never-inverted boxes, and the tile-exact footprint test (which
must bin every tile where a Gaussian passes the 1/255 cut, and fewer tiles than the box)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the float64 reference needs torch")
wp = pytest.importorskip("warp")

import arc_warp  # noqa: E402
from conftest import bins_of  # noqa: E402
from arc_warp._src.splat.geometry_funcs import ALPHA_MIN, RADIUS_MAX, TILE_SIZE, tile_bbox  # noqa: E402

from test_splat_reference import (  # noqa: E402
    arc_grads, arc_outputs, assert_forward_close, assert_grads_close, cotangents, reference,
    reference_grads, render_arc, robust_scene, torch_params, warp_inputs,
)


def one_camera(width, height, fx=None):
    fx = float(width) if fx is None else fx
    return arc_warp.Camera(fx, fx, 0.5 * width, 0.5 * height, width, height)


def axis_inputs(scales, opacities, depth=4.0, device="cpu") -> dict:
    """Gaussians on the optical axis at ``depth``, RGB white, as wp arrays; std-devs
    (s, s/2, s) turned 30 degrees about the view axis, so the 2D covariance has b != 0."""
    n = len(scales)
    means = np.zeros((n, 3), np.float32)
    means[:, 2] = depth
    half = np.radians(15.0)
    return dict(
        means=wp.array(means, dtype=wp.vec3, device=device, requires_grad=True),
        quats=wp.array(np.tile([np.cos(half), 0.0, 0.0, np.sin(half)], (n, 1)).astype(np.float32), dtype=wp.vec4,
                       device=device, requires_grad=True),
        scales=wp.array(np.asarray(scales, np.float32)[:, None] * np.float32([1.0, 0.5, 1.0]), dtype=wp.vec3,
                        device=device, requires_grad=True),
        opacities=wp.array(np.asarray(opacities, np.float32), dtype=wp.float32, device=device, requires_grad=True),
        colors=wp.array(np.ones((n, 3), np.float32), dtype=wp.vec3, device=device, requires_grad=True),
    )


def render_axis(scales, opacities, width=40, height=24, fx=1000.0, device="cpu"):
    """Renders ``axis_inputs`` with a long lens (fx px), so that scale s is 250 s px."""
    inputs = axis_inputs(scales, opacities, device=device)
    return arc_warp.render_gaussians(*inputs.values(), one_camera(width, height, fx))


def binned_pairs(out) -> set:
    """(tile, Gaussian) pairs in the sorted bins of a render."""
    ranges = bins_of(out).tile_ranges.numpy()
    ids = bins_of(out).gauss_ids.numpy()
    return {(t, int(ids[k])) for t, (s, e) in enumerate(ranges) for k in range(s, e)}


# --- totals one sort cannot hold -------------------------------------------------------


def test_4096_full_frame_total_refused_before_allocation(monkeypatch, device):
    # 65,546 Gaussians each covering all 256 x 256 tiles: 4,295,622,656 intersections,
    # which wrap to 655,360 in int32. The error must come before the sort's buffers exist.
    n, size = 65_546, 4096
    cam = one_camera(size, size)
    means = np.tile(np.float32([0.0, 0.0, 4.0]), (n, 1))
    args = [
        wp.array(means, dtype=wp.vec3, device=device),
        wp.array(np.tile(np.float32([1, 0, 0, 0]), (n, 1)), dtype=wp.vec4, device=device),
        wp.array(np.full((n, 3), 100.0, np.float32), dtype=wp.vec3, device=device),
        wp.array(np.full(n, 0.9, np.float32), dtype=wp.float32, device=device),
        wp.array(np.ones((n, 3), np.float32), dtype=wp.vec3, device=device),
    ]
    from arc_warp.splat import RenderState

    def no_sort(state, capacity):
        raise AssertionError(f"made the sort's buffers ({capacity} entries) before refusing the total")

    monkeypatch.setattr(RenderState, "sort_room", no_sort)
    with pytest.raises(ValueError, match=r"65546 Gaussians on a 4096x4096-pixel image .* make 4295622656 tile"):
        arc_warp.render_gaussians(*args, cam)


# --- huge, overflowing and NaN covariances ---------------------------------------------


@pytest.mark.parametrize("scale", [1e7, 1e8])
def test_huge_scale_covers_the_image(scale, device):
    # A finite but huge Gaussian (2.5e9 / 2.5e10 px std-dev: the radius exceeds int32, and
    # at 1e8 a * c overflows float32) is flat over the image: alpha = opacity everywhere,
    # every tile binned exactly once, radius clamped (never INT_MIN), gradients finite.
    out = render_axis([scale], [0.5], device=device)
    np.testing.assert_allclose(out.alpha.numpy(), 0.5, atol=1e-6)
    assert bins_of(out).n_isects == bins_of(out).tiles_x * bins_of(out).tiles_y
    assert binned_pairs(out) == {(t, 0) for t in range(bins_of(out).n_isects)}
    radii = out.radii.numpy()[0]
    assert 0 < radii[0] <= RADIUS_MAX and 0 < radii[1] <= RADIUS_MAX
    cot = wp.array(np.ones((24, 40, 3), np.float32), dtype=wp.vec3, device=device)
    grads = arc_warp.render_gaussians_backward(out, cot)
    for name in ("means", "quats", "scales", "opacities", "colors"):
        assert np.all(np.isfinite(getattr(grads, name).numpy())), name
    assert grads.opacities.numpy()[0] == pytest.approx(3 * 40 * 24, rel=1e-4)


def test_overflowing_covariance_is_culled():
    # scale 1e20 is finite, but its covariance overflows float32 (Inf, and NaN from Inf * 0
    # in the rotations): that Gaussian is culled, the other one renders as usual.
    out = render_axis([1e20, 1e-4], [0.9, 0.9])
    radii = out.radii.numpy()
    assert radii[0].tolist() == [0, 0] and radii[1].min() > 0
    assert {g for _, g in binned_pairs(out)} == {1}
    alpha = out.alpha.numpy()
    assert np.all(np.isfinite(alpha)) and 0.2 < alpha.max() < 0.91


def images_for(cameras, height, width, n):
    """Output arrays of a GaussianRenderer.forward."""
    return arc_warp.RenderImages(*(wp.empty((cameras, height, width), dtype=t) for t in (wp.vec3,) + (wp.float32,) * 3),
                                 wp.empty((cameras, n), dtype=wp.vec2), wp.empty((cameras, n), dtype=wp.vec2i))


@pytest.mark.parametrize("field", ["scales", "quats", "opacities"])
def test_nan_inputs_are_culled_by_the_projection(field):
    # render_gaussians reports NaN inputs from the flags; until then the projection must
    # cull them (no radius from int(NaN), no tiles) rather than count garbage.
    arrays = axis_inputs([0.01, 0.01], [0.9, 0.9])
    values = getattr(arrays[field], "numpy")()
    values[0] = np.nan
    arrays[field] = wp.array(values, dtype=arrays[field].dtype, device="cpu")
    g = arc_warp.check_gaussians(*arrays.values())
    renderer = arc_warp.GaussianRenderer(40, 24, g.count, capacity=64, record=False)
    images = images_for(1, 24, 40, g.count)
    status = renderer.forward(g, [one_camera(40, 24)], renderer.new_state(), images, check=False)
    assert status.read()[0, 1 + arc_warp.splat.BAD_SLOTS.index(field)] == 1  # flagged, for the host to raise
    radii, tiles = images.radii.numpy()[0], renderer._forward_scratch.views[0].numpy()  # the projection's tile counts
    assert radii[0].tolist() == [0, 0] and radii[1].min() > 0
    assert tiles[0] == 0


# --- boxes -----------------------------------------------------------------------------


@wp.kernel
def boxes_kernel(xy: wp.array(dtype=wp.vec2), radius: wp.array(dtype=wp.vec2i), tiles_x: int, tiles_y: int,
                 out: wp.array(dtype=wp.vec4i)):
    i = wp.tid()
    out[i] = tile_bbox(xy[i], radius[i], tiles_x, tiles_y)


def test_tile_boxes_are_never_inverted():
    vals = np.float32([-1e30, -3e9, -2.0**30, -1e5, -17.0, 0.0, 5.5, 63.9, 1e5, 2.0**30, 3e9, 1e30])
    # negative radii (what int() of a huge float gave) must not invert a box either
    rad = np.int32([-(2**31), -5, 0, 1, 7, 100, 2**20, int(RADIUS_MAX)])
    xy = np.stack(np.meshgrid(vals, vals), -1).reshape(-1, 2)
    xy = np.repeat(xy, len(rad), 0)
    r = np.tile(np.stack([rad, rad[::-1]], 1), (len(vals) ** 2, 1))
    out = wp.zeros(len(xy), dtype=wp.vec4i, device="cpu")
    wp.launch(boxes_kernel, dim=len(xy), inputs=[wp.array(xy, dtype=wp.vec2, device="cpu"),
              wp.array(r, dtype=wp.vec2i, device="cpu"), 4, 3], outputs=[out], device="cpu")
    b = out.numpy()
    assert np.all((0 <= b[:, 0]) & (b[:, 0] <= b[:, 2]) & (b[:, 2] <= 4))
    assert np.all((0 <= b[:, 1]) & (b[:, 1] <= b[:, 3]) & (b[:, 3] <= 3))


# --- tile-exact footprints -------------------------------------------------------------


def box_tile_count(out) -> int:
    """Intersections the opacity-aware boxes alone would make (the binning before tight tiles)."""
    xy = out.means2d.numpy().reshape(-1, 2).astype(np.float64)
    r = out.radii.numpy().reshape(-1, 2).astype(np.float64)
    tx, ty = bins_of(out).tiles_x, bins_of(out).tiles_y
    lo = np.clip(np.floor((xy - r) / TILE_SIZE), 0, [tx, ty])
    hi = np.clip(np.ceil((xy + r) / TILE_SIZE), 0, [tx, ty])
    n = np.prod(np.maximum(hi - lo, 0), axis=1)
    return int(n[r[:, 0] > 0].sum())


def elongated_scene(rng, n=300, width=160, height=96):
    """Small and elongated Gaussians (axes 0.3 to 60 px), all opacities."""
    from conftest import random_scene
    return random_scene(rng, n=n, width=width, height=height, size_px_range=(0.3, 60.0),
                        opacity_range=(0.006, 1.0), border_px=40.0)


def test_every_pixel_above_the_cut_is_binned(rng, device):
    # Dense float32 evaluation, written like the rasteriser: every pixel centre where a
    # Gaussian passes alpha >= 1/255 lies in a tile that Gaussian is binned to. The key
    # pass writes exactly what the count pass counted (no filler keys past the last tile).
    for _ in range(3):
        scene = elongated_scene(rng)
        out = render_arc(scene, device)
        pairs = binned_pairs(out)
        assert len(pairs) == bins_of(out).n_isects
        splats = bins_of(out).splats.numpy()
        geom = np.asarray(splats["geom"], np.float32)
        conic = np.asarray(splats["conic"], np.float32)
        radii = out.radii.numpy().reshape(-1, 2)
        tx = bins_of(out).tiles_x
        ys, xs = np.meshgrid(np.arange(scene.height, dtype=np.float32) + np.float32(0.5),
                             np.arange(scene.width, dtype=np.float32) + np.float32(0.5), indexing="ij")
        tiles = (ys.astype(int) // TILE_SIZE) * tx + xs.astype(int) // TILE_SIZE
        checked = 0
        for g in np.flatnonzero(radii[:, 0] > 0):
            dx = geom[g, 0] - xs
            dy = geom[g, 1] - ys
            power = np.float32(0.5) * (conic[g, 0] * dx * dx + conic[g, 2] * dy * dy) + conic[g, 1] * dx * dy
            alpha = geom[g, 2] * np.exp(-power)
            hit = (power >= 0) & (alpha >= np.float32(ALPHA_MIN))
            missing = {int(t) for t in np.unique(tiles[hit])} - {t for t, gg in pairs if gg == g}
            assert not missing, f"Gaussian {g} passes 1/255 in unbinned tiles {sorted(missing)}"
            checked += int(hit.sum())
        assert checked > 10_000


def test_tight_tiles_bin_fewer_and_render_the_same(rng):
    # The reference is dense (no tiles), so agreement shows the skipped tiles held nothing;
    # the scene is elongated enough that the footprint test drops many box tiles.
    scene = robust_scene(rng, n=80, width=96, height=64, sh_degree=1, size_px_range=(0.3, 30.0),
                         opacity_range=(0.02, 0.95))
    out = render_arc(scene, "cpu")
    boxed = box_tile_count(out)
    assert bins_of(out).n_isects < 0.8 * boxed, (bins_of(out).n_isects, boxed)
    with torch.no_grad():
        ref = reference(scene, torch_params(scene))
    assert_forward_close(arc_outputs(out), ref)
    cot = cotangents(rng, scene)
    assert_grads_close(arc_grads(out, cot, "cpu"), reference_grads(scene, cot))


def test_tile_lists_are_front_to_back(rng, device):
    # Depth sort, then a stable tile-only sort: each tile lists its Gaussians by (depth,
    # index), as one sort of (tile, depth) keys would. Quantised depths make many ties.
    scene = elongated_scene(rng, n=400)
    scene.means[:] = np.round(scene.means * 4) / 4
    out = render_arc(scene, device)
    depth = np.asarray(bins_of(out).splats.numpy()["geom"])[:, 3]
    ids = bins_of(out).gauss_ids.numpy()
    ties = 0
    for s, e in bins_of(out).tile_ranges.numpy():
        got = ids[s:e].tolist()
        assert got == sorted(got, key=lambda g: (depth[g], g))
        ties += len(got) - len(set(depth[got].tolist()))
    assert ties > 10


def test_projection_writes_the_depth_sort_and_write_keys_pads(rng):
    # The projection writes the depth keys (INT32_MAX without tiles) and the identity
    # order, and write_keys the filler tile from the total up to the sort size: no passes
    # of their own. Their scratch is zeroed first, so an entry left unwritten reads as the
    # nearest depth, Gaussian 0 or tile 0 and shows in the order or the ranges.
    from arc_warp._src.splat.bin_kernels import INT32_MAX

    scene = elongated_scene(rng)
    scene.means[:] = np.round(scene.means * 4) / 4  # depth ties
    scene.opacities[::7] = 0.001  # culled
    g = arc_warp.check_gaussians(*warp_inputs(scene, "cpu").values())
    n, capacity = g.count, 6000
    renderer = arc_warp.GaussianRenderer(scene.width, scene.height, n, capacity=capacity, record=False)
    state, images = renderer.new_state(), images_for(1, scene.height, scene.width, n)
    state.sort_room(capacity)
    # the scratch and the state zeroed first: an entry left unwritten reads as depth 0, Gaussian 0 or tile 0
    for owner in (renderer._scratch(False).owner, *state.owners):
        owner.zero_()
    camera = arc_warp.Camera(scene.fx, scene.fy, scene.cx, scene.cy, scene.width, scene.height,
                             world_to_camera=scene.world_to_camera)
    flags = renderer.forward(g, [camera], state, images).read()[0]
    tiles_per_gauss, order, cum_tiles, _ = renderer._forward_scratch.views
    cs = state.cameras[0]

    tiles = tiles_per_gauss.numpy().copy()
    radius = images.radii.numpy()[0][:, 0]
    bits = np.asarray(cs.splats.numpy()["geom"], np.float32)[:, 3].view(np.int32)
    want_keys = np.where(tiles > 0, bits, INT32_MAX)
    assert (radius == 0).any() and ((tiles == 0) & (radius > 0)).any()  # culled; footprint off every tile
    assert len(set(want_keys[tiles > 0].tolist())) < np.count_nonzero(tiles)  # ties
    want_order = np.argsort(want_keys, kind="stable")
    np.testing.assert_array_equal(order.numpy()[:n], want_order)
    np.testing.assert_array_equal(cum_tiles.numpy(), np.cumsum(tiles[want_order]))
    total = int(tiles.sum())
    assert flags[0] == total and total > 2 * n and capacity - total > 4 * n  # pads past the depth keys
    assert flags[arc_warp.splat.OVERFLOW_SLOT] == 0  # no overflow

    ranges, ids = cs.ranges.numpy(), cs.sort_ids.numpy()
    listed = ranges[ranges[:, 1] > ranges[:, 0]]
    assert listed[0, 0] == 0 and listed[-1, 1] == total and np.all(listed[1:, 0] == listed[:-1, 1])
    np.testing.assert_array_equal(np.bincount(ids[:total], minlength=n), tiles)
    rank = np.argsort(want_order)
    for s, e in listed:
        assert np.all(np.diff(rank[ids[s:e]]) > 0)  # front to back


def test_image_too_large_to_index_is_refused():
    # 50000^2 px = 9.8M tiles: the rasteriser's int32 thread ids (one per pixel) would wrap
    from arc_warp._src.splat.renderer import tile_grid

    assert tile_grid(46_336, 46_336) == (2896, 2896)
    with pytest.raises(ValueError, match="50000x50000 image has 9765625 tiles"):
        tile_grid(50_000, 50_000)
