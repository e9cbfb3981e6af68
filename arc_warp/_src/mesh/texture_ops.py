"""Texture sampling: :class:`TextureSampler` (forward, ARC backward, mip fold) and
:class:`MipBuilder` (the mip stack), and the functional texture / texture_backward /
build_mip on them."""

from __future__ import annotations

import dataclasses

import numpy as np
import warp as wp

from arc_warp._src.launches import View, ptr
from arc_warp._src.mesh.common import (BLOCK, MeshOp, array, chunking, exact, given, grad_of, output, record,
                                       tiled_dim)
from arc_warp._src.mesh.texture_kernels import (BOUNDARY_MODES, FILTER_MODES, NEAREST, make_mip_fold, make_tex_bwd,
                                                make_tex_fwd, mip_build, mip_build2)
from arc_warp._src.mesh.util_kernels import copy_into


@dataclasses.dataclass(frozen=True)
class MipStack:
    """A texture and its mip levels in one (texels, C) float32 array (see texture_kernels):
    ``sizes`` (levels,) vec2i (w, h) and ``offsets`` (levels,) int32 (first row of each
    level) on the device; ``host_sizes`` the same list on the host."""

    data: wp.array
    sizes: wp.array
    offsets: wp.array
    host_sizes: tuple
    images: int
    channels: int


def resolve_filter_mode(filter_mode: str, has_uv_da: bool, has_bias: bool) -> str:
    """The filter mode 'auto' stands for ('linear-mipmap-linear' with uv_da or a bias, else
    'linear'); other names are checked."""
    if filter_mode == "auto":
        return "linear-mipmap-linear" if (has_uv_da or has_bias) else "linear"
    if filter_mode not in FILTER_MODES:
        raise ValueError(f"filter_mode: expected 'auto' or one of {tuple(FILTER_MODES)}, got {filter_mode!r}")
    return filter_mode


def _mip_layout(tex_shape: tuple, max_mip_level) -> tuple[list, np.ndarray, int]:
    """(sizes, offsets, texels) of the stack of a [B, H, W, C] texture: level sizes (w, h),
    halved until 1x1 (or ``max_mip_level``; a side longer than 1 must be even to be
    halved, as in nvdiffrast), the int32 first row of each level, and the rows of all."""
    if len(tex_shape) != 4 or min(tex_shape) < 1:
        raise ValueError(f"tex: expected [B, H, W, C] with every size >= 1, got {tuple(tex_shape)}")
    if max_mip_level is not None and int(max_mip_level) < 0:
        raise ValueError(f"max_mip_level: expected None or >= 0, got {max_mip_level}")
    b, h, w, _ = tex_shape
    sizes = [(w, h)]
    while (w > 1 or h > 1) and (max_mip_level is None or len(sizes) <= int(max_mip_level)):
        if (w > 1 and w % 2) or (h > 1 and h % 2):
            raise ValueError(
                f"texture: mip level {len(sizes)} cannot halve a {w}x{h} level (odd side); use a texture whose "
                f"sides are a power of two times the last level's, or limit max_mip_level (got {max_mip_level})")
        w, h = max(w // 2, 1), max(h // 2, 1)
        sizes.append((w, h))
    counts = [b * sw * sh for sw, sh in sizes]
    return sizes, np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32), int(sum(counts))


def mip_shape(tex_shape, max_mip_level: int | None = None) -> tuple[int, int]:
    """(texels, C): the shape of the float32 array :func:`build_mip` fills for a texture of
    ``tex_shape`` [B, H, W, C] (for callers that allocate it, ``build_mip(out=...)``)."""
    return _mip_layout(tuple(int(s) for s in tex_shape), max_mip_level)[2], int(tex_shape[3])


class MipBuilder(MeshOp):
    """Builds the mip stacks of [B, H, W, C] textures (:func:`build_mip`), with the level
    tables (``sizes``, ``offsets``) on the device. Args: ``tex_shape`` (B, H, W, C);
    ``max_mip_level``, the levels after level 0 (None: down to 1x1); the rest as
    :class:`MeshOp`'s."""

    def __init__(self, tex_shape: tuple, max_mip_level: int | None = None, device=None, record: bool = True):
        super().__init__(None, None, device, record)
        self.tex_shape = tuple(int(s) for s in tex_shape)
        sizes, self._offsets, texels = _mip_layout(self.tex_shape, max_mip_level)
        self.shape = (texels, self.tex_shape[3])  # of a stack
        self.host_sizes = tuple(sizes)
        self.sizes = wp.array(sizes, dtype=wp.vec2i, device=self.device)
        self.offsets = wp.array(self._offsets, dtype=wp.int32, device=self.device)

    def build(self, tex, out=None) -> MipStack:
        """The stack of ``tex``, written into ``out`` (float32 of :attr:`shape`) if given."""
        exact(tex, "tex", self.tex_shape, self.device)
        out = output(out, "out", self.shape, self.device)
        b, n, sizes, offsets = self.tex_shape[0], tex.size, self.host_sizes, self._offsets

        def body():
            # every row is written (level 0 copied, the others built), so no zero fill
            self._launches.launch(copy_into, n, [self._flat(tex, wp.float32), View(out, wp.float32, (n,))])
            # two levels per launch, the last one alone if their count is odd
            for level in range(1, len(sizes), 2):
                src = [out, int(offsets[level - 1]), *sizes[level - 1]]
                if level + 1 < len(sizes):
                    dw, dh = sizes[level + 1]
                    self._launches.launch(mip_build2, (b, dh, dw),
                                          [*src, int(offsets[level]), *sizes[level], int(offsets[level + 1]), dw, dh],
                                          key=level)
                else:
                    dw, dh = sizes[level]
                    self._launches.launch(mip_build, (b, dh, dw), [*src, int(offsets[level]), dw, dh], key=level)

        self._bindings.run(("build", tex.ptr, out.ptr), body)
        return MipStack(out, self.sizes, self.offsets, self.host_sizes, b, self.tex_shape[3])


class TextureSampler(MeshOp):
    """Samples [Bt, Ht, Wt, C] textures at B x H x W texture coordinates with one filter
    and boundary mode (:func:`texture` gives the semantics and the arguments), its level
    tables and mip-gradient scratch made once. ``mip`` is its :class:`MipBuilder` in the
    mipmapped modes (None in the others), whose stacks :meth:`forward` samples. Args:
    ``batch``, ``height``, ``width`` of the [B, H, W, 2] ``uv``; ``tex_shape`` (Bt, Ht, Wt,
    C), Bt 1 or B; ``filter_mode`` 'nearest', 'linear', 'linear-mipmap-nearest' or
    'linear-mipmap-linear'; ``boundary_mode`` 'wrap', 'clamp' or 'zero'; ``max_mip_level``
    as :class:`MipBuilder`'s (0: 'linear'); the rest as :class:`MeshOp`'s."""

    def __init__(self, batch: int, height: int, width: int, tex_shape: tuple, filter_mode: str = "linear",
                 boundary_mode: str = "wrap", max_mip_level: int | None = None, reduce: str = "arc",
                 threshold: int | None = None, device=None, record: bool = True):
        super().__init__(reduce, threshold, device, record)
        if filter_mode == "auto" or resolve_filter_mode(filter_mode, False, False) != filter_mode:
            raise ValueError("TextureSampler: filter_mode 'auto' depends on the call; name a mode")
        if boundary_mode not in BOUNDARY_MODES:
            raise ValueError(f"boundary_mode: expected one of {tuple(BOUNDARY_MODES)}, got {boundary_mode!r}"
                             + (" (cube maps are not supported yet)" if boundary_mode == "cube" else ""))
        self.batch, self.height, self.width = batch, height, width
        self.tex_shape, self.filter_mode = tuple(int(s) for s in tex_shape), filter_mode
        if len(self.tex_shape) != 4 or min(self.tex_shape) < 1 or self.tex_shape[0] not in (1, batch):
            raise ValueError(f"tex: expected [B, H, W, C] with every size >= 1 and a minibatch of 1 or {batch} "
                             f"(that of uv), got {self.tex_shape}")
        if "mipmap" in filter_mode and max_mip_level == 0:
            filter_mode = "linear"
        self._filter, self._boundary = FILTER_MODES[filter_mode], BOUNDARY_MODES[boundary_mode]
        d, (_, ht, wt, c) = self.device, self.tex_shape
        self.mip = MipBuilder(tex_shape, max_mip_level, d, record) if "mipmap" in filter_mode else None
        # without mipmaps the texture itself is the stack: one level
        self._level0 = wp.array([(wt, ht)], dtype=wp.vec2i, device=d), wp.zeros(1, dtype=wp.int32, device=d)
        self.k, self.chunks = chunking(c)
        self._vec = wp.types.vector(self.k, wp.float32)  # k channels at a time
        self._gstack = None  # every level's texel gradients (made by the first backward)

    def _inputs(self, tex, uv, uv_da, mip_level_bias, mip) -> tuple:
        """Checks the inputs; returns the stack sampled: (data, sizes, offsets)."""
        exact(tex, "tex", self.tex_shape, self.device)
        exact(uv, "uv", (self.batch, self.height, self.width, 2), self.device)
        given(uv_da, "uv_da", (self.batch, self.height, self.width, 4), self.device)
        given(mip_level_bias, "mip_level_bias", (self.batch, self.height, self.width), self.device)
        if "mipmap" in self.filter_mode and uv_da is None and mip_level_bias is None:
            raise ValueError(f"filter_mode {self.filter_mode!r} needs uv_da or mip_level_bias")
        if self.mip is None:
            return tex, *self._level0
        if not isinstance(mip, MipStack):
            raise TypeError(f"mip: expected a MipStack from build_mip(), got {type(mip).__name__}")
        if mip.host_sizes[0] != (tex.shape[2], tex.shape[1]) or mip.images != tex.shape[0]:
            raise ValueError(f"mip: built for {mip.images} images of {mip.host_sizes[0]}, tex is {tuple(tex.shape)}")
        return mip.data, mip.sizes, mip.offsets

    def forward(self, tex, uv, uv_da=None, mip_level_bias=None, mip: MipStack | None = None, out=None) -> wp.array:
        """The samples, written into ``out`` if given; ``mip`` (the stack of ``tex``, as
        ``self.mip.build`` makes it) is required in the mipmapped modes."""
        data, sizes, offsets = self._inputs(tex, uv, uv_da, mip_level_bias, mip)
        b, h, w = self.batch, self.height, self.width
        out = output(out, "out", (b, h, w, self.tex_shape[3]), self.device)

        def body():
            self._launches.launch(
                make_tex_fwd(self._filter, self.k, self.chunks), b * h * w,
                [self._flat(data, self._vec), sizes, offsets, self._flat(uv, wp.vec2), self._flat(uv_da, wp.vec4),
                 self._flat(mip_level_bias, wp.float32), h * w, self.tex_shape[0], self._boundary,
                 self._flat(out, self._vec)])

        if b * h * w:
            self._bindings.run(("forward", data.ptr, data.shape, sizes.ptr, offsets.ptr, uv.ptr, ptr(uv_da),
                                ptr(mip_level_bias), out.ptr), body)
        return out

    def backward(self, tex, uv, grad_out, uv_da=None, mip_level_bias=None, mip: MipStack | None = None,
                 grad_tex=None, grad_uv=None, grad_uv_da=None, grad_mip_level_bias=None,
                 tex_grad: bool = True) -> tuple:
        """``(grad_tex, grad_uv, grad_uv_da, grad_mip_level_bias)`` added into the arrays
        given (new zeroed ones for None; None for absent inputs, and ``grad_tex`` with
        ``tex_grad=False``)."""
        data, sizes, offsets = self._inputs(tex, uv, uv_da, mip_level_bias, mip)
        b, h, w, c = self.batch, self.height, self.width, self.tex_shape[3]
        grads = [output(g, name, like.shape, self.device, zero=True) if like is not None and want else None
                 for g, name, like, want in ((grad_tex, "grad_tex", tex, tex_grad), (grad_uv, "grad_uv", uv, True),
                                             (grad_uv_da, "grad_uv_da", uv_da, True),
                                             (grad_mip_level_bias, "grad_mip_level_bias", mip_level_bias, True))]
        grad_tex, grad_uv, grad_uv_da, grad_bias = grads
        go = given(grad_out, "grad_out", (b, h, w, c), self.device)
        if go is None or b * h * w == 0:
            return tuple(grads)
        vec, gstack = self._vec, None
        if tex_grad:
            if self._gstack is None or self._gstack.size != data.size:
                self._gstack = wp.empty(data.size, dtype=wp.float32, device=self.device)
            gstack = self._gstack

        def body():
            if tex_grad:
                self._launches.call(gstack.zero_)  # texel gradients of every level are summed into it
            self._launches.launch(
                make_tex_bwd(self.mode, self._filter, self.k, self.chunks), tiled_dim(b, h, w),
                [self._flat(data, vec), sizes, offsets, self._flat(uv, wp.vec2), self._flat(uv_da, wp.vec4),
                 self._flat(mip_level_bias, wp.float32), self._flat(go, vec), w, h, self.tex_shape[0],
                 self._boundary, self.threshold, self._flat(gstack, vec),
                 self._flat(grad_uv if self._filter != NEAREST else None, wp.vec2),
                 self._flat(grad_uv_da, wp.vec4), self._flat(grad_bias, wp.float32)],
                block_dim=BLOCK)
            if tex_grad:
                self._launches.launch(make_mip_fold(self.k, self.chunks), self.tex_shape[:3],
                                      [self._flat(gstack, vec), sizes, offsets, self._flat(grad_tex, vec)])

        self._bindings.run(("backward", data.ptr, data.shape, sizes.ptr, offsets.ptr, uv.ptr, ptr(uv_da),
                            ptr(mip_level_bias), go.ptr, ptr(gstack), ptr(grad_tex), ptr(grad_uv), ptr(grad_uv_da),
                            ptr(grad_bias)), body)
        return tuple(grads)


def build_mip(tex: wp.array, max_mip_level: int | None = None, out: wp.array | None = None,
              workspace=None) -> MipStack:
    """The mip stack of ``tex`` ([B, H, W, C] float32), levels by 2x2 box filtering.

    ``max_mip_level`` limits the number of levels after level 0 (None: down to 1x1).
    ``out`` (float32 of :func:`mip_shape`) receives the stack instead of a new array."""
    tex = array(tex, "tex", 4)
    return MipBuilder.of(workspace, tex.device, tuple(tex.shape), max_mip_level).build(tex, out)


def _sampler(workspace, tex, uv, uv_da, mip_level_bias, mip, filter_mode, boundary_mode, max_mip_level, reduce,
             threshold) -> tuple[TextureSampler, MipStack | None]:
    """The :class:`TextureSampler` of a call and the stack it samples: ``mip``, or in a
    mipmapped mode without one a new stack of ``tex`` (the backward reads it)."""
    tex = array(tex, "tex", 4)
    uv = array(uv, "uv", 4, 2, tex.device)
    mode = resolve_filter_mode(filter_mode, uv_da is not None, mip_level_bias is not None)
    op = TextureSampler.of(workspace, tex.device, *uv.shape[:3], tuple(tex.shape), mode, boundary_mode,
                           max_mip_level, reduce=reduce, threshold=threshold)
    return op, op.mip.build(tex) if op.mip is not None and mip is None else mip


def texture(
    tex: wp.array,  # [B or 1, Ht, Wt, C] float32
    uv: wp.array,  # [B, H, W, 2] float32 texture coordinates
    uv_da: wp.array | None = None,  # [B, H, W, 4] (du/dX, du/dY, dv/dX, dv/dY)
    mip_level_bias: wp.array | None = None,  # [B, H, W] float32, levels
    mip: MipStack | None = None,  # from build_mip(tex): reuse a constant texture's pyramid
    filter_mode: str = "auto",
    boundary_mode: str = "wrap",
    max_mip_level: int | None = None,
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace: its TextureSampler of this size is reused
    out: wp.array | None = None,  # [B, H, W, C] float32 to write instead of a new array
) -> wp.array:
    """Samples a 2D texture with nvdiffrast 0.4 semantics (see texture_kernels for the
    conventions). ``filter_mode`` 'auto' is 'linear-mipmap-linear' when ``uv_da`` or
    ``mip_level_bias`` is given, else 'linear'. Mipmapped modes build the pyramid inside
    (a new array each call) or use ``mip``; sides longer than 1 must stay even down the
    pyramid, else a ValueError suggests ``max_mip_level``. Cube maps are not supported.
    Returns [B, H, W, C] float32, recorded on an active ``wp.Tape``: gradients into ``tex``
    (every mip level folded back into level 0), ``uv``, ``uv_da`` and ``mip_level_bias``.
    """
    op, stack = _sampler(workspace, tex, uv, uv_da, mip_level_bias, mip, filter_mode, boundary_mode, max_mip_level,
                         reduce, threshold)
    out = op.forward(tex, uv, uv_da, mip_level_bias, stack, out)
    record([tex, uv, uv_da, mip_level_bias], [out],
           lambda: op.backward(tex, uv, out.grad, uv_da, mip_level_bias, stack, grad_of(tex), grad_of(uv),
                               grad_of(uv_da), grad_of(mip_level_bias), tex.requires_grad))
    return out


def texture_backward(
    tex: wp.array,
    uv: wp.array,
    grad_out: wp.array | None,  # [B, H, W, C]
    uv_da: wp.array | None = None,
    mip_level_bias: wp.array | None = None,
    mip: MipStack | None = None,
    filter_mode: str = "auto",
    boundary_mode: str = "wrap",
    max_mip_level: int | None = None,
    grad_tex: wp.array | None = None,  # added into if given
    grad_uv: wp.array | None = None,
    grad_uv_da: wp.array | None = None,
    grad_mip_level_bias: wp.array | None = None,
    reduce: str = "arc",
    threshold: int | None = None,
    workspace=None,  # arc_warp.Workspace (see texture)
    tex_grad: bool = True,  # False: tex's gradient is not wanted (skips the texel scatter and fold)
) -> tuple:
    """Gradients of :func:`texture`: ``(grad_tex, grad_uv, grad_uv_da, grad_mip_level_bias)``
    shaped like the inputs (None for absent ones). Texel gradients of every level are
    summed with the ``reduce`` accumulator, then folded into level 0. As in nvdiffrast,
    nearest filtering gives no uv gradient, and the level of detail's gradient reaches
    ``uv_da``/``mip_level_bias`` only in 'linear-mipmap-linear'. ``grad_tex`` is None with
    ``tex_grad=False``."""
    op, stack = _sampler(workspace, tex, uv, uv_da, mip_level_bias, mip, filter_mode, boundary_mode, max_mip_level,
                         reduce, threshold)
    return op.backward(tex, uv, grad_out, uv_da, mip_level_bias, stack, grad_tex, grad_uv, grad_uv_da,
                       grad_mip_level_bias, tex_grad)
