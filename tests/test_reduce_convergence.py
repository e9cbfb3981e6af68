"""The convergence guard of warp_plan / accumulator: ragged launches and early returns.

A warp that is not full and converged at the plan must fall back to per-lane atomics.
Values are small integers, so every float32 sum is exact and compared with ``==``.
On the CPU with ``enable_cpu_blocks`` the same guard holds per block (emulated
collectives sync the block); the GPU tests run the real ``__activemask`` path.
"""

import functools

import numpy as np
import pytest
import warp as wp

import arc_warp

wp.config.log_level = wp.LOG_WARNING
M = 5  # targets
CASES = [("warp", 1), ("serial", 1), ("arc", 1), ("arc", 6), ("arc", 33), ("atomic", 1)]


@functools.cache
def make_kernel(mode: str, form: str, uniform_index: bool):
    """Lanes with ``i % skip == skip - 1`` return before the add (``skip = 0``: none)."""
    add = arc_warp.accumulator(wp.vec2, mode, uniform_index)
    plan = arc_warp.warp_plan(mode)
    reduce = arc_warp.warp_reducer(wp.vec2, mode, uniform_index)

    def kernel(dest: wp.array(dtype=wp.vec2), skip: int, threshold: int):
        i = wp.tid()
        if skip > 0 and i % skip == skip - 1:
            return
        index = (i // 32) % M  # one index per warp, as uniform_index promises
        if wp.static(not uniform_index):
            index = (i + i // 7) % M
        value = wp.vec2(1.0, float(i % 13))
        valid = i % 3 != 1
        if wp.static(form == "accumulator"):
            add(dest, index, value, valid, threshold)
        elif plan(valid, threshold):
            reduce(dest, index, value, valid, threshold)
        elif valid:
            wp.atomic_add(dest, index, value)

    return wp.kernel(kernel, enable_backward=False, module="unique")


def reference(dim: int, skip: int, uniform_index: bool) -> np.ndarray:
    i = np.arange(dim)
    keep = (i % 3 != 1) & ((i % skip != skip - 1) if skip else True)
    index = (i // 32) % M if uniform_index else (i + i // 7) % M
    ref = np.zeros((M, 2))
    np.add.at(ref, index[keep], np.stack([np.ones(dim), i % 13], 1)[keep])
    return ref


def check(device, dim, skip, block_dim, uniform_index, form):
    for mode, t in CASES:
        dest = wp.zeros(M, dtype=wp.vec2, device=device)
        wp.launch(make_kernel(mode, form, uniform_index), dim=dim, inputs=[dest, skip, t], device=device, block_dim=block_dim)
        np.testing.assert_array_equal(
            dest.numpy(), reference(dim, skip, uniform_index),
            err_msg=f"{form} {mode} T={t} dim={dim} skip={skip} uniform={uniform_index}",
        )


@pytest.fixture
def cpu_blocks():
    saved = wp.config.enable_cpu_blocks
    wp.config.enable_cpu_blocks = True
    yield
    wp.config.enable_cpu_blocks = saved


FORMS = ["accumulator", "plan"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("uniform_index", [False, True], ids=["mixed", "uniform"])
def test_cpu_emulation_early_return(cpu_blocks, form, uniform_index):
    # A lane in the middle of a block returns: the block must not run collectives.
    check("cpu", 128, 7, 64, uniform_index, form)


@pytest.mark.parametrize("form", FORMS)
def test_cpu_emulation_ragged_dim(cpu_blocks, form):
    # 77 = one full block of 64 and a block of 13 live lanes.
    check("cpu", 77, 0, 64, False, form)


@pytest.mark.parametrize("form", FORMS)
def test_cpu_one_lane_warps_ragged_early_return(form):
    check("cpu", 77, 5, 64, False, form)


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("uniform_index", [False, True], ids=["mixed", "uniform"])
@pytest.mark.parametrize("dim,skip", [(1000, 0), (1000, 7), (4096, 5), (4100, 32)])
def test_gpu_ragged_dim_and_early_return(form, uniform_index, dim, skip):
    if not wp.is_cuda_available():
        pytest.skip("no CUDA device")
    # 1000 and 4100 leave a partial last warp; skip=32 empties lane 31 of every warp.
    check("cuda:0", dim, skip, 256, uniform_index, form)
