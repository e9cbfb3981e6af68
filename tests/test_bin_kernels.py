"""The binning kernels against plain oracles.

``write_keys_staged`` stages a block's tile keys in shared memory and copies them out
side by side. Its output, before the sort, must be entry for entry what ``write_keys``
(one thread walks each Gaussian's tiles; the reference tests check its bins against a
dense evaluation) writes on the same device, so with the same float arithmetic: for a
sort sized to the total, padded past it, and cut short inside a Gaussian; for blocks
whose range spans several staging rounds, a Gaussian whose keys alone do, and small
splats; with one-thread CPU blocks and with emulated 256-thread blocks.

``tile_ranges`` finds each tile's range of the sorted keys by binary search: it must be
numpy's ``searchsorted`` of every tile, with the filler tile and the sort's headroom past
the total."""

import numpy as np
import pytest

wp = pytest.importorskip("warp")

from arc_warp._src.arc.intrinsics import cpu_launch_guard  # noqa: E402
from arc_warp._src.splat.bin_kernels import STAGE_ENTRIES, tile_ranges, write_keys, write_keys_staged  # noqa: E402
from arc_warp._src.splat.renderer import WRITE_KEYS_BLOCK, tile_grid  # noqa: E402
from arc_warp._src.splat.geometry_funcs import Splat2D  # noqa: E402
from arc_warp._src.splat.project_kernels import count_tiles  # noqa: E402


@wp.kernel(enable_backward=False)
def _count(splats: wp.array(dtype=Splat2D), radii: wp.array(dtype=wp.vec2i), tiles_x: int, tiles_y: int,
           counts: wp.array(dtype=wp.int32)):
    i = wp.tid()
    counts[i] = wp.int32(count_tiles(splats[i].geom, splats[i].conic, radii[i], tiles_x, tiles_y))


def _splats(rng, n, width, height, sigma_px):
    """n random splats over a width x height image (std-devs ``sigma_px``, turned at
    random), and their box radii (3 sigma along the axes, as the projection gives)."""
    sx = rng.uniform(*sigma_px, n)
    sy = sx * rng.uniform(0.1, 1.0, n)
    t = rng.uniform(0, np.pi, n)
    c, s = np.cos(t), np.sin(t)
    cov = np.stack([c * c * sx**2 + s * s * sy**2, c * s * (sx**2 - sy**2), s * s * sx**2 + c * c * sy**2], 1)
    det = cov[:, 0] * cov[:, 2] - cov[:, 1] ** 2
    conic = np.stack([cov[:, 2] / det, -cov[:, 1] / det, cov[:, 0] / det, np.zeros(n)], 1)
    geom = np.stack([rng.uniform(0, width, n), rng.uniform(0, height, n), rng.uniform(0.02, 1.0, n),
                     rng.uniform(1.0, 5.0, n)], 1)
    radii = np.ceil(3.0 * np.sqrt(cov[:, [0, 2]])).astype(np.int32)
    return geom.astype(np.float32), conic.astype(np.float32), radii


def _written(device, geom, conic, radii, grid, capacity_of, kernel):
    """Keys and ids that ``kernel`` writes for the splats in a random depth order, into
    buffers pre-filled with -1, the tile counts in that order, and their total;
    ``capacity_of(total)`` sizes the sort."""
    n = len(geom)
    packed = np.zeros(n, Splat2D.numpy_dtype())
    packed["geom"], packed["conic"] = geom, conic
    splats = wp.array(packed, dtype=Splat2D, device=device)
    radii_w = wp.array(radii, dtype=wp.vec2i, device=device)
    counts = wp.empty(n, dtype=wp.int32, device=device)
    wp.launch(_count, n, [splats, radii_w, *grid, counts], device=device)
    order = np.random.default_rng(1).permutation(n).astype(np.int32)
    cum = np.cumsum(counts.numpy()[order].astype(np.int64))
    total = int(cum[-1])
    capacity = capacity_of(total)
    keys = wp.array(np.full(capacity, -1, np.int32), device=device)
    ids = wp.array(np.full(capacity, -1, np.int32), device=device)
    args = [wp.array(order, device=device), splats, radii_w]
    args += [counts, wp.array(cum, device=device), *grid, capacity, keys, ids]
    if kernel is write_keys_staged:
        with cpu_launch_guard(device):
            wp.launch(kernel, -(-n // WRITE_KEYS_BLOCK) * WRITE_KEYS_BLOCK, args, device=device,
                      block_dim=WRITE_KEYS_BLOCK)
    else:
        wp.launch(kernel, n, args, device=device)
    return keys.numpy(), ids.numpy(), counts.numpy()[order], total


@pytest.mark.parametrize("case", ["blocks", "one_gaussian", "small"])
@pytest.mark.parametrize("cut", ["exact", "padded", "short"])
def test_staged_keys_are_each_gaussians_walk(device, cpu_blocks, case, cut):
    rng = np.random.default_rng(0)
    if case == "blocks":  # ~17 tiles per splat, so a 256-Gaussian block stages several rounds
        width, height = 640, 480
        geom, conic, radii = _splats(rng, 700, width, height, (4.0, 40.0))
    elif case == "small":  # a few tiles per splat: one round per block
        width, height = 640, 480
        geom, conic, radii = _splats(rng, 700, width, height, (0.5, 3.0))
    else:  # one splat alone over more tiles than a round holds, among small ones
        width, height = 1088, 1088
        geom, conic, radii = _splats(rng, 300, width, height, (1.0, 6.0))
        geom[7] = [544.0, 544.0, 0.9, 2.0]
        conic[7] = [1e-6, 0.0, 1e-6, 0.0]
        radii[7] = [3000, 3000]
    grid = tile_grid(width, height)
    capacity_of = {"exact": lambda t: t, "padded": lambda t: t + 3 * len(geom) + 5,
                   "short": lambda t: t - min(2 * STAGE_ENTRIES // 3, t // 3)}[cut]
    keys, ids, counts, total = _written(device, geom, conic, radii, grid, capacity_of, write_keys_staged)
    want_keys, want_ids, _, _ = _written(device, geom, conic, radii, grid, capacity_of, write_keys)
    # the scenes reach what they are for
    per_block = np.add.reduceat(counts, np.arange(0, len(counts), WRITE_KEYS_BLOCK))
    if case == "blocks":
        assert per_block.max() > 2 * STAGE_ENTRIES
    elif case == "small":
        assert per_block.max() < STAGE_ENTRIES // 2
    else:
        assert counts.max() > STAGE_ENTRIES
    n_tiles = grid[0] * grid[1]
    real = min(total, len(keys))
    np.testing.assert_array_equal(keys[:real], want_keys[:real])
    np.testing.assert_array_equal(ids[:real], want_ids[:real])
    # past the total: the filler tile (ids are not read there)
    np.testing.assert_array_equal(keys[real:], np.full(len(keys) - real, n_tiles))
    assert (keys[:real] < n_tiles).all() and (ids[:real] >= 0).all()


@pytest.mark.parametrize("headroom", [0, 400])
@pytest.mark.parametrize("layout", ["gaps", "dense", "one_tile", "all_filler"])
def test_tile_ranges_are_searchsorted(device, layout, headroom):
    rng = np.random.default_rng(3)
    n_tiles, n_isects = 97, 1500
    if layout == "gaps":  # empty tiles at both ends and between
        tiles = rng.choice(np.arange(5, 90, 3), n_isects)
    elif layout == "dense":
        tiles = rng.integers(0, n_tiles, n_isects)
    elif layout == "one_tile":
        tiles = np.full(n_isects, n_tiles - 1)
    else:
        tiles = np.zeros(0, np.int64)
    keys = np.concatenate([np.sort(tiles), np.full(headroom, n_tiles)]).astype(np.int32)  # the filler tile
    total = len(tiles)
    ranges = wp.array(np.full((n_tiles, 2), -1, np.int32), dtype=wp.vec2i, device=device)
    wp.launch(tile_ranges, n_tiles + 1, [wp.array(keys, device=device), len(keys), ranges], device=device)
    got = ranges.numpy()
    want = np.stack([np.searchsorted(keys, np.arange(n_tiles)), np.searchsorted(keys, np.arange(n_tiles) + 1)], 1)
    np.testing.assert_array_equal(got, want)
    assert got[-1, 1] == total and (got[:, 1] >= got[:, 0]).all()
