"""Launches of the rasteriser (forward and ARC backward).

CPU launches hold ``cpu_launch_guard``: the kernels' CPU block storage is C static.
"""

import warp as wp

from arc_warp._src.arc.intrinsics import cpu_launch_guard
from arc_warp._src.arc.scatter_ops import ordered_scatter_add
from arc_warp._src.splat.geometry_funcs import BLOCK_PIXELS, grad_vector
from arc_warp._src.splat.raster_kernels import make_raster_bwd, make_raster_fwd
from arc_warp._src.splat.records import BinResult, ProjectResult, RasterImages, Surface
from arc_warp._src.splat.workspace import SCRATCH_ALIGN, Frame


def rasterize(
    proj: ProjectResult, bins: BinResult, width: int, height: int, background, frame: Frame, outputs: dict,
    surface: Surface | None = None,
) -> RasterImages:
    """Composites the binned splats front to back into (H, W) images.

    ``outputs`` holds the caller's (H, W) ``color``, ``alpha``, ``depth`` and
    ``expected_depth`` arrays (the two depth images may be (0, 0): not written; the
    backward then must get no depth cotangents); the backward's state comes from ``frame``.
    ``surface`` (checked (H, W) arrays) is composited behind the Gaussians
    (``make_raster_fwd``); None renders without one, with the plain kernel."""
    shape = (height, width)
    images = RasterImages(
        color=outputs["color"],
        alpha=outputs["alpha"],
        depth=outputs["depth"],
        expected_depth=outputs["expected_depth"],
        final_t=frame.array("final_t", shape, float),
        last_ids=frame.array("last_ids", shape, wp.int32),
        surface=surface,
    )
    with cpu_launch_guard(frame.device):
        frame.launch(
            make_raster_fwd(surface is not None),
            bins.tiles_x * bins.tiles_y * BLOCK_PIXELS,
            [
                bins.gauss_ids,
                bins.tile_ranges,
                proj.splats,
                proj.rgb,
                width,
                height,
                bins.tiles_x,
                wp.vec3(*background),
                None if surface is None else surface.colors,
                None if surface is None else surface.depths,
                images.color,
                images.alpha,
                images.depth,
                images.expected_depth,
                images.final_t,
                images.last_ids,
            ],
            block_dim=BLOCK_PIXELS,
        )
    return images


def raster_backward(
    proj: ProjectResult,
    bins: BinResult,
    images: RasterImages,
    background,
    v_color: wp.array | None,
    v_alpha: wp.array | None,
    v_depth: wp.array | None,
    v_expected_depth: wp.array | None,
    mode: str,
    absgrad: bool,
    threshold: int,
    frame: Frame,
    skip: bool = True,
    counts: wp.array | None = None,
    share_room: bool = True,
    grad_surface_colors: wp.array | None = None,
) -> wp.array:
    """Packed per-Gaussian gradients ((N,) ``grad_vector(absgrad)``) of the image cotangents
    (None: zero), zeroed, starting the backward's stage of ``frame.backward_shared``'s scratch
    arena (the forward's sorts are done with it), with room after them for the SH
    backward's (N,) vec3 view-direction share if ``share_room`` (``sh_ops.color_backward``
    puts it there unless given an array of its own).

    ``deterministic`` writes one partial per sorted entry (tile, Gaussian), summed over
    the tile's pixels in a fixed order, then sums each Gaussian's entries in entry order
    (``ordered_scatter_add``): bit-identical from run to run.

    ``skip`` and ``counts`` (tests, benchmarks) are ``make_raster_bwd``'s: ``skip=False``
    evaluates every entry in every warp; a (2,) int32 ``counts`` gets the warp-entries
    evaluated and skipped added.

    A render with a surface (``images.surface``) adds ``T_final * v_color`` into
    ``grad_surface_colors`` ((H, W) wp.vec3; None: not wanted) where the surface depth is
    below +inf; it runs the kernel also without intersections, for that gradient.
    """
    grad_t = grad_vector(absgrad)
    n = proj.radii.shape[0]
    room = n * wp.types.type_size_in_bytes(grad_t)
    if share_room:  # the SH backward's (N,) vec3 share follows on the next SCRATCH_ALIGN boundary
        room += n * wp.types.type_size_in_bytes(wp.vec3) + SCRATCH_ALIGN
    raster_grads = frame.backward_shared.scratch(n, grad_t, room=room, zero=True)
    surface = images.surface
    if bins.n_isects == 0 and surface is None:
        return raster_grads
    height, width = images.alpha.shape
    out = raster_grads
    per_entry = mode == "deterministic" and bins.n_isects > 0
    if per_entry:
        out = frame.backward_shared.capacity("entry_grads", bins.n_isects, grad_t)
        out.zero_()
    with cpu_launch_guard(frame.device):
        frame.launch(
            make_raster_bwd(mode, absgrad, skip, counts is not None, surface is not None),
            bins.tiles_x * bins.tiles_y * BLOCK_PIXELS,
            [
                bins.gauss_ids,
                bins.tile_ranges,
                proj.splats,
                proj.rgb,
                width,
                height,
                bins.tiles_x,
                wp.vec3(*background),
                None if surface is None else surface.colors,
                None if surface is None else surface.depths,
                images.final_t,
                images.last_ids,
                images.depth,
                v_color,
                v_alpha,
                v_depth,
                v_expected_depth,
                threshold,
                out,
                grad_surface_colors,
                counts,
            ],
            block_dim=BLOCK_PIXELS,
        )
    if per_entry:
        ordered_scatter_add(raster_grads, bins.gauss_ids[: bins.n_isects], out[: bins.n_isects])
    return raster_grads
