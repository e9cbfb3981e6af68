"""Shared host-side helpers of the mesh ops: validation, reduce settings, launch sizes, tape
recording, and the workspace side of a call (scratch buffers, cached views; each helper
does the plain Warp thing when the call has no workspace). Launches go through a
:class:`arc_warp._src.mesh.plan.Plan`."""

from __future__ import annotations

import functools

import numpy as np
import warp as wp

from arc_warp._src.arc.calibrate import kernel_mode, resolve_threshold
from arc_warp._src.arc.reduce_funcs import check_mode
from arc_warp._src.splat.workspace import Workspace
from arc_warp._src.tape import active_tape
from arc_warp._src.validate import check_array

BLOCK = 256
"""Threads per block of every per-pixel kernel: a multiple of 32, so that on the CPU with
``wp.config.enable_cpu_blocks`` the ARC reducers emulate full 32-lane warps."""

MAX_CHUNK = 16
"""Largest vector an accumulator adds at once: wider attributes/texels go in chunks of at
most this many float32 components (fewer registers per lane in the warp reduction)."""


def tiled_dim(batch: int, height: int, width: int) -> int:
    """Threads of a tiled per-pixel launch: one ``BLOCK`` per 16x16 tile of every image
    (see ``funcs.tile_pixel``). Edge tiles include threads past the image, which reach
    the accumulator calls with ``valid=False``, as every lane of a block must."""
    return max(batch, 1) * -(-height // 16) * -(-width // 16) * BLOCK


def reduce_settings(reduce: str, threshold: int | None, device, workspace=None) -> tuple[str, int]:
    """(kernel mode, threshold) of a ``reduce=`` keyword; only ``arc`` reads T, the keyed
    one (the mesh backwards plan per pixel with ``keyed_plan``): ``threshold`` if given,
    else the workspace's (resolved when it was made), else the device's (which may
    calibrate). ``arc`` at a T that never reduces (33, as calibrated on GPUs where
    float4 atomics beat the warp reduction) is compiled as ``atomic``."""
    check_mode(reduce)
    if reduce != "arc":
        return reduce, 0
    if threshold is None and workspace is not None:
        t = workspace.keyed_threshold
    else:
        t = resolve_threshold(device, threshold, keyed=True)
    return kernel_mode(reduce, t), t


def chunking(n: int) -> tuple[int, int]:
    """(K, chunks): ``n`` float32 components are accumulated as ``chunks`` vectors of K.

    K is the largest divisor of ``n`` up to :data:`MAX_CHUNK`, so a [..., n] gradient array
    is exactly a flat array of K-vectors (no scratch buffer)."""
    k = max(d for d in range(1, min(n, MAX_CHUNK) + 1) if n % d == 0)
    return k, n // k


def view(workspace, a: wp.array, dtype, shape) -> wp.array:
    """Contiguous ``a``'s memory as a ``shape`` array of ``dtype`` (a kernel's argument
    type), non-owning (``a`` stays alive through the call): the workspace's cached view
    (``Workspace.view``), or a new one without it."""
    if workspace is not None:
        return workspace.view(a.ptr, dtype, tuple(shape))
    return wp.array(ptr=a.ptr, dtype=dtype, shape=tuple(shape), device=a.device)


def vec4_view(workspace, a: wp.array, flat: bool = False) -> wp.array:
    """A float32 [..., 4] array as vec4s: [...] or, with ``flat``, (size / 4,)."""
    return view(workspace, a, wp.vec4, (a.size // 4,) if flat else a.shape[:-1])


def vector_view(workspace, arr: wp.array, k: int) -> wp.array:
    """Flat view of a contiguous float32 array as ``size / k`` K-vectors (an accumulator target)."""
    return view(workspace, arr, wp.types.vector(k, wp.float32), (arr.size // k,))


def flat_view(workspace, a: wp.array | None, dtype, device) -> wp.array:
    """Contiguous float32 ``a`` as a flat array of ``dtype`` (float, vec2, vec4), or an
    empty one for None (an optional kernel argument that was not given)."""
    if a is None:
        return absent(workspace, wp.float32 if dtype is float else dtype, device)
    if dtype is float:
        return view(workspace, a, wp.float32, (a.size,))
    return view(workspace, a, dtype, (a.size // dtype._length_,))


def float_array(value, name: str, ndims: tuple[int, ...], last: int | None = None, device=None) -> wp.array:
    """Checks a contiguous float32 wp.array with one of ``ndims`` dimensions (and last axis
    ``last`` if given) on ``device``; raises TypeError/ValueError naming what came."""
    return check_array(value, name, wp.float32, ndims, None, device, last)


def int_array(value, name: str, ndims: tuple[int, ...], last: int | None = None, device=None) -> wp.array:
    """As :func:`float_array` for int32 arrays."""
    return check_array(value, name, wp.int32, ndims, None, device, last)


def check_shape(value: wp.array, name: str, shape: tuple) -> wp.array:
    """Raises ValueError unless ``value.shape == shape``."""
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(value.shape)}")
    return value


def cotangent(value, name: str, shape: tuple, device) -> wp.array | None:
    """A float32 cotangent of ``shape`` on ``device``, or None (zero)."""
    if value is None:
        return None
    return check_shape(float_array(value, name, (len(shape),), device=device), name, shape)


def grad_or_new(grad, name: str, like: wp.array) -> wp.array:
    """``grad`` (checked to match ``like``) to add into, or a new zero array."""
    if grad is None:
        return wp.zeros(like.shape, dtype=wp.float32, device=like.device)
    return check_shape(float_array(grad, name, (like.ndim,), device=like.device), name, like.shape)


def check_workspace(workspace, device) -> Workspace | None:
    """``workspace`` (None or a :class:`Workspace` on ``device``); raises naming the fix."""
    if workspace is None:
        return None
    if not isinstance(workspace, Workspace):
        raise TypeError(f"workspace: expected an arc_warp.Workspace or None, got {type(workspace).__name__}")
    if workspace.device is not device and workspace.device != wp.get_device(device):
        raise ValueError(f"workspace: it is on {workspace.device}, the inputs on {device}; "
                         "use one workspace per device")
    return workspace


def scratch(workspace: Workspace | None, name: str, shape, dtype, device) -> wp.array:
    """A buffer used only within one call: the workspace's shared buffer ``name`` (kept
    across calls, so calls of one size allocate nothing), or a new array without one."""
    if workspace is None:
        return wp.empty(shape, dtype=dtype, device=device)
    return workspace.shared.array(name, shape, dtype)


def zeros_once(workspace: Workspace | None, name: str, shape, dtype, device) -> wp.array:
    """A read-only zero buffer (a cotangent that was not given): zeroed once per workspace."""
    if workspace is None:
        return wp.zeros(shape, dtype=dtype, device=device)
    return workspace.shared.zeros_once(name, shape, dtype)


@functools.lru_cache(maxsize=64)
def _absent_name(dtype, ndim: int) -> str:
    return f"mesh_absent_{wp.types.type_repr(dtype)}_{ndim}d"


def absent(workspace: Workspace | None, dtype, device, ndim: int = 1) -> wp.array:
    """An empty ``ndim``-D array of ``dtype``: the argument a kernel gets for an optional
    array that was not given (made once per workspace)."""
    if workspace is None:
        return wp.empty((0,) * ndim, dtype=dtype, device=device)
    return workspace.shared.zeros_once(_absent_name(dtype, ndim), (0,) * ndim, dtype)


def output(value, name: str, shape: tuple, device) -> wp.array:
    """The caller's float32 output array ``value`` checked to be ``shape`` on ``device``, or a new one."""
    if value is None:
        return wp.empty(shape, dtype=wp.float32, device=device)
    return check_shape(float_array(value, name, (len(shape),), device=device), name, shape)


def record(inputs: list, outputs: list, backward) -> None:
    """Records ``backward`` on the active tape if any differentiable input needs a gradient.

    Outputs get ``requires_grad`` (and zeroed ``.grad`` buffers) so that downstream
    kernels write their cotangents there; ``backward()`` then reads them."""
    tape = active_tape()
    if tape is None or not any(a is not None and a.requires_grad for a in inputs):
        return
    for out in outputs:
        out.requires_grad = True
    tape.record_func(backward, [a for a in (*outputs, *inputs) if a is not None and a.requires_grad])


def grad_of(a: wp.array | None) -> wp.array | None:
    """``a.grad`` for an input that requires it, else None (its gradient is not wanted)."""
    return a.grad if a is not None and a.requires_grad else None


def host_int32(value, name: str, shape_last: int) -> np.ndarray:
    """A small host-side int32 table ([N, shape_last]) from a wp.array or array-like."""
    arr = value.numpy() if isinstance(value, wp.array) else np.asarray(value)
    if arr.ndim != 2 or arr.shape[1] != shape_last or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expected an integer array [N, {shape_last}], got {arr.dtype} {arr.shape}")
    return arr.astype(np.int32)


@functools.lru_cache(maxsize=256)
def _constant(data: bytes, shape: tuple, dtype, device: str) -> wp.array:
    return wp.array(np.frombuffer(data, np.int32).reshape(shape), dtype=dtype, device=device)


def device_constant(values, dtype, device) -> wp.array:
    """A small read-only int32 table (e.g. mip sizes) on ``device``, made once per content:
    a host-to-device copy on every call would stall the launch queue on CUDA. Callers must
    not write to it."""
    table = np.ascontiguousarray(values, dtype=np.int32)
    return _constant(table.tobytes(), table.shape, dtype, wp.get_device(device).alias)
