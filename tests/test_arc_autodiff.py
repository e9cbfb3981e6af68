"""arc_adjoint: ARC inside Warp's generated backward, checked against Warp's own adjoint.

The reference is Warp's generated adjoint of the same, unchanged kernel (independent of
arc_warp). On the CPU threads add in launch order, so ``atomic`` mode must give Warp's
bits exactly; the warp reductions (``warp``, ``arc`` under ``enable_cpu_blocks``) sum in
another order and must agree to float32 round-off; ``floor`` (adds nothing) shows that
every covered read and add went through the rewrite.
"""

import pathlib
import re

import numpy as np
import pytest
import warp as wp

import arc_warp
from arc_warp.examples import arc_adjoint_cloth, arc_adjoint_p2g, arc_adjoint_splat

from conftest import cpu_blocks_enabled

EXAMPLES = {"p2g": arc_adjoint_p2g, "cloth": arc_adjoint_cloth, "splat": arc_adjoint_splat}
BLOCK = 64  # a multiple of the 32-lane warp: CPU warp emulation when enable_cpu_blocks is on
# Reordered float32 sums: every element within a few ulps of the largest magnitude of its
# gradient (sums of at most ~50 terms here; the worst seen is 2.4e-7 of it).
ROUNDOFF = 2e-6


def _problem(name):
    return EXAMPLES[name].make_problem(np.random.default_rng(7), device="cpu")


def _assert_roundoff(got, ref, what):
    for key, r in ref.items():
        scale = float(np.max(np.abs(r)))
        assert scale > 0, f"{what} {key}: the reference gradient is all zero, nothing is checked"
        np.testing.assert_allclose(got[key], r, rtol=0, atol=ROUNDOFF * scale, err_msg=f"{what} {key}")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_match_warps_adjoint(name, cpu_blocks):
    ex = EXAMPLES[name]
    pb = _problem(name)
    ref = ex.gradients(pb, None, BLOCK)
    for mode in ("atomic", "warp", "arc", "deterministic"):
        got = ex.gradients(pb, mode, BLOCK, threshold=4)
        _assert_roundoff(got, ref, f"{name} {mode}")
        if mode in ("atomic", "deterministic") or not cpu_blocks:
            # threads add in launch order: Warp's bits (one-lane CPU warps never reduce)
            for key in ref:
                assert np.array_equal(got[key], ref[key]), f"{name} {mode} {key}: not Warp's bits"


@wp.kernel
def _shared_read(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    t = wp.tid()
    out[t] = a[0]


@pytest.mark.parametrize("mode", ["atomic", "warp", "arc"])
def test_the_warp_tree_sums_the_shared_reads(mode, cpu_blocks):
    # 64 lanes read a[0]; the adjoints are 2^24 in lane 0 and 1 elsewhere. Adding them one
    # by one loses every 1 (2^24 + 1 rounds back to 2^24). The warp's butterfly pairs lane 0
    # with lane 16 first (that 1 is lost), then adds the other 30 ones summed among
    # themselves: 2^24 + 30, and the second warp's 32 after it: 2^24 + 62.
    a = wp.zeros(1, dtype=float, requires_grad=True)
    out = wp.zeros(64, dtype=float, requires_grad=True)
    cot = np.ones(64, np.float32)
    cot[0] = 2.0**24
    (got,) = _launch_grads(arc_warp.arc_adjoint(_shared_read, mode=mode, threshold=2), [a], 64, [out],
                           [wp.array(cot, dtype=float)])
    reduced = cpu_blocks and mode != "atomic"
    assert got[0] == (2.0**24 + 62 if reduced else 2.0**24)


def _arc_only_arrays(kernels) -> set:
    """Arrays every one of whose reads, in all of ``kernels``, goes through ARC."""
    sites = [s for k in kernels for s in arc_warp.adjoint_sites(k) if s.kind == "read"]
    return {s.array for s in sites} - {s.array for s in sites if not s.arc}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_floor_mode_drops_every_covered_add(name):
    # floor adds nothing: gradients that flow only through rewritten reads vanish, the
    # others (reads left to Warp) do not.
    ex = EXAMPLES[name]
    pb = _problem(name)
    kernels = [arc_warp.arc_adjoint(k, mode="floor") for k in ex.KERNELS.values()]
    arc_only = _arc_only_arrays(kernels)
    got = ex.gradients(pb, "floor", BLOCK)
    ref = ex.gradients(pb, None, BLOCK)
    assert arc_only <= set(got)
    for key in arc_only:
        assert np.any(ref[key]) and not np.any(got[key]), f"{name} {key}: a read's adjoint escaped the rewrite"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_scripts_run(name, monkeypatch, capsys):
    # what `python -m arc_warp.examples.arc_adjoint_<name> --cpu-blocks` prints
    monkeypatch.setattr("sys.argv", ["x", "--cpu-blocks", "--device", "cpu"])
    with cpu_blocks_enabled(False):
        EXAMPLES[name].main()
    lines = capsys.readouterr().out.splitlines()
    modes = ["atomic", "warp", "arc", "deterministic"]
    rows = [r for r in (line.split() for line in lines) if r and r[0] in modes]  # Warp logs its compiles too
    assert [r[0] for r in rows] == modes
    assert all(float(v) < ROUNDOFF for r in rows for v in r[2::2]), lines


def test_deterministic_is_bit_identical_across_runs_and_block_widths():
    pb = _problem("splat")
    runs = []
    for blocks in (False, True, True, False):
        with cpu_blocks_enabled(blocks):
            runs.append(arc_adjoint_splat.gradients(pb, "deterministic", BLOCK))
    for run in runs[1:]:
        for key in runs[0]:
            assert np.array_equal(run[key], runs[0][key]), key


def test_sites_of_the_examples():
    sites = {k: arc_warp.adjoint_sites(arc_warp.arc_adjoint(kern, mode="arc", threshold=8))
             for ex in EXAMPLES.values() for k, kern in ex.KERNELS.items()}
    summary = {k: sorted({(s.kind, s.array, s.arc) for s in v}) for k, v in sites.items()}
    assert summary == {
        # reads at the thread's own index stay Warp's: no two lanes share the target
        "p2g": [("atomic_add", "grid_m", True), ("atomic_add", "grid_mv", True), ("read", "mass", False),
                ("read", "v", False), ("read", "x", False)],
        "grid_update": [("read", "grid_m", False), ("read", "grid_mv", False)],
        "g2p": [("read", "grid_v", True), ("read", "x", False)],
        "stretch_energy": [("atomic_add", "energy", True), ("read", "area", False), ("read", "dm_inv", False),
                           ("read", "x", True)],
        "splat": [("atomic_add", "image", True), ("read", "colors", True), ("read", "conics", True),
                  ("read", "means", True), ("read", "opacities", True)],
    }
    assert all("own element" in s.reason for v in sites.values() for s in v if not s.arc)
    source = pathlib.Path(arc_adjoint_cloth.__file__).read_text().splitlines()
    for s in sites["stretch_energy"]:
        assert s.array in source[s.line - 1], (s, source[s.line - 1])


# Kernels for the edge cases: branches to different sites, views, other dtypes.


@wp.kernel
def _branchy(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=wp.vec3), c: wp.array(dtype=float),
             idx: wp.array(dtype=int), out: wp.array(dtype=wp.vec3)):
    t = wp.tid()
    k = idx[t]
    v = wp.vec3(0.0)
    # the backward runs the common read first, then each lane its branch's: lanes of one
    # block stand at reads of a, of b and of c (another dtype) at the same time
    if t % 3 == 0:
        v = a[k] * 2.0
    elif t % 3 == 1:
        v = b[k] * c[k]
    else:
        v = wp.cw_mul(b[k], a[(k + 3) % 7])
    out[t] = v + a[k % 4]


@wp.kernel
def _shared_index_read(a: wp.array(dtype=float), idx: wp.array(dtype=int), out: wp.array(dtype=float)):
    t = wp.tid()
    out[t] = a[idx[t]] * 2.0


def _launch_grads(kernel, arrays, dim, outputs, cotangents, block_dim=BLOCK):
    """Gradients of the arrays with requires_grad, zeroed first (they stay in .grad)."""
    differentiable = [a for a in arrays + outputs if isinstance(a, wp.array) and a.requires_grad]
    for a in differentiable:
        a.grad.zero_()
    tape = wp.Tape()
    with tape:
        wp.launch(kernel, dim, inputs=arrays, outputs=outputs, block_dim=block_dim)
    tape.backward(grads=dict(zip(outputs, cotangents)))
    return [a.grad.numpy().copy() for a in differentiable if all(a is not o for o in outputs)]


def test_lanes_at_different_sites_keep_the_emulated_block_in_step():
    # Lanes of one block stand at different read sites in the backward; the site check
    # sends such blocks to per-lane adds, and full blocks (the last read) still reduce.
    rng = np.random.default_rng(3)
    a = wp.array(rng.normal(size=(7, 3)), dtype=wp.vec3, requires_grad=True)
    b = wp.array(rng.normal(size=(7, 3)), dtype=wp.vec3, requires_grad=True)
    c = wp.array(rng.normal(size=7), dtype=float, requires_grad=True)
    n = 256
    idx = wp.array(rng.integers(0, 7, n).astype(np.int32), dtype=int)
    out = wp.zeros(n, dtype=wp.vec3, requires_grad=True)
    cot = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3)
    with cpu_blocks_enabled(True):
        ref = _launch_grads(_branchy, [a, b, c, idx], n, [out], [cot])
        for mode in ("warp", "arc"):
            got = _launch_grads(arc_warp.arc_adjoint(_branchy, mode=mode, threshold=2), [a, b, c, idx], n, [out], [cot])
            for g, r in zip(got, ref):
                np.testing.assert_allclose(g, r, rtol=0, atol=ROUNDOFF * np.abs(r).max())


@wp.kernel
def _ragged(a: wp.array(dtype=wp.vec2), count: wp.array(dtype=int), out: wp.array(dtype=wp.vec2)):
    t = wp.tid()
    if t % 5 == 0:
        return
    for j in range(count[t]):  # a run-time trip count, different per lane
        wp.atomic_add(out, t, a[(t + j) % 9] * float(j + 1))


def test_early_returns_and_ragged_loops_under_emulation(cpu_blocks):
    rng = np.random.default_rng(4)
    a = wp.array(rng.normal(size=(9, 2)), dtype=wp.vec2, requires_grad=True)
    n = 200  # not a multiple of the block: a partial last block too
    count = wp.array(rng.integers(0, 4, n).astype(np.int32), dtype=int)
    out = wp.zeros(n, dtype=wp.vec2, requires_grad=True)
    cot = wp.array(rng.normal(size=(n, 2)), dtype=wp.vec2)
    ref = _launch_grads(_ragged, [a, count], n, [out], [cot])
    for mode in ("warp", "arc"):
        got = _launch_grads(arc_warp.arc_adjoint(_ragged, mode=mode, threshold=2), [a, count], n, [out], [cot])
        np.testing.assert_allclose(got[0], ref[0], rtol=0, atol=ROUNDOFF * np.abs(ref[0]).max())


@wp.kernel
def _mixed(grid: wp.array3d(dtype=float), rows: wp.array2d(dtype=wp.vec2), w64: wp.array(dtype=wp.float64),
           q: wp.array(dtype=wp.quat), counter: wp.array(dtype=float), out: wp.array(dtype=float),
           acc: wp.array(dtype=wp.vec2)):
    i = wp.tid()
    r = rows[i % 3]  # a view: left to Warp
    s = grid[i % 2, i % 3, i % 4] + r[1][0] + rows[i % 3, 1][1] + float(w64[i % 5])
    s = s + wp.length(wp.quat_rotate(q[i % 2], wp.vec3(1.0, 2.0, 3.0)))
    old = wp.atomic_add(counter, 0, s)  # old value used: left to Warp
    grid[i % 2, i % 3, i % 4] += 0.0  # covered add (nothing to differentiate)
    out[i] = s * s + old * 0.0
    wp.atomic_sub(acc, i % 3, wp.vec2(s, 2.0 * s))  # covered, as an add of the negated value
    acc[i % 2] -= wp.vec2(s * s, 1.0)


def test_views_strides_and_other_dtypes_match_warp(cpu_blocks):
    rng = np.random.default_rng(5)
    base = wp.array(rng.normal(size=(2, 3, 8)).astype(np.float32), dtype=float, requires_grad=True)
    grid = base[:, :, ::2]  # a strided view (strides 96, 32, 8 bytes)
    assert not grid.is_contiguous
    rows = wp.array(rng.normal(size=(3, 2, 2)).astype(np.float32), dtype=wp.vec2, requires_grad=True)
    w64 = wp.array(rng.normal(size=5), dtype=wp.float64, requires_grad=True)
    q = wp.array(rng.normal(size=(2, 4)).astype(np.float32), dtype=wp.quat, requires_grad=True)
    counter = wp.zeros(1, dtype=float, requires_grad=True)
    n = 128
    out = wp.zeros(n, dtype=float, requires_grad=True)
    acc = wp.zeros(3, dtype=wp.vec2, requires_grad=True)
    cot = [wp.array(rng.normal(size=n).astype(np.float32), dtype=float),
           wp.array(rng.normal(size=(3, 2)).astype(np.float32), dtype=wp.vec2)]
    args = [grid, rows, w64, q, counter]
    ref = _launch_grads(_mixed, args, n, [out, acc], cot)
    ref_acc = acc.numpy()
    acc.zero_()
    kernel = arc_warp.arc_adjoint(_mixed, mode="warp")
    got = _launch_grads(kernel, args, n, [out, acc], cot)
    np.testing.assert_allclose(acc.numpy(), ref_acc, rtol=0, atol=ROUNDOFF * np.abs(ref_acc).max())
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=0, atol=ROUNDOFF * np.abs(r).max())
    # the view's gradient is a strided view of base's: the adds land on every other float
    assert np.any(base.grad.numpy()[:, :, 0::2]) and not np.any(base.grad.numpy()[:, :, 1::2])
    left = {(s.kind, s.array): s.reason for s in arc_warp.adjoint_sites(kernel) if not s.arc}
    assert set(left) == {("read", "rows"), ("read", "w64"), ("atomic_add", "counter")}, left
    assert "view" in left[("read", "rows")] and "float64" in left[("read", "w64")]
    assert "old value" in left[("atomic_add", "counter")]
    covered = {(s.kind, s.array) for s in arc_warp.adjoint_sites(kernel) if s.arc}
    assert covered == {("read", "grid"), ("read", "rows"), ("read", "q"), ("atomic_add", "grid"), ("atomic_add", "acc")}


def test_adjoint_launch_without_adjoint_arrays_adds_into_grad():
    # Like adj_address: with no adjoint array passed for an input, its .grad receives the adds.
    rng = np.random.default_rng(6)
    idx = wp.array(rng.integers(0, 5, 64).astype(np.int32), dtype=int)
    cot = wp.array(rng.normal(size=64).astype(np.float32), dtype=float)
    grads = []
    for kernel in (_shared_index_read, arc_warp.arc_adjoint(_shared_index_read, mode="warp")):
        a = wp.array(np.ones(5, np.float32), dtype=float, requires_grad=True)
        out = wp.zeros(64, dtype=float)
        wp.launch(kernel, 64, inputs=[a, idx], outputs=[out], adj_inputs=[None, None], adj_outputs=[cot],
                  adjoint=True, block_dim=BLOCK)
        grads.append(a.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=0, atol=ROUNDOFF * np.abs(grads[0]).max())
    assert np.any(grads[0])


def _make_closure_kernel(scale):
    @wp.kernel
    def scaled(a: wp.array(dtype=float), idx: wp.array(dtype=int), out: wp.array(dtype=float)):
        t = wp.tid()
        out[t] = a[idx[t]] * wp.static(scale)

    return scaled


def test_decorator_forms_and_closures():
    rng = np.random.default_rng(9)
    a = wp.array(rng.normal(size=4).astype(np.float32), dtype=float, requires_grad=True)
    idx = wp.array(rng.integers(0, 4, 96).astype(np.int32), dtype=int)
    out = wp.zeros(96, dtype=float, requires_grad=True)
    cot = wp.array(np.ones(96, np.float32), dtype=float)
    counts = np.bincount(idx.numpy(), minlength=4).astype(np.float32)

    kernel = _make_closure_kernel(3.0)
    decorated = arc_warp.arc_adjoint(mode="atomic")(kernel)

    @arc_warp.arc_adjoint(mode="atomic")
    def plain(a: wp.array(dtype=float), idx: wp.array(dtype=int), out: wp.array(dtype=float)):
        t = wp.tid()
        out[t] = a[idx[t]] * 3.0

    for k in (kernel, decorated, plain):
        assert isinstance(k, wp.Kernel)
        (g,) = _launch_grads(k, [a, idx], 96, [out], [cot])
        np.testing.assert_array_equal(g, 3.0 * counts)
    assert arc_warp.arc_adjoint(kernel, mode="atomic") is decorated  # cached
    assert [s.array for s in arc_warp.adjoint_sites(decorated)] == ["a"]


def test_bad_arguments_raise_before_building():
    with pytest.raises(ValueError, match="mode must be one of"):
        arc_warp.arc_adjoint(_branchy, mode="serial")
    with pytest.raises(TypeError, match="threshold"):
        arc_warp.arc_adjoint(_branchy, mode="arc", threshold=2.5)
    with pytest.raises(ValueError, match=r"\[1, 33\]"):
        arc_warp.arc_adjoint(_branchy, mode="arc", threshold=0)
    with pytest.raises(TypeError, match="wp.Kernel or a Python function"):
        arc_warp.arc_adjoint(42)

    @wp.kernel(enable_backward=False)
    def forward_only(a: wp.array(dtype=float)):
        a[wp.tid()] = 1.0

    with pytest.raises(ValueError, match="enable_backward=False"):
        arc_warp.arc_adjoint(forward_only)
    with pytest.raises(ValueError, match="not built by arc_warp.arc_adjoint"):
        arc_warp.adjoint_sites(_branchy)


def _nvrtc_archs() -> set:
    wp.init()
    return set(getattr(wp._src.context.runtime, "nvrtc_supported_archs", None) or [])


@pytest.mark.skipif(not {75, 90} <= _nvrtc_archs(), reason="needs NVRTC with sm_75 and sm_90 (Warp's CUDA compiler)")
def test_rewritten_kernels_compile_for_cuda(tmp_path):
    # NVRTC compiles without a GPU: the native snippets' CUDA arms, and the warp
    # collectives (match.any on sm_75 too: arc plans per target) are in the PTX.
    # _mixed: 3-D views, quaternions flattened to 4 floats, float and vec2 adds.
    builds = [(arc_warp.arc_adjoint(arc_adjoint_splat.splat, mode="arc", threshold=8), 75),
              (arc_warp.arc_adjoint(arc_adjoint_splat.splat, mode="arc", threshold=8), 90),
              (arc_warp.arc_adjoint(_mixed, mode="arc", threshold=8), 90)]
    for i, (kernel, arch) in enumerate(builds):
        (path,) = wp.compile_aot_module(kernel.module, arch=arch, use_ptx=True, module_dir=tmp_path / str(i))
        ptx = path.read_text()
        assert f".target sm_{arch}" in ptx and "shfl.sync" in ptx and re.search(r"match\.any", ptx), kernel.key


@pytest.mark.gpu
@pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_on_cuda(name):
    # The same bars on a GPU: round-off against Warp's adjoint, and the deterministic
    # mode (Warp's deterministic execution) bit-identical from run to run.
    ex = EXAMPLES[name]
    pb = ex.make_problem(np.random.default_rng(7), device="cuda")
    ref = ex.gradients(pb, None, 256)
    for mode in ("atomic", "warp", "arc"):
        _assert_roundoff(ex.gradients(pb, mode, 256), ref, f"{name} {mode}")
    runs = [ex.gradients(pb, "deterministic", 256) for _ in range(3)]
    _assert_roundoff(runs[0], ref, f"{name} deterministic")
    for run in runs[1:]:
        for key in run:
            assert np.array_equal(run[key], runs[0][key]), f"{name} {key}"
