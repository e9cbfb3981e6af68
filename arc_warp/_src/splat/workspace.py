"""Workspace: the renderers and mesh ops that the functional APIs reuse on one device."""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.calibrate import resolve_threshold
from arc_warp._src.splat.records import RenderSettings
from arc_warp._src.splat.renderer import GaussianRenderer


class Workspace:
    """The objects that repeated functional calls reuse on one device (explicit state, no
    globals): pass it as ``workspace=`` to :func:`render_gaussians` and to the mesh ops.

    It holds one object per kind and size in one dict, keyed by what sizes the object:
    ``(GaussianRenderer, width, height, cameras, sh_coeffs, settings)`` for a
    :class:`GaussianRenderer` (:meth:`renderer`; a new Gaussian count resizes it, so renders
    of one size reuse their scratch and prepared launches), and ``(op class, sizes...,
    options...)`` for a mesh op object (``arc_warp.mesh``'s ``Rasterizer.of`` and the like
    build the key; :meth:`get`). Entries are never dropped: they live as long as the
    workspace (a new size adds one). It also resolves the ARC thresholds once, here, so
    no step calibrates lazily. Use a workspace from one thread (and one stream) at a time.

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
        self._objects: dict[tuple, object] = {}  # (kind, sizes..., options...) -> its object

    def get(self, key: tuple, make):
        """The object of ``key`` (its kind, sizes and options), made by ``make()`` on first use."""
        obj = self._objects.get(key)
        if obj is None:
            obj = self._objects[key] = make()
        return obj

    def renderer(self, width: int, height: int, gaussians: int, cameras: int, sh_coeffs: int,
                 settings: RenderSettings) -> GaussianRenderer:
        """The renderer of this size and settings (made on first use), resized to
        ``gaussians`` if it rendered another count."""
        renderer = self.get((GaussianRenderer, width, height, cameras, sh_coeffs, settings), lambda: GaussianRenderer(
            width, height, gaussians, cameras, sh_coeffs, settings, self.device, self.threshold,
            allocator=self.allocator))
        if renderer.num_gaussians != gaussians:
            renderer.resize(gaussians)
        return renderer

    def objects(self, kind: type | None = None) -> list:
        """The objects held (of class ``kind`` only, if given), in the order they were made."""
        return [obj for obj in self._objects.values() if kind is None or isinstance(obj, kind)]

    def renderers(self) -> list[GaussianRenderer]:
        """The :class:`GaussianRenderer` objects held (a graph capture marks them capturing)."""
        return self.objects(GaussianRenderer)
