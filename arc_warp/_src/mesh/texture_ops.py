"""Launches of texture sampling: mip stack construction, forward, ARC backward, mip fold."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import warp as wp

from arc_warp._src.mesh.common import (
    BLOCK,
    absent,
    check_shape,
    check_workspace,
    chunking,
    device_constant,
    cotangent,
    flat_view,
    float_array,
    grad_of,
    grad_or_new,
    output,
    record,
    reduce_settings,
    scratch,
    tiled_dim,
    vector_view,
    view,
)
from arc_warp._src.mesh.plan import Plan, prepared
from arc_warp._src.mesh.texture_kernels import (
    BOUNDARY_MODES,
    FILTER_MODES,
    NEAREST,
    make_mip_fold,
    make_tex_bwd,
    make_tex_fwd,
    mip_build,
    mip_build2,
)
from arc_warp._src.mesh.util_kernels import copy_into


@dataclasses.dataclass(frozen=True)
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


@functools.lru_cache(maxsize=64)
def _mip_layout(tex_shape: tuple, max_mip_level) -> tuple[list, np.ndarray, int]:
    """(sizes, offsets, texels) of the stack of a [B, H, W, C] texture: level sizes (w, h),
    the int32 first row of each level, and the rows of all levels together (cached:
    callers must not modify them)."""
    if max_mip_level is not None and int(max_mip_level) < 0:
        raise ValueError(f"max_mip_level: expected None or >= 0, got {max_mip_level}")
    b, h, w, _ = tex_shape
    sizes = mip_sizes(w, h, None if max_mip_level is None else int(max_mip_level))
    counts = [b * sw * sh for sw, sh in sizes]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    return sizes, offsets, int(sum(counts))


@functools.lru_cache(maxsize=64)
def _mip_tables(tex_shape: tuple, max_mip_level, device: str) -> tuple[wp.array, wp.array]:
    """(sizes, offsets) of :func:`_mip_layout` as device constants (made once per layout)."""
    sizes, offsets, _ = _mip_layout(tex_shape, max_mip_level)
    return device_constant(sizes, wp.vec2i, device), device_constant(offsets, wp.int32, device)


def mip_shape(tex_shape, max_mip_level: int | None = None) -> tuple[int, int]:
    """(texels, C): the shape of the float32 array :func:`build_mip` fills for a texture of
    ``tex_shape`` [B, H, W, C] (for callers that allocate it, ``build_mip(out=...)``)."""
    if len(tex_shape) != 4 or min(tex_shape) < 1:
        raise ValueError(f"tex: expected [B, H, W, C] with every size >= 1, got {tuple(tex_shape)}")
    return _mip_layout(tuple(int(s) for s in tex_shape), max_mip_level)[2], int(tex_shape[3])


def build_mip(tex: wp.array, max_mip_level: int | None = None, out: wp.array | None = None,
              workspace=None) -> MipStack:
    """The mip stack of ``tex`` ([B, H, W, C] float32), levels by 2x2 box filtering.

    ``max_mip_level`` limits the number of levels after level 0 (None: down to 1x1).
    ``out`` (float32 of :func:`mip_shape`) receives the stack instead of a new array;
    ``workspace`` (an ``arc_warp.Workspace``) keeps the prepared launches across calls."""
    plan, reused = prepared(workspace, "build_mip", (tex,), (out,), (max_mip_level,),
                            lambda plan: _plan_mip(plan, tex, max_mip_level, out))
    plan.run()
    return dataclasses.replace(plan.result, data=out) if reused else plan.result


def _plan_mip(plan: Plan, tex, max_mip_level, out) -> None:
    """Checks a build_mip call and queues its work; ``plan.result`` = the MipStack (a new
    ``data`` array when ``out`` is None, which makes the plan single-use)."""
    tex = _check_tex(tex)
    sizes, offsets, texels = _mip_layout(tuple(tex.shape), max_mip_level)
    b, _, _, c = tex.shape
    device = tex.device
    ws = check_workspace(plan.workspace, device)
    if out is None:
        plan.reusable = False
    # every row is written below (level 0 copied, the others built), so no zero fill
    data = output(out, "out", (texels, c), device)
    n = tex.size
    plan.launch(copy_into, n, [view(ws, tex, wp.float32, (n,)), view(ws, data, wp.float32, (n,))], device)
    # two levels per launch, the last one alone if their count is odd
    for level in range(1, len(sizes), 2):
        src = [data, int(offsets[level - 1]), *sizes[level - 1]]
        if level + 1 < len(sizes):
            dw, dh = sizes[level + 1]
            mid = [int(offsets[level]), *sizes[level]]
            plan.launch(mip_build2, (b, dh, dw), [*src, *mid, int(offsets[level + 1]), dw, dh], device)
        else:
            dw, dh = sizes[level]
            plan.launch(mip_build, (b, dh, dw), [*src, int(offsets[level]), dw, dh], device)
    plan.result = MipStack(data, *_mip_tables(tuple(tex.shape), max_mip_level, device.alias), tuple(sizes), b, c)


def _mip_parts(mip) -> tuple[tuple, object]:
    """(arrays, option) standing for a ``mip=`` argument in a plan's signature."""
    if isinstance(mip, MipStack):
        return (mip.data, mip.sizes, mip.offsets), (mip.host_sizes, mip.images, mip.channels)
    return (), mip


def _setup(plan: Plan, tex, uv, uv_da, mip_level_bias, mip, filter_mode, boundary_mode, max_mip_level):
    tex = _check_tex(tex)
    device = tex.device
    ws = check_workspace(plan.workspace, device)
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
            _plan_mip(plan, tex, max_mip_level, None)
            mip = plan.result
        elif not isinstance(mip, MipStack):
            raise TypeError(f"mip: expected a MipStack from build_mip(), got {type(mip).__name__}")
        elif mip.host_sizes[0] != (tex.shape[2], tex.shape[1]) or mip.images != tex.shape[0]:
            raise ValueError(f"mip: built for {mip.images} images of {mip.host_sizes[0]}, tex is {tuple(tex.shape)}")
    else:
        # one level: the texture itself, viewed as the stack
        size = (tex.shape[2], tex.shape[1])
        mip = MipStack(view(ws, tex, wp.float32, (tex.shape[0] * tex.shape[1] * tex.shape[2], tex.shape[3])),
                       device_constant([size], wp.vec2i, device), device_constant([0], wp.int32, device), (size,),
                       tex.shape[0], tex.shape[3])
    return tex, uv, uv_da, mip_level_bias, mip, FILTER_MODES[filter_mode], BOUNDARY_MODES[boundary_mode], ws


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
    workspace=None,  # arc_warp.Workspace: scratch buffers and launches kept across calls
    out: wp.array | None = None,  # [B, H, W, C] float32 to write instead of a new array
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
    mip_arrays, mip_option = _mip_parts(mip)
    plan, reused = prepared(workspace, "texture", (tex, uv, uv_da, mip_level_bias, *mip_arrays), (out,),
                            (mip_option, filter_mode, boundary_mode, max_mip_level, reduce, threshold),
                            lambda plan: _plan_forward(plan, tex, uv, uv_da, mip_level_bias, mip, filter_mode,
                                                       boundary_mode, max_mip_level, reduce, threshold, out))
    plan.run()
    # a reused plan's stack is the given mip, or, without mipmaps, one the backward does not read
    out, stack = (out, mip) if reused else plan.result
    mode, ws = plan.mode, workspace  # as checked by the build

    def backward():
        texture_backward(tex, uv, out.grad, uv_da, mip_level_bias, stack, filter_mode, boundary_mode, max_mip_level,
                         grad_tex=grad_of(tex), grad_uv=grad_of(uv), grad_uv_da=grad_of(uv_da),
                         grad_mip_level_bias=grad_of(mip_level_bias), reduce=mode, threshold=threshold, workspace=ws,
                         tex_grad=tex.requires_grad)

    record([tex, uv, uv_da, mip_level_bias], [out], backward)
    return out


def _plan_forward(plan: Plan, tex, uv, uv_da, mip_level_bias, mip, filter_mode, boundary_mode, max_mip_level, reduce,
                  threshold, out) -> None:
    """Checks a texture call and queues its work; ``plan.result`` = (out, mip stack)."""
    tex_c, uv_c, da_c, bias_c, stack, fmode, bmode, ws = _setup(plan, tex, uv, uv_da, mip_level_bias, mip,
                                                               filter_mode, boundary_mode, max_mip_level)
    plan.mode, _ = reduce_settings(reduce, threshold, tex_c.device, ws)
    device = tex_c.device
    b, h, w, _ = uv_c.shape
    out = output(out, "out", (b, h, w, tex_c.shape[3]), device)
    n = b * h * w
    k, chunks = chunking(tex_c.shape[3])
    if n:
        plan.launch(make_tex_fwd(fmode, k, chunks), n,
                    [vector_view(ws, stack.data, k), stack.sizes, stack.offsets, flat_view(ws, uv_c, wp.vec2, device),
                     flat_view(ws, da_c, wp.vec4, device), flat_view(ws, bias_c, float, device), h * w,
                     tex_c.shape[0], bmode, vector_view(ws, out, k)], device)
    plan.result = out, stack


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
    mip_arrays, mip_option = _mip_parts(mip)
    plan, reused = prepared(
        workspace, "texture_backward", (tex, uv, grad_out, uv_da, mip_level_bias, *mip_arrays),
        (grad_uv, *((grad_tex,) if tex_grad else ()), *((grad_uv_da,) if uv_da is not None else ()),
         *((grad_mip_level_bias,) if mip_level_bias is not None else ())),
        (mip_option, filter_mode, boundary_mode, max_mip_level, reduce, threshold, tex_grad),
        lambda plan: _plan_backward(plan, tex, uv, grad_out, uv_da, mip_level_bias, mip, filter_mode, boundary_mode,
                                    max_mip_level, grad_tex, grad_uv, grad_uv_da, grad_mip_level_bias, reduce,
                                    threshold, tex_grad))
    plan.run()
    if reused:
        return (grad_tex if tex_grad else None, grad_uv, grad_uv_da if uv_da is not None else None,
                grad_mip_level_bias if mip_level_bias is not None else None)
    return plan.result


def _plan_backward(plan: Plan, tex, uv, grad_out, uv_da, mip_level_bias, mip, filter_mode, boundary_mode,
                   max_mip_level, grad_tex, grad_uv, grad_uv_da, grad_mip_level_bias, reduce, threshold,
                   tex_grad) -> None:
    """Checks a texture_backward call and queues its work; ``plan.result`` = the gradients."""
    tex_c, uv_c, da_c, bias_c, stack, fmode, bmode, ws = _setup(plan, tex, uv, uv_da, mip_level_bias, mip,
                                                               filter_mode, boundary_mode, max_mip_level)
    device = tex_c.device
    b, h, w, _ = uv_c.shape
    c = tex_c.shape[3]
    grad_tex = grad_or_new(grad_tex, "grad_tex", tex) if tex_grad else None
    grad_uv = grad_or_new(grad_uv, "grad_uv", uv)
    grad_uv_da = grad_or_new(grad_uv_da, "grad_uv_da", uv_da) if uv_da is not None else None
    grad_bias = grad_or_new(grad_mip_level_bias, "grad_mip_level_bias", mip_level_bias) \
        if mip_level_bias is not None else None
    plan.result = grad_tex, grad_uv, grad_uv_da, grad_bias
    go = cotangent(grad_out, "grad_out", (b, h, w, c), device)
    n = b * h * w
    if go is None or n == 0:
        return
    mode, t = reduce_settings(reduce, threshold, device, ws)
    k, chunks = chunking(c)
    vec_k = wp.types.vector(k, wp.float32)
    gstack = None
    if tex_grad:
        gstack = scratch(ws, "mesh_tex_gstack", stack.data.shape, wp.float32, device)
        plan.step(gstack.zero_)  # texel gradients of every level are summed into it
    plan.launch(make_tex_bwd(mode, fmode, k, chunks), tiled_dim(b, h, w),
                [vector_view(ws, stack.data, k), stack.sizes, stack.offsets, flat_view(ws, uv_c, wp.vec2, device),
                 flat_view(ws, da_c, wp.vec4, device), flat_view(ws, bias_c, float, device), vector_view(ws, go, k),
                 w, h, tex_c.shape[0], bmode, t, vector_view(ws, gstack, k) if tex_grad else absent(ws, vec_k, device),
                 flat_view(ws, grad_uv if fmode != NEAREST else None, wp.vec2, device),
                 flat_view(ws, grad_uv_da, wp.vec4, device), flat_view(ws, grad_bias, float, device)], device,
                block_dim=BLOCK)
    if tex_grad:
        plan.launch(make_mip_fold(k, chunks), tuple(tex_c.shape[:3]),
                    [vector_view(ws, gstack, k), stack.sizes, stack.offsets, vector_view(ws, grad_tex, k)], device)
