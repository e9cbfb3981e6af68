"""Synthetic gradient-accumulation kernels: the workloads of calibration and of arc_micro.

The uniform probe (:func:`probe_kernel`): blocks of 256 threads each walk a list of
targets. For every (lane, target) an active lane reads the target's parameters (2D
mean, conic, opacity, colour: ``params[target]``) and computes K=9 gradient values the
way a 3DGS backward does for one (pixel, Gaussian) pair (a conic falloff, its
exponential, and the chain rule into mean, conic, opacity and colour), then adds them
into ``dest[target]`` the way the chosen mode plans. Which lanes take part is set per
warp either exactly (``active_lanes`` lanes of 32) or at random (fraction
``p_active``).

The keyed probe (:func:`keyed_probe_kernel`): every thread is a pixel of a bilinear
texture backward, four float4 adds into the 2x2 texels at one key, planned once per
thread by that key (``keyed_plan``); ``group`` consecutive lanes share a key, as pixels
of a magnified texture share texels (32: one texel per warp; 1: a minified texture).
"""

import functools

import numpy as np
import warp as wp

from .reduce_funcs import keyed_plan, lane_adder, planned_accumulator, warp_plan, warp_reducer

K = 9
VecK = wp.types.vector(K, wp.float32)
BLOCK_DIM = 256


@wp.func
def probe_gradient(q: VecK, px: float, py: float) -> VecK:
    """The K=9 gradients of one (pixel, splat) pair; ``q`` = mean2d (2), conic (3), opacity, rgb."""
    dx = q[0] - px
    dy = q[1] - py
    a = q[2]
    b = q[3]
    c = q[4]
    power = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    g = wp.exp(-power)
    alpha = wp.min(0.99, q[5] * g)
    t = 1.0 - alpha
    v_alpha = (q[6] + q[7] + q[8]) * t - 0.5
    v_power = -q[5] * g * v_alpha
    return VecK(
        v_power * (a * dx + b * dy),
        v_power * (b * dx + c * dy),
        0.5 * v_power * dx * dx,
        v_power * dx * dy,
        0.5 * v_power * dy * dy,
        g * v_alpha,
        alpha * t * q[6],
        alpha * t * q[7],
        alpha * t * q[8],
    )


@functools.cache
def probe_kernel(mode: str, uniform_index: bool = False):
    """The probe kernel for one reduction mode (cached).

    It plans before it computes (see :func:`~arc_warp._src.arc.reduce_funcs.warp_plan`):
    lanes of an atomic warp compute inside the branch that adds, and a reducing warp
    computes in every lane. Every lane of a warp walks the same target, so the probe
    may promise ``uniform_index`` to the reducer, as the tile rasteriser does;
    without the promise it measures the general path, which checks for mixed indices.
    """
    plan_fn = warp_plan(mode)  # never True for atomic and floor
    reduce_fn = warp_reducer(VecK, mode, uniform_index)
    lane_add = lane_adder(VecK, mode)

    def probe(
        params: wp.array(dtype=VecK),
        dest: wp.array(dtype=VecK),
        n_targets: int,
        targets_per_block: int,
        active_lanes: int,  # > 0: exactly this many lanes of each warp; 0: use p_active
        p_active: float,
        seed: int,
        threshold: int,
    ):
        tid = wp.tid()
        block = tid // BLOCK_DIM
        lane = tid % 32
        rng = wp.rand_init(seed, tid)
        # Consecutive blocks overlap on their targets, as neighbouring tiles do. The
        # index wraps with a compare: a division per target would outweigh the
        # work of a sparse warp and blur the comparison of the modes.
        first = (block * (targets_per_block // 2)) % n_targets
        for j in range(targets_per_block):
            target = first + j
            if target >= n_targets:
                target -= n_targets
            u = wp.randf(rng)
            px = 16.0 * wp.randf(rng)
            active = u < p_active
            if active_lanes > 0:
                active = lane < active_lanes
            # Like a rasteriser backward, lanes that add atomically compute only if
            # they touch the target.
            if plan_fn(active, threshold):
                reduce_fn(dest, target, probe_gradient(params[target], px, 16.0 * u), active, threshold)
            elif active:
                lane_add(dest, target, probe_gradient(params[target], px, 16.0 * u), True, threshold)

    return wp.kernel(probe, enable_backward=False, module="unique")


def make_params(n_targets: int, device, seed: int = 0) -> wp.array:
    """Per-target parameters for the probe: means in a 16x16 tile, valid conics."""
    rng = np.random.default_rng(seed)
    q = np.empty((n_targets, K), np.float32)
    q[:, 0:2] = rng.uniform(0.0, 16.0, (n_targets, 2))
    q[:, 2] = rng.uniform(0.05, 0.5, n_targets)
    q[:, 3] = rng.uniform(-0.02, 0.02, n_targets)
    q[:, 4] = rng.uniform(0.05, 0.5, n_targets)
    q[:, 5] = rng.uniform(0.1, 0.99, n_targets)
    q[:, 6:9] = rng.uniform(0.0, 1.0, (n_targets, 3))
    return wp.array(q, dtype=VecK, device=device)


def launch_probe(
    mode: str,
    params: wp.array,
    dest: wp.array,
    n_blocks: int,
    targets_per_block: int,
    active_lanes: int = 0,
    p_active: float = 1.0,
    seed: int = 0,
    threshold: int = 1,
    uniform_index: bool = False,
):
    """Launches the probe over ``n_blocks`` blocks of 256 threads on ``dest.device``.

    ``params`` comes from :func:`make_params` with ``dest.shape[0]`` targets, at
    least ``targets_per_block`` of them; ``uniform_index`` selects the accumulator
    variant (see :func:`probe_kernel`).
    """
    if not 0 < targets_per_block <= dest.shape[0]:
        raise ValueError(f"targets_per_block must be in [1, {dest.shape[0]}] (the target count); got {targets_per_block}")
    wp.launch(
        probe_kernel(mode, uniform_index),
        dim=n_blocks * BLOCK_DIM,
        inputs=[params, dest, dest.shape[0], targets_per_block, active_lanes, p_active, seed, threshold],
        device=dest.device,
        block_dim=BLOCK_DIM,
    )


KEYED_ROW = wp.constant(1024)
"""Texels per row of the keyed probe's target grid (``KEYED_ROW``² float4 texels: 16 MiB,
a 1024² RGBA texture)."""


@functools.cache
def keyed_probe_kernel(mode: str):
    """The keyed probe kernel for one reduction mode (cached): see the module notes."""
    plan_fn = keyed_plan(mode)
    add = planned_accumulator(wp.vec4, mode)

    def keyed_probe(dest: wp.array(dtype=wp.vec4), group: int, seed: int, threshold: int):
        tid = wp.tid()
        lane = tid % 32
        key = (tid // 32) * (32 // group) + lane // group
        x = key % (KEYED_ROW - 1)
        y = (key // (KEYED_ROW - 1)) % (KEYED_ROW - 1)
        t = y * KEYED_ROW + x
        rng = wp.rand_init(seed, tid)
        fx = wp.randf(rng)
        fy = wp.randf(rng)
        d = wp.vec4(wp.randf(rng), wp.randf(rng), wp.randf(rng), 1.0)
        planned = plan_fn(t, True, threshold)
        add(dest, t, (1.0 - fx) * (1.0 - fy) * d, True, threshold, planned)
        add(dest, t + 1, fx * (1.0 - fy) * d, True, threshold, planned)
        add(dest, t + KEYED_ROW, (1.0 - fx) * fy * d, True, threshold, planned)
        add(dest, t + KEYED_ROW + 1, fx * fy * d, True, threshold, planned)

    return wp.kernel(keyed_probe, enable_backward=False, module="unique")


def launch_keyed_probe(mode: str, dest: wp.array, n_threads: int, group: int, seed: int = 0,
                       threshold: int = 1) -> None:
    """Launches the keyed probe: ``n_threads`` pixels (a multiple of 256), ``group``
    lanes per key (a divisor of 32), into ``dest``, (KEYED_ROW², ) wp.vec4 on a CUDA
    device."""
    if 32 % group or n_threads % BLOCK_DIM:
        raise ValueError(f"group must divide 32 and n_threads be a multiple of {BLOCK_DIM}; "
                         f"got {group}, {n_threads}")
    if dest.shape[0] != KEYED_ROW * KEYED_ROW:
        raise ValueError(f"dest must hold {KEYED_ROW}^2 texels; got {dest.shape[0]}")
    wp.launch(keyed_probe_kernel(mode), dim=n_threads, inputs=[dest, group, seed, threshold],
              device=dest.device, block_dim=BLOCK_DIM)
