"""Differentiable mesh rendering with nvdiffrast 0.4 semantics (rasterize, interpolate,
texture, antialias), Warp arrays in and out, ARC-accumulated hand-written backwards.

Every op records itself on an active ``wp.Tape`` and takes ``reduce=`` (``atomic`` /
``warp`` / ``serial`` / ``arc``; ``floor`` for benchmarks) and ``threshold=``; each has an
explicit ``*_backward`` for callers that run their own autodiff (the torch plugin)."""

from ._src.mesh.antialias_ops import (
    TopologyHash,
    antialias,
    antialias_backward,
    antialias_construct_topology_hash,
)
from ._src.mesh.interp_ops import interpolate, interpolate_backward
from ._src.mesh.raster_ops import rasterize, rasterize_backward
from ._src.mesh.primitives import cube, uv_sphere
from ._src.mesh.texture_ops import MipStack, build_mip, resolve_filter_mode, texture, texture_backward

__all__ = [
    "TopologyHash",
    "antialias",
    "antialias_backward",
    "antialias_construct_topology_hash",
    "MipStack",
    "build_mip",
    "cube",
    "resolve_filter_mode",
    "uv_sphere",
    "texture",
    "texture_backward",
    "interpolate",
    "interpolate_backward",
    "rasterize",
    "rasterize_backward",
]
