"""What the mesh op objects share: the base class (device, accumulation mode, prepared
launches, the workspace lookup), the device check of triangle indices, launch sizes,
argument checks and tape recording."""

from __future__ import annotations

import numpy as np
import warp as wp

from arc_warp._src.arc.calibrate import kernel_mode, resolve_threshold
from arc_warp._src.arc.reduce_funcs import check_mode
from arc_warp._src.launches import Launches, View
from arc_warp._src.mesh.util_kernels import first_bad_triangle
from arc_warp._src.splat.workspace import Workspace
from arc_warp._src.tape import active_tape
from arc_warp._src.validate import check_array

BLOCK = 256
"""Threads per block of every per-pixel kernel: a multiple of 32, so that on the CPU with
``wp.config.enable_cpu_blocks`` the ARC reducers emulate full 32-lane warps."""

MAX_CHUNK = 16
"""Largest vector an accumulator adds at once: wider attributes/texels go in chunks of at
most this many float32 components (fewer registers per lane in the warp reduction)."""

NO_BAD_TRIANGLE = 2**31 - 1


def tiled_dim(batch: int, height: int, width: int) -> int:
    """Threads of a tiled per-pixel launch: one ``BLOCK`` per 16x16 tile of every image
    (see ``funcs.tile_pixel``). Edge tiles include threads past the image, which reach
    the accumulator calls with ``valid=False``, as every lane of a block must."""
    return max(batch, 1) * -(-height // 16) * -(-width // 16) * BLOCK


def chunking(n: int) -> tuple[int, int]:
    """(K, chunks): ``n`` float32 components are accumulated as ``chunks`` vectors of K.

    K is the largest divisor of ``n`` up to :data:`MAX_CHUNK`, so a [..., n] gradient array
    is exactly a flat array of K-vectors (no scratch buffer); (0, 0) for ``n`` = 0."""
    k = max((d for d in range(1, min(n, MAX_CHUNK) + 1) if n % d == 0), default=0)
    return k, n // k if k else 0


def flat(a: wp.array | None, dtype, absent: wp.array | None = None):
    """Contiguous ``a``'s memory as a flat array of ``dtype`` (a launch argument), or
    ``absent`` (an empty array: an optional argument not given) for None."""
    if a is None:
        return absent
    return View(a, dtype, (a.size // getattr(dtype, "_length_", 1),))


def empty(dtype, device) -> wp.array:
    """An empty array: a kernel's argument for an optional array that was not given."""
    return wp.empty(0, dtype=dtype, device=device)


class MeshOp:
    """What every mesh op object holds: its device, the accumulation mode and ARC
    threshold of its backward, and its prepared launches.

    Args:
        reduce: accumulation mode of the backward (``atomic`` / ``warp`` / ``serial`` /
            ``arc``; ``floor`` for benchmarks); None for an op without one.
        threshold: the ARC threshold (only ``arc`` reads it); None: the device's keyed one
            (the mesh backwards plan per pixel with ``keyed_plan``), which may calibrate a
            GPU once. ``arc`` at a T that never reduces (33) is compiled as ``atomic``.
        device: Warp device (None: the current one).
        record: prepare launches for reuse (False for an object used for one call).
    """

    def __init__(self, reduce: str | None, threshold: int | None, device, record: bool):
        self.device = wp.get_device(device)
        self.mode, self.threshold = reduce, 0
        if reduce is not None:
            check_mode(reduce)
        if reduce == "arc":
            self.threshold = resolve_threshold(self.device, threshold, keyed=True)
            self.mode = kernel_mode(reduce, self.threshold)
        self._launches = Launches(self.device, record)
        self._check: TriangleCheck | None = None  # the forward's check of triangle indices, if any

    def check(self) -> None:
        """Reads the triangle check that the last forward left on the device (one run with
        ``check`` off): ValueError if it found an index out of range (waits for the
        device where the check has not finished)."""
        self._check.read(previous=True)

    def _begin(self, check: bool | None) -> bool:
        """Whether a forward reads its check before returning (None: on the CPU, where it
        costs no wait), after reading the one an earlier forward left."""
        self._check.read(previous=True)
        return self.device.is_cpu if check is None else check

    @classmethod
    def of(cls, workspace: Workspace | None, device, *sizes, **options):
        """The object of one call: ``workspace``'s for these sizes and options (made on
        first use; ``threshold`` None is the workspace's keyed one), or without a
        workspace a new one that prepares no launches."""
        if workspace is None:
            return cls(*sizes, **options, device=device, record=False)
        if not isinstance(workspace, Workspace):
            raise TypeError(f"workspace: expected an arc_warp.Workspace or None, got {type(workspace).__name__}")
        if workspace.device != wp.get_device(device):
            raise ValueError(f"workspace: it is on {workspace.device}, the inputs on {device}; "
                             "use one workspace per device")
        if "reduce" in options and options.get("threshold") is None:
            options["threshold"] = workspace.keyed_threshold
        key = (cls, *sizes, *options.values())
        return workspace.mesh_op(key, lambda: cls(*sizes, **options, device=workspace.device))


class TriangleCheck:
    """The device check of a forward's triangle indices (``arc_warp.mesh``'s notes: when
    the check is read). :meth:`queue` launches a kernel that writes the first triangle
    with an index outside [0, count) to a device flag, copied to the host; :meth:`read`
    raises ValueError for it. The kernels themselves skip such triangles."""

    def __init__(self, op: str, device, launches: Launches):
        self.op, self.device, self._launches = op, device, launches
        self._first = wp.full(1, NO_BAD_TRIANGLE, dtype=wp.int32, device=device)
        if device.is_cpu:  # launches run before they return: the flag is read in place
            self._host, self._event = self._first, None
        else:
            self._host = wp.empty(1, dtype=wp.int32, device="cpu", pinned=True)
            self._event = wp.Event(device)
        self._values = self._host.numpy()
        self._pending = None

    def queue(self, tri: View, count: int, of: str) -> None:
        """Checks ``tri`` ((F,) vec3i) against ``count`` vertices (those ``of`` an input)."""
        if self.device.is_cpu:
            self._values[0] = NO_BAD_TRIANGLE
        else:
            self._first.fill_(NO_BAD_TRIANGLE)
        self._launches.launch(first_bad_triangle, tri.shape[0], [tri, count, self._first])
        if self._event is not None:
            wp.copy(self._host, self._first)
            self.device.stream.record_event(self._event)
        self._pending = count, of

    def read(self, previous: bool = False) -> None:
        """Raises ValueError if the last check queued found a bad triangle (waiting for the
        device where it has not copied the flag yet); ``previous``: it was queued by an
        earlier call than the one reading it."""
        if self._pending is None:
            return
        (count, of), self._pending = self._pending, None
        if self._event is not None:
            wp.synchronize_event(self._event)
        first = int(self._values[0])
        if first != NO_BAD_TRIANGLE:
            raise ValueError(
                f"{self.op}: triangle {first} of tri has a vertex index outside [0, {count}) ({of} has {count} "
                "vertices); such triangles are left out (not drawn, interpolated as 0). Fix tri, or pass the "
                "vertices it indexes" + (" (found in the previous call on this object, read now)" if previous else ""))


def float_array(value, name: str, ndims: tuple[int, ...], last: int | None = None, device=None) -> wp.array:
    """Checks a contiguous float32 wp.array with one of ``ndims`` dimensions (and last axis
    ``last`` if given) on ``device``; raises TypeError/ValueError naming what came."""
    return check_array(value, name, wp.float32, ndims, None, device, last)


def int_array(value, name: str, ndims: tuple[int, ...], last: int | None = None, device=None) -> wp.array:
    """As :func:`float_array` for int32 arrays."""
    return check_array(value, name, wp.int32, ndims, None, device, last)


def exact(value, name: str, shape: tuple, device) -> wp.array:
    """Checks a contiguous float32 wp.array of ``shape`` on ``device``."""
    return check_array(value, name, wp.float32, len(shape), shape, device)


def given(value, name: str, shape: tuple, device) -> wp.array | None:
    """:func:`exact` for an optional array (an output, a cotangent): None stays None."""
    return None if value is None else exact(value, name, shape, device)


def output(value, name: str, shape: tuple, device) -> wp.array:
    """The caller's float32 array ``value`` checked to be ``shape`` on ``device``, or a new
    one (uninitialised: every entry is written)."""
    if value is None:
        return wp.empty(shape, dtype=wp.float32, device=device)
    return given(value, name, shape, device)


def grad_or_new(grad, name: str, like: wp.array) -> wp.array:
    """``grad`` (checked to match ``like``) to add into, or a new zero array."""
    if grad is None:
        return wp.zeros(like.shape, dtype=wp.float32, device=like.device)
    return given(grad, name, like.shape, like.device)


def triangles(tri, device) -> wp.array:
    """Checks an int32 [F, 3] triangle array on ``device``."""
    return int_array(tri, "tri", (2,), 3, device)


def positions(pos, device=None) -> tuple[View, int]:
    """(view, instanced) of float32 clip-space positions: [B, V, 4] as (B, V) vec4 (one
    set per image, instanced 1) or [V, 4] as (1, V) (shared by every image, instanced 0)."""
    pos = float_array(pos, "pos", (2, 3), 4, device)
    return View(pos, wp.vec4, pos.shape[:2] if pos.ndim == 3 else (1, pos.shape[0])), int(pos.ndim == 3)


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
