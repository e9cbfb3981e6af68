"""Differentiable mesh rendering with nvdiffrast 0.4 semantics (rasterize, interpolate,
texture, antialias), Warp arrays in and out, ARC-accumulated hand-written backwards.

Every op records itself on an active ``wp.Tape`` and takes ``reduce=`` (``atomic`` /
``warp`` / ``serial`` / ``arc``; ``floor`` for benchmarks) and ``threshold=``."""

from ._src.mesh.raster_ops import rasterize, rasterize_backward

__all__ = [
    "rasterize",
    "rasterize_backward",
]
