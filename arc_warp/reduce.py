"""ARC: warp-level adaptive atomic reduction, callable from any Warp kernel.

Example::

    import warp as wp
    import arc_warp

    add_vec3 = arc_warp.accumulator(wp.vec3, "arc")

    @wp.kernel
    def splat(points: wp.array(dtype=wp.vec3), cell_of: wp.array(dtype=int),
              grid: wp.array(dtype=wp.vec3), threshold: int):
        i = wp.tid()
        add_vec3(grid, cell_of[i], points[i], True, threshold)

    t = arc_warp.resolve_threshold(grid.device)
    wp.launch(splat, dim=n, inputs=[points, cell_of, grid, t])
"""

from ._src.calibrate import Calibration, calibrate, resolve_threshold
from ._src.reduce_funcs import MODES, accumulator
from ._src.scatter_ops import scatter_add

__all__ = ["MODES", "Calibration", "accumulator", "calibrate", "resolve_threshold", "scatter_add"]
