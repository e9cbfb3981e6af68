"""A synthetic gradient-accumulation kernel: the workload of calibration and of arc_micro.

Blocks of 256 threads each walk a list of targets. For every (lane, target) an active
lane reads the target's parameters (2D mean, conic, opacity, colour: ``params[target]``)
and computes K=9 gradient values the way a 3DGS backward does for one (pixel,
Gaussian) pair (a conic falloff, its exponential, and the chain rule into mean,
conic, opacity and colour), then adds them into ``dest[target]`` through the
accumulator of the chosen mode. Which lanes take part is set per warp either exactly
(``active_lanes`` lanes of 32) or at random (fraction ``p_active``).
"""

import functools

import numpy as np
import warp as wp

from .reduce_funcs import accumulator

K = 9
VecK = wp.types.vector(K, wp.float32)
BLOCK_DIM = 256


@functools.cache
def probe_kernel(mode: str):
    """The probe kernel for one reduction mode (cached)."""
    add = accumulator(VecK, mode)

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
        for j in range(targets_per_block):
            # Consecutive blocks overlap on their targets, as neighbouring tiles do.
            target = (block * (targets_per_block // 2) + j) % n_targets
            u = wp.randf(rng)
            active = u < p_active
            if active_lanes > 0:
                active = lane < active_lanes
            # Like a rasteriser backward, only lanes that touch the target compute.
            value = VecK()
            if active:
                q = params[target]  # mean2d (2), conic (3), opacity, rgb
                px = 16.0 * wp.randf(rng)
                py = 16.0 * u
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
                value = VecK(
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
            add(dest, target, value, active, threshold)

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
):
    """Launches the probe over ``n_blocks`` blocks of 256 threads on ``dest.device``.

    ``params`` comes from :func:`make_params` with ``dest.shape[0]`` targets.
    """
    wp.launch(
        probe_kernel(mode),
        dim=n_blocks * BLOCK_DIM,
        inputs=[params, dest, dest.shape[0], targets_per_block, active_lanes, p_active, seed, threshold],
        device=dest.device,
        block_dim=BLOCK_DIM,
    )
