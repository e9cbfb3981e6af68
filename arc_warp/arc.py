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

Kernels that compute their values only for valid lanes plan first, so that sparse
warps compute inside the branch that adds them (see :func:`warp_plan`)::

    plan = arc_warp.warp_plan("arc")
    reduce = arc_warp.warp_reducer(wp.vec3, "arc")
    ...
        if plan(valid, threshold):
            reduce(grid, cell, value_of(i), valid, threshold)  # every lane of the warp
        elif valid:
            wp.atomic_add(grid, cell, value_of(i))

A thread that makes several adds to different targets plans once for all of them with a
representative target (:func:`keyed_plan`), and passes the plan to each add::

    plan = arc_warp.keyed_plan("arc")
    add = arc_warp.planned_accumulator(wp.vec4, "arc")
    ...
        planned = plan(v0, valid, threshold)  # e.g. the triangle's first vertex
        add(grid, v0, g0, valid, threshold, planned)
        add(grid, v1, g1, valid, threshold, planned)

with ``threshold = arc_warp.resolve_threshold(device, keyed=True)``: keyed plans have a
calibrated T of their own (see :mod:`arc_warp._src.arc.calibrate`).

An ordinary differentiable kernel gets ARC in its ``wp.Tape`` backward, its source
unchanged, through :func:`arc_adjoint` (reads of float32 array arguments accumulate their
gradients with ARC; statement ``wp.atomic_add`` adds with ARC in the forward)::

    p2g_arc = arc_warp.arc_adjoint(p2g, mode="arc")   # p2g: an ordinary @wp.kernel
    with wp.Tape() as tape:
        wp.launch(p2g_arc, dim=n, inputs=[...])

:func:`adjoint_sites` lists what was rewritten and what was left to Warp.
"""

from ._src.arc.autodiff import ADJOINT_MODES, AdjointSite, adjoint_sites, arc_adjoint
from ._src.arc.calibrate import Calibration, calibrate, resolve_threshold
from ._src.arc.reduce_funcs import MODES, accumulator, keyed_plan, planned_accumulator, warp_plan, warp_reducer
from ._src.arc.scatter_ops import scatter_add

__all__ = [
    "ADJOINT_MODES",
    "AdjointSite",
    "MODES",
    "Calibration",
    "accumulator",
    "adjoint_sites",
    "arc_adjoint",
    "calibrate",
    "keyed_plan",
    "planned_accumulator",
    "resolve_threshold",
    "scatter_add",
    "warp_plan",
    "warp_reducer",
]
