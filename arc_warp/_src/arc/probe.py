"""A synthetic gradient-accumulation kernel: the workload of calibration and of arc_micro.

Blocks of 256 threads each walk a list of targets. For every (lane, target) an active
lane reads the target's parameters (2D mean, conic, opacity, colour: ``params[target]``)
and computes K=9 gradient values the way a 3DGS backward does for one (pixel,
Gaussian) pair (a conic falloff, its exponential, and the chain rule into mean,
conic, opacity and colour), then adds them into ``dest[target]`` the way the chosen
mode plans. Which lanes take part is set per warp either exactly
(``active_lanes`` lanes of 32) or at random (fraction ``p_active``).
"""

import functools

import numpy as np
import warp as wp

from .reduce_funcs import lane_adder, warp_plan, warp_reducer

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
