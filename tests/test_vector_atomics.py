"""The per-lane vector atomic add (float4 / float2 / float chunks by the element's
alignment) against a float64 numpy reference, on the CPU, and its CUDA code.

The CPU runs the same phase switch and chunks as sm_90 (plain adds), and writes NaN into
an element whose chunk would be a misaligned GPU atomic, so these sums check the chunking.
Destinations are views into a larger float array starting 0..3 floats past a 16-byte
boundary, so every K meets every phase. Float32 tolerance: each sum has at most a few
hundred terms of magnitude ~1, far below 1e-4 absolute.
"""

import functools
import re

import numpy as np
import pytest
import warp as wp

import arc_warp
from conftest import cpu_blocks_enabled
from arc_warp._src.arc.reduce_funcs import accumulator, lane_adder, lane_atomic_add
from arc_warp._src.arc.vector_atomics import _snippet, atomics_per_element, chunk_plan, vector_atomic_add

wp.config.log_level = wp.LOG_WARNING
DEVICE = "cpu"
ATOL = 1e-4
KS = (2, 3, 4, 9, 10, 12)
GUARD = 8  # floats of untouched guard cells on each side of a view


def test_chunk_plan_covers_every_component_once_with_aligned_chunks():
    for k in range(1, 33):
        for phase in range(4):
            plan = chunk_plan(k, phase)
            assert [o for o, _ in plan] == list(np.cumsum([0] + [w for _, w in plan])[:-1]), (k, phase)
            assert sum(w for _, w in plan) == k, (k, phase)
            for o, w in plan:
                assert w in (1, 2, 4) and (phase + o) % w == 0, (k, phase, o, w)
            # the peel: at most a float and a float2 before the first float4, at most a
            # float2 and a float after the last
            widths = [w for _, w in plan]
            if 4 in widths:
                first = widths.index(4)
                last = len(widths) - 1 - widths[::-1].index(4)
                assert set(widths[first:last + 1]) == {4}
                assert first <= 2 and len(widths) - 1 - last <= 2, (k, phase, plan)
    # the counts ARCHITECTURE.md quotes: 9 floats 3-4 atomics, 12 floats 3-5
    assert atomics_per_element(9) == {0: 3, 1: 4, 2: 4, 3: 3}
    assert atomics_per_element(12) == {0: 3, 1: 5, 2: 4, 3: 5}
    assert atomics_per_element(4) == {0: 1, 1: 3, 2: 2, 3: 3}


_CHUNK = re.compile(
    r"atomicAdd\(\(float(?P<w>[24])\*\)\(_p \+ (?P<o>\d+)\), make_float[24]\((?P<c>[^)]*)\)\);"
    r"|atomicAdd\(_p \+ (?P<o1>\d+), (?P<c1>value\.c\[\d+\])\);"
)


@pytest.mark.parametrize("k", (2, 3, 4, 5, 9, 10, 11, 12, 16, 32))
def test_cuda_arms_add_each_component_to_its_word_with_aligned_chunks(k):
    # The sm_90 arm is CUDA only: read it back and replay it word by word.
    sm90 = _snippet(k).split("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900")[1].split("#elif")[0]
    seen = set()
    for arm in re.findall(r"((?:case \d: )+)\{(.*?) break; \}", sm90):
        phases = [int(p) for p in re.findall(r"case (\d):", arm[0])]
        words = {}
        for m in _CHUNK.finditer(arm[1]):
            w = int(m["w"] or 1)
            o = int(m["o"] if m["w"] else m["o1"])
            comps = [int(c) for c in re.findall(r"value\.c\[(\d+)\]", m["c"] or m["c1"])]
            assert len(comps) == w
            for phase in phases:
                assert (phase + o) % w == 0, f"misaligned float{w} at {o}, phase {phase}"
            for j, c in enumerate(comps):
                assert o + j not in words, f"word {o + j} added twice"
                words[o + j] = c
        assert words == {i: i for i in range(k)}, (phases, words)
        seen.update(phases)
    assert seen == {0, 1, 2, 3}
    # before sm_90: one scalar atomic per component, in order
    older = _snippet(k).split("#elif defined(__CUDA_ARCH__)")[1].split("#else")[0]
    assert re.findall(r"atomicAdd\(_p \+ (\d+), value\.c\[(\d+)\]\);", older) == [(str(i), str(i)) for i in range(k)]


@functools.cache
def _add_kernel(k: int):
    vec_k = wp.types.vector(k, wp.float32)
    add = vector_atomic_add(vec_k)

    @wp.kernel(enable_backward=False, module="unique")
    def lanes_add(dest: wp.array(dtype=vec_k), idx: wp.array(dtype=wp.int32), vals: wp.array(dtype=vec_k)):
        i = wp.tid()
        add(dest, idx[i], vals[i])

    return lanes_add


def offset_view(k: int, m: int, phase: int, device=DEVICE):
    """(base, view, start): ``view`` is an (m,) array of k-vectors whose first float sits
    ``phase`` floats past a 16-byte boundary, at float ``start`` of the zeroed float array
    ``base`` (keep it alive)."""
    base = wp.zeros(m * k + 2 * GUARD + 4, dtype=wp.float32, device=device)
    shift = (4 - (base.ptr // 4) % 4) % 4 + phase  # floats to the phase, from base's alignment
    view = wp.array(ptr=base.ptr + 4 * (GUARD + shift), dtype=wp.types.vector(k, wp.float32),
                    shape=(m,), device=device)
    assert (view.ptr // 4) % 4 == phase
    return base, view, GUARD + shift


def index_patterns(n: int, m: int, rng) -> dict:
    return {
        "all_same": np.full(n, m // 2),
        "all_distinct": np.arange(n) % m,
        "few_targets": rng.integers(0, 3, n) * 3 + 1,
        "random": rng.integers(0, m, n),
    }


def check_view(base, view, start, ref):
    m, k = ref.shape
    got = base.numpy()
    np.testing.assert_array_equal(got[:start], 0.0, err_msg="guard cells before the view written")
    np.testing.assert_array_equal(got[start + m * k:], 0.0, err_msg="guard cells after the view written")
    np.testing.assert_allclose(view.numpy().reshape(m, k), ref, atol=ATOL)


@pytest.mark.parametrize("blocks", [False, True], ids=["lane_per_warp", "cpu_blocks"])
@pytest.mark.parametrize("k", KS)
def test_vector_atomic_add_matches_numpy_at_every_alignment(blocks, k):
    rng = np.random.default_rng(100 + k)
    m, n = 13, 300  # 13 targets: element starts 4*k*i bytes in cycle through every phase
    kernel = _add_kernel(k)
    with cpu_blocks_enabled(blocks):
        for phase in range(4):
            for name, idx in index_patterns(n, m, rng).items():
                base, view, start = offset_view(k, m, phase)
                vals = rng.standard_normal((n, k)).astype(np.float32)
                ref = np.zeros((m, k))
                np.add.at(ref, idx, vals.astype(np.float64))
                wp.launch(kernel, dim=n, inputs=[view, wp.array(idx.astype(np.int32), device=DEVICE),
                                                 wp.array(vals, dtype=view.dtype, device=DEVICE)],
                          device=DEVICE, block_dim=256 if blocks else 1)
                check_view(base, view, start, ref)


@pytest.mark.parametrize("blocks", [False, True], ids=["lane_per_warp", "cpu_blocks"])
@pytest.mark.parametrize("k", (3, 9, 12))
def test_accumulator_per_lane_paths_add_at_every_alignment(blocks, k):
    # The three per-lane sites: atomic mode (lane_adder), arc below the threshold in the
    # reducer (T=6, few lanes per target), and accumulator's unplanned warps (T=33).
    rng = np.random.default_rng(200 + k)
    m, n = 13, 300
    vec_k = wp.types.vector(k, wp.float32)
    with cpu_blocks_enabled(blocks):
        for phase in range(4):
            for mode, t in (("atomic", 1), ("arc", 6), ("arc", 33)):
                idx = index_patterns(n, m, rng)["random"]
                base, view, start = offset_view(k, m, phase)
                vals = rng.standard_normal((n, k)).astype(np.float32)
                ref = np.zeros((m, k))
                np.add.at(ref, idx, vals.astype(np.float64))
                arc_warp.scatter_add(view, wp.array(idx.astype(np.int32), device=DEVICE),
                                     wp.array(vals, dtype=vec_k, device=DEVICE), mode=mode, threshold=t)
                check_view(base, view, start, ref)


def test_per_lane_adds_use_the_vector_helper_for_vectors_only():
    for k in (2, 3, 12):
        vec_k = wp.types.vector(k, wp.float32)
        assert lane_atomic_add(vec_k) is vector_atomic_add(vec_k)
    assert lane_atomic_add(wp.float32).key == "arc_lane_atomic_add_f32"
    assert lane_atomic_add(wp.types.vector(1, wp.float32)).key == "arc_lane_atomic_add_v1"  # mesh k=1 chunks
    with pytest.raises(TypeError, match="2 or more"):
        vector_atomic_add(wp.types.vector(1, wp.float32))
    with pytest.raises(TypeError, match="float32 vector"):
        vector_atomic_add(wp.vec3d)
    with pytest.raises(ValueError, match="phase"):
        chunk_plan(3, 4)
    # they compile into the accumulator and the lane adder (built, not run, here)
    for fn in (accumulator(wp.vec4, "arc"), lane_adder(wp.vec4, "atomic")):
        assert fn is not None


def _nvrtc_archs() -> list:
    wp.init()
    return sorted(getattr(wp._src.context.runtime, "nvrtc_supported_archs", None) or [])


def _global_atomics(ptx: str) -> dict:
    ptx = ptx.replace("\x00", "")
    return {
        "v4": len(re.findall(r"(?:atom|red)\.global\.(?:\w+\.)*?(?:add\.v4|v4\.f32\.add)", ptx)),
        "v2": len(re.findall(r"(?:atom|red)\.global\.(?:\w+\.)*?(?:add\.v2|v2\.f32\.add)", ptx)),
        "f32": len(re.findall(r"(?:atom|red)\.global\.(?:\w+\.)*?add\.f32", ptx)),
    }


@pytest.mark.skipif(not {80, 90} <= set(_nvrtc_archs()), reason="needs NVRTC with sm_80 and sm_90")
def test_sm90_issues_vector_atomics_and_sm80_scalar_ones(tmp_path):
    # NVRTC compiles without a GPU. The call site's four arms for 12 floats (chunk_plan):
    # v4 v4 v4 | f v2 v4 v4 f | v2 v4 v4 v2 | f v4 v4 v2 f = 9 float4s, 4 float2s, 4 floats;
    # the compiler may duplicate the call site (the grid-stride loop: NVRTC 13.4 emits it
    # once for sm_90, twice for sm_80).
    kernel = _add_kernel(12)
    counts = {}
    for arch in (90, 80):
        (path,) = wp.compile_aot_module(kernel.module, arch=arch, use_ptx=True, module_dir=tmp_path / str(arch))
        counts[arch] = _global_atomics(path.read_text())
    v4, v2, f32 = counts[90]["v4"], counts[90]["v2"], counts[90]["f32"]
    copies = v4 // 9
    assert copies >= 1 and (v4, v2, f32) == (9 * copies, 4 * copies, 4 * copies), counts
    scalar = counts[80]["f32"]
    assert counts[80]["v4"] == counts[80]["v2"] == 0 and scalar >= 12 and scalar % 12 == 0, counts


def test_two_widths_in_one_kernel_resolve_to_their_own_overloads():
    # one stub name for every dtype: Warp picks the overload by the type of dest
    add3, add12 = vector_atomic_add(wp.vec3), vector_atomic_add(wp.types.vector(12, wp.float32))
    vec12 = wp.types.vector(12, wp.float32)

    @wp.kernel(enable_backward=False, module="unique")
    def both(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=vec12)):
        i = wp.tid()
        add3(a, i % 2, wp.vec3(1.0, 2.0, 3.0))
        add12(b, 0, vec12(float(i)))

    a = wp.zeros(2, dtype=wp.vec3, device=DEVICE)
    b = wp.zeros(1, dtype=vec12, device=DEVICE)
    wp.launch(both, dim=10, inputs=[a, b], device=DEVICE)
    np.testing.assert_array_equal(a.numpy(), [[5.0, 10.0, 15.0]] * 2)
    np.testing.assert_array_equal(b.numpy(), np.full((1, 12), 45.0))


@pytest.mark.gpu
@pytest.mark.skipif(not wp.is_cuda_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("k", KS)
def test_vector_atomic_add_on_gpu_at_every_alignment(k):
    # The real float4 / float2 atomics on sm_90+ (scalar ones before): a misaligned chunk
    # would raise a CUDA misaligned-address error. 100k lanes contend on 13 targets.
    # Tolerance: up to 1e5 float32 roundings per sum, each at most half an ulp of a running
    # sum of ~300 (1.5e-5), ~5e-3 as a random walk: atol 0.05.
    rng = np.random.default_rng(300 + k)
    m, n = 13, 100_000
    kernel = _add_kernel(k)
    for phase in range(4):
        for name, idx in index_patterns(n, m, rng).items():
            base, view, start = offset_view(k, m, phase, "cuda:0")
            vals = rng.standard_normal((n, k)).astype(np.float32)
            ref = np.zeros((m, k))
            np.add.at(ref, idx, vals.astype(np.float64))
            wp.launch(kernel, dim=n, inputs=[view, wp.array(idx.astype(np.int32), device="cuda:0"),
                                             wp.array(vals, dtype=view.dtype, device="cuda:0")], device="cuda:0")
            got = base.numpy()
            assert not got[:start].any() and not got[start + m * k:].any(), (phase, name)
            np.testing.assert_allclose(view.numpy().reshape(m, k), ref, rtol=1e-4, atol=0.05, err_msg=f"{phase} {name}")
