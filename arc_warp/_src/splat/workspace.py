"""Workspace: the renderers and mesh ops that the functional APIs reuse on one device."""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.calibrate import resolve_threshold
from arc_warp._src.splat.records import RenderSettings
from arc_warp._src.splat.renderer import GaussianRenderer


class Workspace:
    """The objects that repeated functional calls reuse on one device (explicit state, no
    globals): pass it as ``workspace=`` to :func:`render_gaussians` and to the mesh ops.

    It holds one :class:`GaussianRenderer` per image size, camera count, SH coefficient
    count and settings (:meth:`renderer`; a new Gaussian count resizes it), so renders of
    one size reuse their scratch and prepared launches, one mesh op object per op, sizes
    and options (:meth:`mesh_op`), and resolves the ARC thresholds once, here, so no step
    calibrates lazily. Use a workspace from one thread (and one stream) at a time.

    Args:
        device: Warp device (default: the current one).
        threshold: ARC threshold for renders and mesh ops whose settings give none; None
            resolves the device's calibrated values (on a GPU never calibrated, this
            calibrates once).
        allocator: None, or ``nbytes -> (pointer, owner)`` for the renderers' per-call
            scratch (see :class:`GaussianRenderer`).
    """

    def __init__(self, device=None, threshold: int | None = None, allocator=None):
        self.device = wp.get_device(device)
        self.threshold = resolve_threshold(self.device, threshold)
        self.keyed_threshold = resolve_threshold(self.device, threshold, keyed=True)
        self.allocator = allocator
        # (width, height, cameras, sh_coeffs, settings) -> GaussianRenderer
        self.renderers: dict[tuple, GaussianRenderer] = {}
        # (op class, sizes..., options...) -> arc_warp.mesh op object (Rasterizer, ...)
        self.mesh_ops: dict[tuple, object] = {}

    def renderer(self, width: int, height: int, gaussians: int, cameras: int, sh_coeffs: int,
                 settings: RenderSettings) -> GaussianRenderer:
        """The renderer of this size and settings (made on first use), resized to
        ``gaussians`` if it rendered another count."""
        key = (width, height, cameras, sh_coeffs, settings)
        renderer = self.renderers.get(key)
        if renderer is None:
            renderer = self.renderers[key] = GaussianRenderer(
                width, height, gaussians, cameras, sh_coeffs, settings, self.device, self.threshold,
                allocator=self.allocator)
        elif renderer.num_gaussians != gaussians:
            renderer.resize(gaussians)
        return renderer

    def mesh_op(self, key: tuple, make):
        """The mesh op object of ``key`` (its class, sizes and options), made by ``make()``
        on first use (``arc_warp.mesh``'s ``Rasterizer.of`` and the like build the key)."""
        op = self.mesh_ops.get(key)
        if op is None:
            op = self.mesh_ops[key] = make()
        return op
