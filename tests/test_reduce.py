"""ARC accumulators and scatter_add against a float64 numpy reference, on the CPU.

With ``enable_cpu_blocks`` on and ``block_dim=256`` the CPU emulates 32-lane warps,
so these tests run the real reduce-scatter, match-any grouping and threshold logic.
Float32 tolerance: each sum has at most a few hundred float32 terms of magnitude ~1,
so the reordering error is far below 1e-4 absolute.
"""


import numpy as np
import pytest
import warp as wp

import arc_warp
from conftest import cpu_blocks_enabled as cpu_blocks
from arc_warp._src.arc.intrinsics import (
    active_mask,
    ballot,
    lane_id,
    match_any,
    reduce_scatter,
    reduce_scatter_plan,
    shfl_int,
)

wp.config.log_level = wp.LOG_WARNING
DEVICE = "cpu"
ATOL = 1e-4
Vec9 = wp.types.vector(9, wp.float32)
DTYPES = [(wp.float32, 1), (wp.vec2, 2), (wp.vec3, 3), (wp.vec4, 4), (Vec9, 9)]


def index_pattern(name: str, n: int, m: int, rng) -> np.ndarray:
    if name == "all_same":
        return np.full(n, m // 2)
    if name == "all_distinct":
        return np.arange(n) % m
    if name == "mixed_groups":  # a few targets per warp, in random lane positions
        return rng.integers(0, 3, n) * 5 + (np.arange(n) // 32) % 4
    if name == "runs":  # sorted runs of different lengths, as in a tile list
        return np.repeat(np.arange(m), rng.integers(1, 40, m))[:n]
    raise ValueError(name)


def run_scatter(dtype, k, idx, vals, m, mode, threshold):
    dest = wp.zeros(m, dtype=dtype, device=DEVICE)
    values = wp.array(vals if k > 1 else vals[:, 0], dtype=dtype, device=DEVICE)
    arc_warp.scatter_add(dest, wp.array(idx.astype(np.int32), device=DEVICE), values, mode=mode, threshold=threshold)
    return dest.numpy().reshape(m, k)


PATTERNS = ["all_same", "all_distinct", "mixed_groups", "runs"]
# (mode, threshold): arc at T=1 (always reduce), 6 (mixed), 33 (never reduce).
MODE_CASES = [("atomic", 1), ("warp", 1), ("serial", 1), ("arc", 1), ("arc", 6), ("arc", 33)]


@pytest.mark.parametrize("blocks", [False, True], ids=["lane_per_warp", "emulated_warps"])
@pytest.mark.parametrize("dtype,k", DTYPES, ids=[f"k{k}" for _, k in DTYPES])
def test_modes_match_numpy(blocks, dtype, k):
    rng = np.random.default_rng(k)
    m = 40
    with cpu_blocks(blocks):
        for pattern in PATTERNS:
            # 300 = one full block and a partial one (partially active warps).
            for n in (300, 77):
                idx = index_pattern(pattern, n, m, rng)
                n = len(idx)
                vals = rng.standard_normal((n, k)).astype(np.float32)
                ref = np.zeros((m, k))
                np.add.at(ref, idx, vals.astype(np.float64))
                for mode, t in MODE_CASES:
                    out = run_scatter(dtype, k, idx, vals, m, mode, t)
                    np.testing.assert_allclose(out, ref, atol=ATOL, err_msg=f"{pattern} n={n} {mode} T={t}")


def test_floor_adds_nothing():
    dest = wp.zeros(4, dtype=wp.vec3, device=DEVICE)
    vals = wp.array(np.ones((10, 3), np.float32), dtype=wp.vec3, device=DEVICE)
    arc_warp.scatter_add(dest, wp.zeros(10, dtype=wp.int32, device=DEVICE), vals, mode="floor")
    assert not dest.numpy().any()


@pytest.mark.parametrize("uniform_index", [False, True])
def test_inactive_lanes_contribute_nothing(uniform_index):
    # Half the lanes of every warp are invalid: their values must not leak into the sum.
    add = arc_warp.accumulator(wp.vec2, "arc", uniform_index)

    @wp.kernel(enable_backward=False, module="unique")
    def half_valid(dest: wp.array(dtype=wp.vec2), threshold: int):
        i = wp.tid()
        add(dest, 0, wp.vec2(1.0, 1000.0), i % 2 == 0, threshold)

    for blocks in (False, True):
        with cpu_blocks(blocks):
            for t in (1, 16, 17):
                dest = wp.zeros(1, dtype=wp.vec2, device=DEVICE)
                wp.launch(half_valid, dim=256, inputs=[dest, t], device=DEVICE, block_dim=256)
                np.testing.assert_allclose(dest.numpy()[0], [128.0, 128000.0])


@pytest.mark.parametrize("mode", ["warp", "serial", "arc"])
def test_plan_then_compute_pattern(mode):
    # The documented kernel pattern: plan, then compute inside the branch that adds.
    plan = arc_warp.warp_plan(mode)
    reduce = arc_warp.warp_reducer(wp.vec3, mode)

    @wp.kernel(enable_backward=False, module="unique")
    def pattern(idx: wp.array(dtype=int), x: wp.array(dtype=wp.vec3), dest: wp.array(dtype=wp.vec3), threshold: int):
        i = wp.tid()
        valid = i % 3 != 0
        if plan(valid, threshold):
            reduce(dest, idx[i], 2.0 * x[i], valid, threshold)
        elif valid:
            wp.atomic_add(dest, idx[i], 2.0 * x[i])

    rng = np.random.default_rng(3)
    n, m = 512, 7
    idx = rng.integers(0, m, n) // 3 + (np.arange(n) // 64)  # mixed groups, some uniform stretches
    m = int(idx.max()) + 1
    x = rng.standard_normal((n, 3)).astype(np.float32)
    keep = np.arange(n) % 3 != 0
    ref = np.zeros((m, 3))
    np.add.at(ref, idx[keep], 2.0 * x[keep].astype(np.float64))
    for blocks in (False, True):
        with cpu_blocks(blocks):
            for t in (1, 9, 33):
                dest = wp.zeros(m, dtype=wp.vec3, device=DEVICE)
                wp.launch(pattern, dim=n, inputs=[wp.array(idx, dtype=int, device=DEVICE), wp.array(x, dtype=wp.vec3, device=DEVICE), dest, t],
                          device=DEVICE, block_dim=256)
                np.testing.assert_allclose(dest.numpy(), ref, atol=ATOL, err_msg=f"blocks={blocks} T={t}")


def _keyed_kernel(mode):
    """Three adds per lane to different targets (a triangle's vertices), planned once by the first."""
    plan = arc_warp.keyed_plan(mode)
    add = arc_warp.planned_accumulator(wp.vec4, mode)

    @wp.kernel(enable_backward=False, module="unique")
    def keyed(tris: wp.array(dtype=wp.vec3i), x: wp.array(dtype=wp.vec4), dest: wp.array(dtype=wp.vec4),
              planned_out: wp.array(dtype=int), threshold: int):
        i = wp.tid()
        f = tris[i]
        valid = f[0] >= 0
        if not valid:
            f = wp.vec3i(0, 0, 0)
        planned = plan(f[0], valid, threshold)
        if planned:
            planned_out[i] = 1
        add(dest, f[0], x[i], valid, threshold, planned)
        add(dest, f[1], 2.0 * x[i], valid, threshold, planned)
        add(dest, f[2], 3.0 * x[i], valid, threshold, planned)

    return keyed


def _keyed_case(n=512, seed=4):
    """Pixels' triangles: runs of one triangle (shared by many lanes) and scattered ones; -1 = no triangle."""
    rng = np.random.default_rng(seed)
    tri_of = np.where(np.arange(n) // 64 % 2 == 0, np.arange(n) // 24, rng.integers(0, 200, n))
    tri_of[rng.random(n) < 0.2] = -1
    verts = rng.integers(0, 60, (200 + n, 3))
    tris = np.where(tri_of[:, None] >= 0, verts[np.maximum(tri_of, 0)], -1).astype(np.int32)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    ref = np.zeros((60, 4))
    for j, w in enumerate((1.0, 2.0, 3.0)):
        keep = tris[:, 0] >= 0
        np.add.at(ref, tris[keep, j], w * x[keep].astype(np.float64))
    return tris, x, ref


@pytest.mark.parametrize("mode", ["atomic", "warp", "serial", "arc", "floor"])
def test_keyed_plan_and_planned_adds_sum_every_target(mode):
    # Several adds per lane to different targets, one plan per warp: the sums are exact in
    # every mode (floor: nothing), with and without emulated warps, at T = 1, 9 and 33.
    tris, x, ref = _keyed_case()
    kernel = _keyed_kernel(mode)
    for blocks in (False, True):
        with cpu_blocks(blocks):
            for t in (1, 9, 33):
                dest = wp.zeros(60, dtype=wp.vec4, device=DEVICE)
                planned = wp.zeros(len(tris), dtype=int, device=DEVICE)
                wp.launch(kernel, dim=len(tris), inputs=[wp.array(tris, dtype=wp.vec3i, device=DEVICE),
                          wp.array(x, dtype=wp.vec4, device=DEVICE), dest, planned, t], device=DEVICE, block_dim=256)
                expect = np.zeros_like(ref) if mode == "floor" else ref
                np.testing.assert_allclose(dest.numpy(), expect, atol=ATOL, err_msg=f"blocks={blocks} T={t}")
                if mode in ("atomic", "floor") or not blocks:
                    assert not planned.numpy().any()  # per-lane modes and one-lane CPU warps never reduce


@pytest.mark.gpu
def test_keyed_plan_reduces_only_warps_with_a_shared_key():
    # On the GPU, arc plans a warp only if some key has >= T valid lanes (and the warp passes
    # keyed_plan's screen); warp always.
    if not wp.is_cuda_available():
        pytest.skip("needs a CUDA device")
    tris, x, ref = _keyed_case()
    valid = tris[:, 0] >= 0
    for mode in ("arc", "warp"):
        kernel = _keyed_kernel(mode)
        for t in (2, 9, 33):
            dest = wp.zeros(60, dtype=wp.vec4, device="cuda:0")
            planned = wp.zeros(len(tris), dtype=int, device="cuda:0")
            wp.launch(kernel, dim=len(tris), inputs=[wp.array(tris, dtype=wp.vec3i, device="cuda:0"),
                      wp.array(x, dtype=wp.vec4, device="cuda:0"), dest, planned, t], device="cuda:0", block_dim=256)
            np.testing.assert_allclose(dest.numpy(), ref, atol=ATOL)
            got = planned.numpy().reshape(-1, 32).max(axis=1)
            for w in range(len(got)):
                lanes = slice(w * 32, (w + 1) * 32)
                keys = tris[lanes, 0][valid[lanes]]
                counts = np.unique(keys, return_counts=True)[1] if len(keys) else np.zeros(1)
                if mode == "warp":
                    want = len(keys) > 0
                else:
                    want = len(keys) >= t and counts.max() >= t and _screen(np.maximum(tris[lanes, 0], 0), t)
                assert got[w] == int(want), f"{mode} T={t} warp {w}: keys {keys}"


def _screen(keys, t):
    """keyed_plan's screen on the 32 keys of a warp (see its docstring)."""
    return (np.sum(keys[:-1] == keys[1:]) >= t - 4) and (np.sum(keys[:-2] == keys[2:]) >= t - 8)


@pytest.mark.gpu
def test_keyed_plan_screen_keeps_keys_in_four_runs():
    # The screen before the match-any keeps every warp whose shared key lies in <= 4 runs of
    # consecutive lanes (rows of an 8 x 4 pixel patch), however few lanes it has beyond T,
    # and skips interleaved keys (every other lane) and many small groups.
    if not wp.is_cuda_available():
        pytest.skip("needs a CUDA device")
    lanes = np.arange(32)
    cases = {  # name: (keys of one warp, T, planned)
        "12 lanes, 3 rows of 4": (np.where(lanes % 8 < 4, 1, 100 + lanes) * (lanes < 24) + (lanes >= 24) * (200 + lanes), 12, True),
        "12 lanes, 4 rows of 3": (np.where(lanes % 8 < 3, 1, 100 + lanes), 12, True),
        "16 lanes, interleaved": (np.where(lanes % 2 == 0, 1, 100 + lanes), 12, False),
        "groups of 4": (lanes // 4, 12, False),
        "all distinct": (lanes, 2, False),
        "one key": (np.zeros(32, dtype=int), 32, True),
    }
    kernel = _keyed_kernel("arc")
    for name, (keys, t, want) in cases.items():
        assert _screen(keys, t) or not want, name  # the cases say what the docstring claims
        tris = np.stack([keys, keys, keys], 1).astype(np.int32)
        x = np.ones((32, 4), np.float32)
        dest = wp.zeros(int(tris.max()) + 1, dtype=wp.vec4, device="cuda:0")
        planned = wp.zeros(32, dtype=int, device="cuda:0")
        wp.launch(kernel, dim=32, inputs=[wp.array(tris, dtype=wp.vec3i, device="cuda:0"),
                  wp.array(x, dtype=wp.vec4, device="cuda:0"), dest, planned, t], device="cuda:0", block_dim=32)
        assert planned.numpy().max() == int(want), name
        np.testing.assert_allclose(dest.numpy()[:, 0], 6.0 * np.bincount(keys, minlength=dest.shape[0]))


def test_per_lane_modes_plan_no_reduction_and_their_reducer_adds_per_lane():
    # atomic and floor never plan a reduction; their reducers are the per-lane adds.
    @wp.kernel(enable_backward=False, module="unique")
    def per_lane(dest_a: wp.array(dtype=wp.vec3), dest_f: wp.array(dtype=wp.vec3), planned: wp.array(dtype=int)):
        i = wp.tid()
        if wp.static(arc_warp.warp_plan("atomic"))(True, 1) or wp.static(arc_warp.warp_plan("floor"))(True, 1):
            wp.atomic_add(planned, 0, 1)
        wp.static(arc_warp.warp_reducer(wp.vec3, "atomic"))(dest_a, i % 2, wp.vec3(1.0), i % 3 != 0, 1)
        wp.static(arc_warp.warp_reducer(wp.vec3, "floor"))(dest_f, i % 2, wp.vec3(1.0), True, 1)

    dest_a = wp.zeros(2, dtype=wp.vec3, device=DEVICE)
    dest_f = wp.zeros(2, dtype=wp.vec3, device=DEVICE)
    planned = wp.zeros(1, dtype=int, device=DEVICE)
    wp.launch(per_lane, dim=96, inputs=[dest_a, dest_f, planned], device=DEVICE)
    expect = [sum(1 for i in range(96) if i % 2 == r and i % 3 != 0) for r in (0, 1)]
    np.testing.assert_array_equal(dest_a.numpy(), np.repeat(np.array(expect, float)[:, None], 3, 1))
    assert not dest_f.numpy().any()
    assert planned.numpy()[0] == 0


@wp.kernel(enable_backward=False)
def _intrinsics_probe(keys: wp.array(dtype=int), out: wp.array2d(dtype=int)):
    i = wp.tid()
    mask = active_mask()
    out[i, 0] = lane_id()
    out[i, 1] = ballot(mask, keys[i] % 3 == 0)
    out[i, 2] = match_any(mask, keys[i])
    out[i, 3] = shfl_int(mask, keys[i], 31 - lane_id())


def test_emulated_intrinsics_follow_cuda_semantics():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 4, 64)
    out = wp.zeros((64, 4), dtype=int, device=DEVICE)
    with cpu_blocks(True):
        wp.launch(_intrinsics_probe, dim=64, inputs=[wp.array(keys, dtype=int, device=DEVICE), out], device=DEVICE, block_dim=64)
    got = out.numpy().astype(np.int64) & 0xFFFFFFFF
    for w in range(2):
        lanes = keys[w * 32 : (w + 1) * 32]
        ballot_ref = sum(1 << j for j in range(32) if lanes[j] % 3 == 0)
        for j in range(32):
            row = got[w * 32 + j]
            assert row[0] == j
            assert row[1] == ballot_ref
            assert row[2] == sum(1 << q for q in range(32) if lanes[q] == lanes[j])
            assert row[3] == lanes[31 - j]


@pytest.mark.parametrize("k", [1, 3, 5, 9, 12, 16, 17, 32])
def test_reduce_scatter_layout(k):
    # Every component's warp total must reach exactly one owner lane, and every
    # lane must hold the total of the component the plan assigns to it.
    vec = wp.types.vector(k, wp.float32)
    rs, owned_component = reduce_scatter(k)
    _, weights, owners = reduce_scatter_plan(k)

    @wp.kernel(enable_backward=False, module="unique")
    def run(x: wp.array(dtype=vec), out: wp.array(dtype=float), comp: wp.array(dtype=int)):
        i = wp.tid()
        out[i] = rs(active_mask(), x[i])
        comp[i] = owned_component(lane_id())

    rng = np.random.default_rng(k)
    x = rng.standard_normal((64, k)).astype(np.float32)
    out = wp.zeros(64, dtype=float, device=DEVICE)
    comp = wp.zeros(64, dtype=int, device=DEVICE)
    with cpu_blocks(True):
        wp.launch(run, dim=64, inputs=[wp.array(x, dtype=vec, device=DEVICE), out, comp], device=DEVICE, block_dim=64)
    got, got_comp = out.numpy(), comp.numpy()
    for w in range(2):
        totals = x[w * 32 : (w + 1) * 32].astype(np.float64).sum(0)
        owned = got_comp[w * 32 : (w + 1) * 32]
        assert sorted(owned[owned >= 0]) == list(range(k))
        for lane in range(32):
            c = sum(wt * ((lane >> (4 - s)) & 1) for s, wt in enumerate(weights))
            assert (owned[lane] >= 0) == bool((owners >> lane) & 1)
            if owned[lane] >= 0:
                assert owned[lane] == c
                assert abs(got[w * 32 + lane] - totals[c]) < ATOL
    # Close to the k shuffles any warp sum needs (one per step for k = 1).
    steps, _, _ = reduce_scatter_plan(k)
    assert sum(c for _, c in steps) <= max(k + 4, 5)


def test_validation_errors():
    dest = wp.zeros(8, dtype=wp.vec3, device=DEVICE)
    idx = wp.zeros(4, dtype=wp.int32, device=DEVICE)
    vals = wp.zeros(4, dtype=wp.vec3, device=DEVICE)
    with pytest.raises(ValueError, match="same length"):
        arc_warp.scatter_add(dest, wp.zeros(5, dtype=wp.int32, device=DEVICE), vals)
    with pytest.raises(TypeError, match="int32"):
        arc_warp.scatter_add(dest, wp.zeros(4, dtype=wp.int64, device=DEVICE), vals)
    with pytest.raises(TypeError, match="vec3"):
        arc_warp.scatter_add(dest, idx, wp.zeros(4, dtype=wp.vec2, device=DEVICE))
    with pytest.raises(TypeError, match="float32 vector"):
        arc_warp.scatter_add(wp.zeros(8, dtype=wp.int32, device=DEVICE), idx, wp.zeros(4, dtype=wp.int32, device=DEVICE))
    with pytest.raises(ValueError, match="reduce mode"):
        arc_warp.scatter_add(dest, idx, vals, mode="fast")
    with pytest.raises(ValueError, match="threshold"):
        arc_warp.scatter_add(dest, idx, vals, threshold=0)
    with pytest.raises(TypeError, match="wp.array"):
        arc_warp.scatter_add(np.zeros(8), idx, vals)


def test_out_of_range_indices_raise_and_write_nothing():
    dest = wp.zeros(8, dtype=float, device=DEVICE)
    vals = wp.array(np.ones(4, np.float32), device=DEVICE)
    for bad in ([0, 1, 8, 2], [0, -1, 3, 2]):
        with pytest.raises(IndexError, match=r"outside \[0, 8\)"):
            arc_warp.scatter_add(dest, wp.array(np.array(bad, np.int32), device=DEVICE), vals)
        assert not dest.numpy().any()
    # Unchecked: the bad entry is skipped in the kernel, the good ones land.
    arc_warp.scatter_add(dest, wp.array(np.array([0, 1, 8, 2], np.int32), device=DEVICE), vals, check_bounds=False)
    np.testing.assert_array_equal(dest.numpy(), [1, 1, 1, 0, 0, 0, 0, 0])


def test_threshold_resolution(monkeypatch):
    from arc_warp._src.arc.calibrate import FALLBACK_THRESHOLD, choose_threshold

    assert arc_warp.resolve_threshold("cpu") == FALLBACK_THRESHOLD
    assert arc_warp.resolve_threshold("cpu", 5) == 5
    monkeypatch.setenv("ARC_WARP_THRESHOLD", "12")
    assert arc_warp.resolve_threshold("cpu") == 12
    monkeypatch.setenv("ARC_WARP_THRESHOLD", "many")
    with pytest.raises(ValueError, match="ARC_WARP_THRESHOLD"):
        arc_warp.resolve_threshold("cpu")
    with pytest.raises(ValueError, match="CUDA"):
        arc_warp.calibrate("cpu")
    # Objective rule: the candidate whose worst ratio to best(atomic, warp) is highest.
    atomic, warp = (1.0, 4.0), (2.0, 2.0)  # atomic wins at the sparse density, warp at the dense one
    arc = ((1.1, 2.6), (1.05, 2.1), (1.3, 2.0))  # worst ratios 1/1.3, 2/2.1, 1/1.3
    assert choose_threshold((2, 4, 8), atomic, warp, arc) == 4
    # Ties go to the smaller total time.
    assert choose_threshold((2, 4), (1.0, 1.0), (1.0, 1.0), ((1.0, 1.0), (0.5, 1.0))) == 4
    # The keyed rule: within the tolerance of the safest, the fastest in total. Never
    # reducing (33) is safest by 2%, reducing at 8 halves the contended case's time.
    atomic, warp = (1.0, 1.0), (1.2, 3.0)  # 16 lanes per key, then 1
    arc = ((0.5, 1.02), (1.0, 1.0))
    assert choose_threshold((8, 33), atomic, warp, arc) == 33
    assert choose_threshold((8, 33), atomic, warp, arc, tolerance=0.03) == 8
    assert choose_threshold((8, 33), atomic, warp, ((0.5, 1.1), (1.0, 1.0)), tolerance=0.03) == 33


def test_calibration_cache_roundtrip(monkeypatch, tmp_path):
    from arc_warp._src.arc import calibrate as cal

    monkeypatch.setenv("ARC_WARP_CACHE_DIR", str(tmp_path))
    entry = cal.Calibration(
        "Fake GPU", 4, (1.0, 0.25), (2, 4), (9.0, 2.0), (1.0, 1.0), ((1.2, 1.1), (1.0, 0.9)),
        8, (16, 1), (8, 33), (1.0, 1.0), (0.8, 3.0), ((0.85, 1.02), (1.0, 1.0)), wp.config.version, "2026-01-01"
    )
    cal._store(entry)
    assert cal._load("Fake GPU") == entry
    assert entry.worst_ratio(4) == pytest.approx(1.0 / 1.0)
    assert entry.keyed_worst_ratio(8) == pytest.approx(0.8 / 0.85)
    assert cal._load("Other GPU") is None


@pytest.mark.parametrize("group", [8, 1])
def test_keyed_probe_modes_agree_on_emulated_warps(group):
    # The keyed calibration workload: four float4 texel adds per pixel, `group` lanes per key.
    from arc_warp._src.arc.probe import KEYED_ROW, launch_keyed_probe

    outs = {}
    with cpu_blocks(True):
        for mode in ("atomic", "warp", "serial", "arc"):
            dest = wp.zeros(KEYED_ROW * KEYED_ROW, dtype=wp.vec4, device=DEVICE)
            launch_keyed_probe(mode, dest, n_threads=512, group=group, seed=3, threshold=4)
            outs[mode] = dest.numpy()
    touched = np.count_nonzero(outs["atomic"].any(axis=1))
    assert touched == 2 * (512 // group + 1), "the 2x2 texels of consecutive keys along one row"
    for mode in ("warp", "serial", "arc"):
        np.testing.assert_allclose(outs[mode], outs["atomic"], atol=ATOL, err_msg=mode)


def test_kernel_mode_compiles_a_never_reducing_arc_as_atomic():
    from arc_warp._src.arc.calibrate import FALLBACK_THRESHOLD, MAX_THRESHOLD, kernel_mode

    assert kernel_mode("arc", MAX_THRESHOLD) == "atomic"
    assert kernel_mode("arc", MAX_THRESHOLD - 1) == "arc"
    assert kernel_mode("warp", MAX_THRESHOLD) == "warp"
    assert arc_warp.resolve_threshold("cpu", keyed=True) == FALLBACK_THRESHOLD


def test_probe_kernel_modes_agree_on_emulated_warps():
    # The calibration / benchmark workload itself: every mode must give atomic's sums.
    from arc_warp._src.arc.probe import VecK, launch_probe, make_params

    params = make_params(24, DEVICE, seed=2)
    outs = {}
    with cpu_blocks(True):
        for mode in ("atomic", "warp", "serial", "arc"):
            dest = wp.zeros(24, dtype=VecK, device=DEVICE)
            launch_probe(mode, params, dest, n_blocks=3, targets_per_block=8, p_active=0.5, seed=5, threshold=9)
            outs[mode] = dest.numpy()
    assert np.abs(outs["atomic"]).max() > 0.1
    for mode in ("warp", "serial", "arc"):
        np.testing.assert_allclose(outs[mode], outs["atomic"], atol=ATOL, err_msg=mode)
