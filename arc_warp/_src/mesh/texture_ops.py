"""Launches of texture sampling: mip stack construction, forward, ARC backward, mip fold."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

from arc_warp._src.mesh.common import (
    BLOCK,
    check_shape,
    chunking,
    device_constant,
    cotangent,
    float_array,
    grad_of,
    grad_or_new,
    record,
    reduce_settings,
    tiled_dim,
    vector_view,
)
from arc_warp._src.mesh.util_kernels import add_into
from arc_warp._src.mesh.texture_kernels import (
    BOUNDARY_MODES,
    FILTER_MODES,
    NEAREST,
    make_tex_bwd,
    make_tex_fwd,
    mip_build,
    mip_fold,
)


@dataclass(frozen=True)
class MipStack:
    """A texture and its mip levels in one (texels, C) float32 array (see texture_kernels).

    ``sizes`` (levels,) vec2i (w, h) and ``offsets`` (levels,) int32 (first row of each
    level) live on the device; ``host_sizes`` is the same list on the host."""

    data: wp.array
    sizes: wp.array
    offsets: wp.array
    host_sizes: tuple
    images: int
    channels: int


def mip_sizes(width: int, height: int, max_mip_level: int | None) -> list[tuple[int, int]]:
    """Sizes (w, h) of levels 0..L: halve until 1x1 (or ``max_mip_level``); a side longer
    than 1 must be even to be halved, as in nvdiffrast."""
    sizes = [(width, height)]
    w, h = width, height
    while (w > 1 or h > 1) and (max_mip_level is None or len(sizes) <= max_mip_level):
        if (w > 1 and w % 2) or (h > 1 and h % 2):
            raise ValueError(
                f"texture: mip level {len(sizes)} cannot halve a {w}x{h} level (odd side); use a texture whose "
                f"sides are a power of two times the last level's, or limit max_mip_level (got {max_mip_level})")
        w, h = max(w // 2, 1), max(h // 2, 1)
        sizes.append((w, h))
    return sizes


def resolve_filter_mode(filter_mode: str, has_uv_da: bool, has_bias: bool) -> str:
    """The filter mode 'auto' stands for ('linear-mipmap-linear' with uv_da or a bias, else
    'linear'); other names are checked."""
    if filter_mode == "auto":
        return "linear-mipmap-linear" if (has_uv_da or has_bias) else "linear"
    if filter_mode not in FILTER_MODES:
        raise ValueError(f"filter_mode: expected 'auto' or one of {tuple(FILTER_MODES)}, got {filter_mode!r}")
    return filter_mode


def _check_tex(tex) -> wp.array:
    tex = float_array(tex, "tex", (4,))
    if min(tex.shape) < 1:
        raise ValueError(f"tex: expected [B, H, W, C] with every size >= 1, got {tuple(tex.shape)}")
    return tex


def build_mip(tex: wp.array, max_mip_level: int | None = None) -> MipStack:
    """The mip stack of ``tex`` ([B, H, W, C] float32), levels by 2x2 box filtering.

    ``max_mip_level`` limits the number of levels after level 0 (None: down to 1x1)."""
    tex = _check_tex(tex)
    if max_mip_level is not None and int(max_mip_level) < 0:
        raise ValueError(f"max_mip_level: expected None or >= 0, got {max_mip_level}")
    b, h, w, c = tex.shape
    sizes = mip_sizes(w, h, None if max_mip_level is None else int(max_mip_level))
    counts = [b * sw * sh for sw, sh in sizes]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    device = tex.device
    data = wp.zeros((int(sum(counts)), c), dtype=wp.float32, device=device)
    wp.launch(add_into, dim=counts[0] * c, inputs=[tex.flatten()], outputs=[data[: counts[0]].flatten()],
              device=device, record_tape=False)
    for level in range(1, len(sizes)):
        (sw, sh), (dw, dh) = sizes[level - 1], sizes[level]
        wp.launch(mip_build, dim=(b, dh, dw), device=device, record_tape=False,
                  inputs=[data, int(offsets[level - 1]), sw, sh, int(offsets[level]), dw, dh])
    return MipStack(data, device_constant(sizes, wp.vec2i, device), device_constant(offsets, wp.int32, device),
                    tuple(sizes), b, c)


def _setup(tex, uv, uv_da, mip_level_bias, mip, filter_mode, boundary_mode, max_mip_level):
    tex = _check_tex(tex)
    device = tex.device
    uv = float_array(uv, "uv", (4,), 2, device)
    b, h, w, _ = uv.shape
    if tex.shape[0] not in (1, b):
        raise ValueError(f"tex: expected a minibatch of 1 or {b} (that of uv), got {tex.shape[0]}")
    if uv_da is not None:
        uv_da = check_shape(float_array(uv_da, "uv_da", (4,), 4, device), "uv_da", (b, h, w, 4))
    if mip_level_bias is not None:
        mip_level_bias = check_shape(float_array(mip_level_bias, "mip_level_bias", (3,), device=device),
                                     "mip_level_bias", (b, h, w))
    filter_mode = resolve_filter_mode(filter_mode, uv_da is not None, mip_level_bias is not None)
    if boundary_mode not in BOUNDARY_MODES:
        raise ValueError(f"boundary_mode: expected one of {tuple(BOUNDARY_MODES)}, got {boundary_mode!r}"
                         + (" (cube maps are not supported yet)" if boundary_mode == "cube" else ""))
    if "mipmap" in filter_mode:
        if uv_da is None and mip_level_bias is None:
            raise ValueError(f"filter_mode {filter_mode!r} needs uv_da or mip_level_bias")
        if max_mip_level == 0:
            filter_mode = "linear"
    if "mipmap" in filter_mode:
        if mip is None:
            mip = build_mip(tex, max_mip_level)
        elif not isinstance(mip, MipStack):
            raise TypeError(f"mip: expected a MipStack from build_mip(), got {type(mip).__name__}")
        elif mip.host_sizes[0] != (tex.shape[2], tex.shape[1]) or mip.images != tex.shape[0]:
            raise ValueError(f"mip: built for {mip.images} images of {mip.host_sizes[0]}, tex is {tuple(tex.shape)}")
    else:
        # one level: the texture itself, viewed as the stack
        size = (tex.shape[2], tex.shape[1])
        mip = MipStack(tex.reshape((tex.shape[0] * tex.shape[1] * tex.shape[2], tex.shape[3])),
                       device_constant([size], wp.vec2i, device), device_constant([0], wp.int32, device), (size,),
                       tex.shape[0], tex.shape[3])
    return tex, uv, uv_da, mip_level_bias, mip, FILTER_MODES[filter_mode], BOUNDARY_MODES[boundary_mode]


def _flat(a, dtype, device):
    return a.view(dtype).flatten() if a is not None and dtype is not float else (
        a.flatten() if a is not None else wp.empty(0, dtype=dtype, device=device))


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
) -> wp.array:
    """Samples a 2D texture with nvdiffrast 0.4 semantics (see texture_kernels for the
    conventions). ``filter_mode`` 'auto' is 'linear-mipmap-linear' when ``uv_da`` or
    ``mip_level_bias`` is given, else 'linear'. Mipmapped modes build the pyramid inside
    (or use ``mip``); sides longer than 1 must stay even down the pyramid, else a
    ValueError suggests ``max_mip_level``. Cube maps are not supported.

    Returns:
        [B, H, W, C] float32. Recorded on an active ``wp.Tape``: gradients into ``tex``
        (every mip level folded back into level 0), ``uv``, ``uv_da`` and ``mip_level_bias``.
    """
    args = _setup(tex, uv, uv_da, mip_level_bias, mip, filter_mode, boundary_mode, max_mip_level)
    tex_c, uv_c, da_c, bias_c, stack, fmode, bmode = args
    mode, _ = reduce_settings(reduce, threshold, tex_c.device)
    device = tex_c.device
    b, h, w, _ = uv_c.shape
    out = wp.empty((b, h, w, tex_c.shape[3]), dtype=wp.float32, device=device)
    n = b * h * w
    if n:
        wp.launch(make_tex_fwd(fmode), dim=n, device=device, record_tape=False,
                  inputs=[stack.data, stack.sizes, stack.offsets, _flat(uv_c, wp.vec2, device),
                          _flat(da_c, wp.vec4, device), _flat(bias_c, float, device), h * w, tex_c.shape[0], bmode],
                  outputs=[out.reshape((n, tex_c.shape[3]))])

    def backward():
        texture_backward(tex, uv, out.grad, uv_da, mip_level_bias, stack, filter_mode, boundary_mode, max_mip_level,
                         grad_tex=grad_of(tex), grad_uv=grad_of(uv), grad_uv_da=grad_of(uv_da),
                         grad_mip_level_bias=grad_of(mip_level_bias), reduce=mode, threshold=threshold)

    record([tex, uv, uv_da, mip_level_bias], [out], backward)
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
) -> tuple:
    """Gradients of :func:`texture`: ``(grad_tex, grad_uv, grad_uv_da, grad_mip_level_bias)``
    shaped like the inputs (None for absent ones). Texel gradients of every level are
    summed with the ``reduce`` accumulator, then folded into level 0. As in nvdiffrast,
    nearest filtering gives no uv gradient, and the level of detail's gradient reaches
    ``uv_da``/``mip_level_bias`` only in 'linear-mipmap-linear'."""
    tex_c, uv_c, da_c, bias_c, stack, fmode, bmode = _setup(tex, uv, uv_da, mip_level_bias, mip, filter_mode,
                                                           boundary_mode, max_mip_level)
    device = tex_c.device
    b, h, w, _ = uv_c.shape
    c = tex_c.shape[3]
    grad_tex = grad_or_new(grad_tex, "grad_tex", tex)
    grad_uv = grad_or_new(grad_uv, "grad_uv", uv)
    grad_uv_da = grad_or_new(grad_uv_da, "grad_uv_da", uv_da) if uv_da is not None else None
    grad_bias = grad_or_new(grad_mip_level_bias, "grad_mip_level_bias", mip_level_bias) \
        if mip_level_bias is not None else None
    go = cotangent(grad_out, "grad_out", (b, h, w, c), device)
    n = b * h * w
    if go is None or n == 0:
        return grad_tex, grad_uv, grad_uv_da, grad_bias
    mode, t = reduce_settings(reduce, threshold, device)
    k, _ = chunking(c)
    gstack = wp.zeros(stack.data.shape, dtype=wp.float32, device=device)
    wp.launch(make_tex_bwd(mode, fmode, k), dim=tiled_dim(b, h, w), block_dim=BLOCK, device=device,
              record_tape=False,
              inputs=[stack.data, stack.sizes, stack.offsets, _flat(uv_c, wp.vec2, device),
                      _flat(da_c, wp.vec4, device), _flat(bias_c, float, device), go.reshape((n, c)), w, h,
                      tex_c.shape[0], bmode, t],
              outputs=[vector_view(gstack, k), _flat(grad_uv if fmode != NEAREST else None, wp.vec2, device),
                       _flat(grad_uv_da, wp.vec4, device), _flat(grad_bias, float, device)])
    wp.launch(mip_fold, dim=tex_c.shape[:3], device=device, record_tape=False,
              inputs=[gstack, stack.sizes, stack.offsets], outputs=[grad_tex])
    return grad_tex, grad_uv, grad_uv_da, grad_bias
