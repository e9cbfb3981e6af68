"""A synthetic gradient-accumulation kernel: the workload of calibration and of arc_micro.

Blocks of 256 threads each walk a list of targets. For every (lane, target) a lane
computes K=9 gradient values the way a 3DGS backward does for one (pixel, Gaussian)
pair (a conic falloff, its exponential, and the chain rule into mean, conic,
opacity and colour), then adds them into ``dest[target]`` through the accumulator
of the chosen mode. Which lanes take part is set per warp either exactly
(``active_lanes`` lanes of 32) or at random (fraction ``p_active``).
"""

import functools

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
            dx = 3.0 * wp.randf(rng) - 1.5
            dy = 3.0 * u - 1.5
            a = 0.5 + 0.01 * float(target % 37)
            b = 0.05
            c = 0.4 + 0.01 * float(target % 29)
            power = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
            g = wp.exp(-power)
            alpha = wp.min(0.99, 0.8 * g)
            v_alpha = u - 0.5
            v_power = -0.8 * g * v_alpha
            t = 1.0 - alpha
            value = VecK(
                v_power * (a * dx + b * dy),
                v_power * (b * dx + c * dy),
                0.5 * v_power * dx * dx,
                v_power * dx * dy,
                0.5 * v_power * dy * dy,
                g * v_alpha,
                alpha * t * 0.3,
                alpha * t * 0.5,
                alpha * t * 0.7,
            )
            add(dest, target, value, active, threshold)

    return wp.kernel(probe, enable_backward=False, module="unique")


def launch_probe(
    mode: str,
    dest: wp.array,
    n_blocks: int,
    targets_per_block: int,
    active_lanes: int = 0,
    p_active: float = 1.0,
    seed: int = 0,
    threshold: int = 1,
):
    """Launches the probe over ``n_blocks`` blocks of 256 threads on ``dest.device``."""
    wp.launch(
        probe_kernel(mode),
        dim=n_blocks * BLOCK_DIM,
        inputs=[dest, dest.shape[0], targets_per_block, active_lanes, p_active, seed, threshold],
        device=dest.device,
        block_dim=BLOCK_DIM,
    )
