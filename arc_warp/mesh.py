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
their own autodiff. Shapes, dtypes, devices and options are checked before any launch
(``TypeError`` / ``ValueError``). Defined results instead of errors: triangles with
non-finite positions are not drawn; pixels whose ``rast`` id is out of range
interpolate to 0.

Op objects. Each op is an object that owns what one size needs: :class:`Rasterizer`
(depth keys, big-triangle queue), :class:`Interpolator` (the derivatives' link table),
:class:`TextureSampler` and :class:`MipBuilder` (level tables, mip gradients),
:class:`Antialiaser`; each made for its sizes and options, with ``forward`` and
``backward`` methods that take the function's arguments less those (and write into
``out=`` / ``grad_*=`` arrays where given), and its launches prepared on the first call
and reused: a call on memory the object saw before replays the launches it recorded
for that memory (its bindings: ``MeshOp``'s notes), other calls repack only the
arguments whose pointers moved. Another size needs another object. The functions above sit on them: with
``workspace=arc_warp.Workspace(device)`` they reuse the workspace's object of the call's
sizes and options (``Rasterizer.of(workspace, ...)``; made on first use), and with
``out=`` arrays (``build_mip(out=)``, sized by ``mip_shape``; they must not overlap the
inputs) and ``grad_*=`` arrays for the backwards, calls of one size allocate no Warp
arrays (the torch drop-in ``arc_warp_torch.mesh`` works so); without a workspace each
call makes its object. An object's scratch is shared by its calls, so use it (and a
workspace) from one stream at a time.

Triangle indices. A vertex index outside [0, V) (V: the vertices of ``pos``, or of
``attr`` for interpolate) raises ValueError naming the op and the first such triangle.
The forwards of rasterize, interpolate and antialias find it on the device (the
kernels leave such triangles out, as if absent) and write a flag into host memory, read:

- by the functions before they return (on the CPU it costs nothing; on CUDA the call
  waits for its kernels once);
- by an object's ``forward(check=...)``: ``check=True`` as the functions; None (the
  default) reads it at once on the CPU and otherwise leaves it on the device, to be
  read at the start of the object's next forward (whose ValueError then names the
  previous call) or by ``op.check()``. The torch drop-in uses the default: no wait on
  CUDA, the error one call late. Inside a CUDA graph capture nothing waits: the flag
  is read as the host has it.

The backwards do not check (they take the forward's inputs).
"""

from ._src.mesh.antialias_ops import (
    Antialiaser,
    TopologyHash,
    antialias,
    antialias_backward,
    antialias_construct_topology_hash,
)
from ._src.mesh.common import MeshOp
from ._src.mesh.interp_ops import Interpolator, interpolate, interpolate_backward
from ._src.mesh.raster_ops import Rasterizer, rasterize, rasterize_backward
from ._src.mesh.primitives import cube, uv_sphere
from ._src.mesh.texture_ops import (
    MipBuilder,
    MipStack,
    TextureSampler,
    build_mip,
    mip_shape,
    resolve_filter_mode,
    texture,
    texture_backward,
)

__all__ = [
    "Antialiaser",
    "Interpolator",
    "MeshOp",
    "MipBuilder",
    "Rasterizer",
    "TextureSampler",
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
