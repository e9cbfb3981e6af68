"""nvdiffrast.torch drop-in on arc_warp.mesh: switch with one import line::

    import arc_warp_torch.mesh as dr      # instead of: import nvdiffrast.torch as dr

    glctx = dr.RasterizeCudaContext()    # accepted and ignored (also RasterizeGLContext)
    rast, rast_db = dr.rasterize(glctx, pos, tri, resolution=[256, 256])
    uv, uv_da = dr.interpolate(uv_attr, rast, uv_tri, rast_db=rast_db, diff_attrs="all")
    color = dr.texture(tex, uv, uv_da, filter_mode="linear-mipmap-linear")
    color = dr.antialias(color, rast, pos, tri)

Signatures and returns follow nvdiffrast 0.4 (tensors, layouts, conventions), plus a
``reduce=`` keyword on each op selecting the backward's gradient accumulation (``arc``
by default; ``atomic`` / ``warp`` / ``serial``). CPU tensors work too.

What differs from nvdiffrast:

- no depth peeling (``DepthPeeler``), no cube maps (``boundary_mode='cube'``), and
  ``texture(mip=...)`` takes only ``texture_construct_mip``'s result (not a list of
  custom levels);
- coverage and the depth test follow nvdiffrast's CUDA rasterizer bit for bit
  (frustum clipping, vertices snapped to 1/16 pixel, its fill rule and fixed-point
  depth, ties to the later triangle); non-finite vertices cull their triangle;
- backward gradients are exact derivatives of the forward (nvdiffrast adds small
  epsilons to two denominators in rasterize's and antialias's backward, and its
  rasterize backward ignores the forward's clamp of u, v, which acts where a snapped
  triangle covers a pixel centre outside the exact one);
- ``ranges`` may be a CPU or CUDA int32 tensor (it is read on the host);
- the topology hash is built on the host (one copy of ``tri``);
- a vertex index of ``tri`` out of range raises ValueError (nvdiffrast leaves it
  undefined); the check runs on the device: on the CPU the op raises, on CUDA (no
  wait) the next call of the same op and sizes does, naming the previous call;
- scratch buffers and prepared launches are kept per thread and device, in the mesh op
  objects of the workspace of the thread's default ``RenderContext`` (the one
  ``rasterization`` renders with), so ops from several threads each use their own;
  within a thread, issue the ops from one CUDA stream at a time.
"""

from __future__ import annotations

import numpy as np
import torch

import arc_warp.mesh as core
from arc_warp_torch._mesh_autograd import Antialias, Interpolate, Rasterize, Texture, to_warp


class RasterizeCudaContext:
    """Accepted for compatibility and ignored (arc_warp needs no rasteriser context)."""

    def __init__(self, device=None, **kwargs):
        self.device = device


class RasterizeGLContext(RasterizeCudaContext):
    """Accepted for compatibility and ignored."""


def _float(name: str, t, ndims: tuple[int, ...], last: int | None = None) -> torch.Tensor:
    """``t`` as a contiguous float32 tensor of one of ``ndims`` ranks (and last axis ``last``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if last is not None and (t.dim() == 0 or t.shape[-1] != last):
        raise ValueError(f"{name}: expected last dimension {last}, got shape {list(t.shape)}")
    if t.dim() not in ndims:
        raise ValueError(f"{name}: expected {' or '.join(map(str, ndims))} dimensions, got shape {list(t.shape)}")
    return (t if t.dtype == torch.float32 else t.to(torch.float32)).contiguous()


def _int(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise TypeError(f"{name}: expected an int32 torch.Tensor, got "
                        f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    return t.contiguous()


def rasterize(glctx, pos, tri, resolution, ranges=None, grad_db=True, reduce="arc"):
    """nvdiffrast.torch.rasterize: returns ``(rast, rast_db)`` [B, H, W, 4] float32."""
    ranges = None if ranges is None else np.asarray(_int("ranges", ranges).cpu())
    try:  # the values are checked by the core's Rasterizer
        resolution = tuple(int(r) for r in resolution)
    except (TypeError, ValueError):
        raise TypeError(f"resolution: expected (height, width) integers, got {resolution!r}") from None
    return Rasterize.apply(_float("pos", pos, (2, 3), 4), _int("tri", tri), resolution, ranges, bool(grad_db), reduce)


def interpolate(attr, rast, tri, rast_db=None, diff_attrs=None, reduce="arc"):
    """nvdiffrast.torch.interpolate: returns ``(out, out_da)``."""
    if isinstance(diff_attrs, (list, tuple, np.ndarray, torch.Tensor)):
        diff_attrs = tuple(int(i) for i in np.asarray(diff_attrs).reshape(-1))
    rast_db = None if rast_db is None else _float("rast_db", rast_db, (4,), 4)
    if not diff_attrs:
        diff_attrs, rast_db = None, None
    return Interpolate.apply(_float("attr", attr, (2, 3)), _float("rast", rast, (4,), 4), _int("tri", tri), rast_db,
                             diff_attrs, reduce)


def texture(tex, uv, uv_da=None, mip_level_bias=None, mip=None, filter_mode="auto", boundary_mode="wrap",
            max_mip_level=None, reduce="arc"):
    """nvdiffrast.torch.texture (2D textures): returns [B, H, W, C] float32."""
    if mip is not None and not isinstance(mip, core.MipStack):
        raise TypeError(f"mip: expected the result of texture_construct_mip, got {type(mip).__name__}")
    uv_da = None if uv_da is None else _float("uv_da", uv_da, (4,), 4)
    bias = None if mip_level_bias is None else _float("mip_level_bias", mip_level_bias, (3,))
    return Texture.apply(_float("tex", tex, (4,)), _float("uv", uv, (4,), 2), uv_da, bias, mip, filter_mode,
                         boundary_mode, max_mip_level, reduce)


def texture_construct_mip(tex, max_mip_level=None, cube_mode=False):
    """The mip pyramid of a texture that stays constant, for ``texture(mip=...)``."""
    if cube_mode:
        raise ValueError("texture_construct_mip: cube maps are not supported")
    return core.build_mip(to_warp(_float("tex", tex, (4,))), max_mip_level)


def antialias(color, rast, pos, tri, topology_hash=None, pos_gradient_boost=1.0, reduce="arc"):
    """nvdiffrast.torch.antialias: returns the antialiased [B, H, W, C] colour."""
    if topology_hash is not None and not isinstance(topology_hash, core.TopologyHash):
        raise TypeError(f"topology_hash: expected antialias_construct_topology_hash's result, got "
                        f"{type(topology_hash).__name__}")
    return Antialias.apply(_float("color", color, (4,)), _float("rast", rast, (4,), 4), _float("pos", pos, (2, 3), 4),
                           _int("tri", tri), topology_hash, float(pos_gradient_boost), reduce)


def antialias_construct_topology_hash(tri):
    """Edge adjacency of ``tri`` for ``antialias(topology_hash=...)``."""
    return core.antialias_construct_topology_hash(to_warp(_int("tri", tri)))


__all__ = [
    "RasterizeCudaContext",
    "RasterizeGLContext",
    "antialias",
    "antialias_construct_topology_hash",
    "interpolate",
    "rasterize",
    "texture",
    "texture_construct_mip",
]
