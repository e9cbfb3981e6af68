"""Elementwise kernels shared by the mesh ops (launched with record_tape=False, so copies
of differentiable inputs never put Warp's own copy adjoints on a tape)."""

import warp as wp


@wp.kernel(enable_backward=False, module="unique")
def copy_into(src: wp.array(dtype=float), dst: wp.array(dtype=float)):
    """dst = src (flat, same size): a launch that a workspace replays, cheaper on the host than wp.copy."""
    i = wp.tid()
    dst[i] = src[i]
