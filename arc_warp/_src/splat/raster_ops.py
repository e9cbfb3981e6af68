"""Launches of the rasteriser (forward and ARC backward).

CPU launches hold ``cpu_launch_guard``: the kernels' CPU block storage is C static.
"""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.arc.scatter_ops import ordered_scatter_add
from arc_warp._src.launches import Launches
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS
from arc_warp._src.splat.raster_kernels import make_raster_bwd, make_raster_fwd
from arc_warp._src.splat.records import Surface


def rasterize(launches: Launches, key, tiles_x: int, tiles_y: int, background, gauss_ids: wp.array,
              ranges: wp.array, splats: wp.array, rgb: wp.array, color: wp.array, alpha: wp.array,
              depth: wp.array, expected_depth: wp.array, final_t: wp.array, last_ids: wp.array,
              surface: Surface | None = None) -> None:
    """Composites the binned splats front to back into the (H, W) images ``color``,
    ``alpha``, ``depth`` and ``expected_depth`` (the two depth images may be (0, 0): not
    written), and the backward's ``final_t`` and ``last_ids``. ``surface`` is composited
    behind the Gaussians (``make_raster_fwd``'s variant); None renders without one."""
    height, width = alpha.shape
    with cpu_launch_guard(launches.device):
        launches.launch(
            make_raster_fwd(surface is not None), tiles_x * tiles_y * BLOCK_PIXELS,
            [gauss_ids, ranges, splats, rgb, width, height, tiles_x, wp.vec3(*background),
             None if surface is None else surface.colors, None if surface is None else surface.depths, color, alpha,
             depth, expected_depth, final_t, last_ids],
            block_dim=BLOCK_PIXELS, key=("raster_fwd", key))


def raster_backward(launches: Launches, key, tiles_x: int, tiles_y: int, background, gauss_ids: wp.array,
                    ranges: wp.array, splats: wp.array, rgb: wp.array, final_t: wp.array, last_ids: wp.array,
                    depth: wp.array, v_color: wp.array | None, v_alpha: wp.array | None, v_depth: wp.array | None,
                    v_expected_depth: wp.array | None, mode: str, absgrad: bool, threshold: int,
                    raster_grads: wp.array, entry_grads: wp.array | None = None, n_isects: int = 0,
                    surface: Surface | None = None, grad_surface_colors: wp.array | None = None) -> None:
    """Adds each Gaussian's packed gradient (``grad_vector(absgrad)``) of the image
    cotangents (None: zero) into the zeroed (N,) ``raster_grads``, reduced with the
    accumulator of ``mode`` (ARC ``threshold``).

    ``deterministic`` writes one partial per sorted entry (tile, Gaussian) into the zeroed
    ``entry_grads`` (at least ``n_isects`` entries), summed over the tile's pixels in a
    fixed order, then sums each Gaussian's first ``n_isects`` entries in entry order
    (``ordered_scatter_add``): bit-identical from run to run.

    A render with a ``surface`` adds ``T_final * v_color`` into ``grad_surface_colors``
    ((H, W) wp.vec3; None: not wanted) where the surface depth is below +inf."""
    height, width = final_t.shape
    det = mode == "deterministic" and n_isects > 0
    with cpu_launch_guard(launches.device):
        launches.launch(
            make_raster_bwd(mode, absgrad, surface=surface is not None), tiles_x * tiles_y * BLOCK_PIXELS,
            [gauss_ids, ranges, splats, rgb, width, height, tiles_x, wp.vec3(*background),
             None if surface is None else surface.colors, None if surface is None else surface.depths, final_t,
             last_ids, depth, v_color, v_alpha, v_depth, v_expected_depth, threshold,
             entry_grads if det else raster_grads, grad_surface_colors, None],
            block_dim=BLOCK_PIXELS, key=("raster_bwd", key))
    if det:
        launches.call(ordered_scatter_add, raster_grads, gauss_ids[:n_isects], entry_grads[:n_isects])
