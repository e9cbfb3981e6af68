"""Differentiable mesh rendering with nvdiffrast 0.4 semantics: rasterize, interpolate,
texture, antialias. Warp arrays in and out (float32 in nvdiffrast's layouts, int32
triangles), hand-written backwards whose scatters into vertices and texels accumulate
through ARC's general path.

Example (a textured mesh; ``pos`` [B, V, 4] clip space, ``tri`` [F, 3] int32, ``uv`` [V, 2],
``tex`` [1, Ht, Wt, 3])::

    import warp as wp
    import arc_warp.mesh as dr

    tape = wp.Tape()
    with tape:
        rast, rast_db = dr.rasterize(pos, tri, (512, 512))
        texc, texd = dr.interpolate(uv, rast, tri, rast_db, diff_attrs="all")
        color = dr.texture(tex, texc, texd, filter_mode="linear-mipmap-linear")
        color = dr.antialias(color, rast, pos, tri)
        wp.launch(my_loss, ..., inputs=[color], outputs=[loss])
    tape.backward(loss)          # pos.grad, tex.grad, uv.grad (where requires_grad)

Conventions: pixel centres at +0.5, image row 0 at NDC y = -1 (nvdiffrast's bottom-up
memory order), ``rast`` = (u, v, z/w, triangle_id + 1), interpolation u a0 + v a1 +
(1 - u - v) a2 with perspective-correct (u, v), texel centres at (i + 0.5) / size.

Every op records itself on an active ``wp.Tape`` and takes ``reduce=`` (``atomic`` /
``warp`` / ``serial`` / ``arc``; ``floor`` for benchmarks) and ``threshold=`` (None: the
workspace's keyed threshold, or ``arc_warp.resolve_threshold(device, keyed=True)``; at
33 ``arc`` runs as ``atomic``); each has an explicit ``*_backward`` for callers with
their own autodiff (``arc_warp_torch.mesh``, the nvdiffrast.torch drop-in). Defined
results instead of errors: triangles with out-of-range vertex indices or non-finite
positions are not drawn; pixels whose ``rast`` id is out of range interpolate to 0.
Shapes, dtypes, devices and options are checked before any launch (``TypeError`` /
``ValueError``).

Repeated calls: pass ``workspace=arc_warp.Workspace(device)`` to keep scratch buffers
(depth keys, mip gradients) and prepared launches across calls, and ``out=`` arrays
(``build_mip(out=)``, sized by ``mip_shape``) to write results into memory the caller
manages (they must not overlap the inputs); calls of one size then allocate no Warp arrays
(the torch drop-in does both). With both, and ``grad_*=`` arrays for the backwards, a
call repeated with arrays of the same shapes and dtypes and the same options reuses its
checked, packed launches (only moved pointers are rewritten). A workspace's scratch is
shared by its calls, so use it from one stream at a time.
"""

from ._src.mesh.antialias_ops import (
    TopologyHash,
    antialias,
    antialias_backward,
    antialias_construct_topology_hash,
)
from ._src.mesh.interp_ops import interpolate, interpolate_backward
from ._src.mesh.raster_ops import rasterize, rasterize_backward
from ._src.mesh.primitives import cube, uv_sphere
from ._src.mesh.texture_ops import MipStack, build_mip, mip_shape, resolve_filter_mode, texture, texture_backward

__all__ = [
    "TopologyHash",
    "antialias",
    "antialias_backward",
    "antialias_construct_topology_hash",
    "MipStack",
    "build_mip",
    "mip_shape",
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
