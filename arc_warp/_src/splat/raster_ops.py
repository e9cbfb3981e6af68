"""Launches of the rasteriser (forward and ARC backward).

CPU launches hold ``cpu_launch_guard``: the kernels' CPU block storage is C static.
"""

import warp as wp

from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.arc.scatter_ops import ordered_scatter_add
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS, grad_vector
from arc_warp._src.splat.raster_kernels import make_raster_bwd, raster_fwd
from arc_warp._src.splat.records import BinResult, ProjectResult, RasterImages


def rasterize(proj: ProjectResult, bins: BinResult, width: int, height: int, background) -> RasterImages:
    """Composites the binned splats front to back into (H, W) images."""
    device = proj.radii.device
    shape = (height, width)
    images = RasterImages(
        color=wp.empty(shape, dtype=wp.vec3, device=device),
        alpha=wp.empty(shape, dtype=float, device=device),
        depth=wp.empty(shape, dtype=float, device=device),
        expected_depth=wp.empty(shape, dtype=float, device=device),
        final_t=wp.empty(shape, dtype=float, device=device),
        last_ids=wp.empty(shape, dtype=wp.int32, device=device),
    )
    with cpu_launch_guard(device):
        wp.launch(
            raster_fwd,
            dim=bins.tiles_x * bins.tiles_y * BLOCK_PIXELS,
            inputs=[
                bins.gauss_ids,
                bins.tile_ranges,
                proj.splats,
                proj.rgb,
                width,
                height,
                bins.tiles_x,
                wp.vec3(*background),
            ],
            outputs=[
                images.color,
                images.alpha,
                images.depth,
                images.expected_depth,
                images.final_t,
                images.last_ids,
            ],
            block_dim=BLOCK_PIXELS,
            device=device,
            record_tape=False,
        )
    return images


def raster_backward(
    proj: ProjectResult,
    bins: BinResult,
    images: RasterImages,
    background,
    v_color: wp.array,
    v_alpha: wp.array,
    v_depth: wp.array,
    v_expected_depth: wp.array,
    mode: str,
    absgrad: bool,
    threshold: int,
) -> wp.array:
    """Packed per-Gaussian gradients ((N,) ``grad_vector(absgrad)``) of the image cotangents.

    ``deterministic`` writes one partial per sorted entry (tile, Gaussian), summed over
    the tile's pixels in a fixed order, then sums each Gaussian's entries in entry order
    (``ordered_scatter_add``): bit-identical from run to run.
    """
    device = proj.radii.device
    grad_t = grad_vector(absgrad)
    raster_grads = wp.zeros(proj.radii.shape[0], dtype=grad_t, device=device)
    if bins.n_isects == 0:
        return raster_grads
    height, width = images.alpha.shape
    out = raster_grads
    if mode == "deterministic":
        out = wp.zeros(bins.n_isects, dtype=grad_t, device=device)
    with cpu_launch_guard(device):
        wp.launch(
            make_raster_bwd(mode, absgrad),
            dim=bins.tiles_x * bins.tiles_y * BLOCK_PIXELS,
            inputs=[
                bins.gauss_ids,
                bins.tile_ranges,
                proj.splats,
                proj.rgb,
                width,
                height,
                bins.tiles_x,
                wp.vec3(*background),
                images.final_t,
                images.last_ids,
                images.depth,
                v_color,
                v_alpha,
                v_depth,
                v_expected_depth,
                threshold,
            ],
            outputs=[out],
            block_dim=BLOCK_PIXELS,
            device=device,
            record_tape=False,
        )
    if mode == "deterministic":
        ordered_scatter_add(raster_grads, bins.gauss_ids[: bins.n_isects], out)
    return raster_grads
