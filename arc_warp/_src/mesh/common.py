"""What the mesh op objects share: the base class (device, accumulation mode, prepared
launches and their bindings, the device check of triangle indices, the workspace
lookup), launch sizes, argument checks and tape recording."""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.calibrate import kernel_mode, resolve_threshold
from arc_warp._src.arc.reduce_funcs import check_mode
from arc_warp._src.launches import Bindings, Launches, View
from arc_warp._src.mesh.util_kernels import first_bad_triangle
from arc_warp._src.splat.render import Workspace
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
    is exactly a flat array of K-vectors (no scratch buffer); (1, 0) for ``n`` = 0."""
    k = max((d for d in range(1, min(n, MAX_CHUNK) + 1) if n % d == 0), default=1)
    return k, n // k


class MeshOp:
    """What every mesh op object holds: its device, the accumulation mode and ARC
    threshold of its backward, its prepared launches and their bindings and, for an op
    that reads triangles, the device check of their indices (``arc_warp.mesh``'s notes:
    when it is read).

    Bindings: each call's device work runs through the object's one
    :class:`~arc_warp._src.launches.Bindings`, keyed by the call's kind and the
    pointers of its arrays (with the shapes and values its launches depend on that the
    object's sizes do not fix): the first call on some memory launches as it is, the
    second records a plan, later ones replay it (no Warp views made, nothing repacked;
    step by step, on every device). A caller may bind its own views of that memory
    there (:meth:`bound`, as the torch drop-in does). Owner: this object. Dropped: the
    least recently used past ``launches.BINDINGS`` entries, and with the object.

    Args: ``reduce``, the backward's accumulation mode (``atomic`` / ``warp`` / ``serial`` /
    ``arc``; ``floor`` for benchmarks); ``threshold``, the ARC threshold (only ``arc``
    reads it; None: the device's keyed one, as the mesh backwards plan per pixel with
    ``keyed_plan``, which may calibrate a GPU once; at 33, which never reduces, ``arc`` is
    compiled as ``atomic``); ``device`` (None: the current one); ``record``: prepare the
    launches for reuse (False for an object used for one call: its calls run as they are).
    """

    def __init__(self, reduce: str | None, threshold: int | None, device, record: bool, name: str | None = None):
        self.device = wp.get_device(device)
        self.mode, self.threshold = reduce, 0
        if reduce is not None:
            check_mode(reduce)
        if reduce == "arc":
            self.threshold = resolve_threshold(self.device, threshold, keyed=True)
            self.mode = kernel_mode(reduce, self.threshold)
        self._launches = Launches(self.device, record)
        self._bindings = Bindings(self._launches)
        self._empty: dict = {}  # dtype -> the empty array an optional argument not given is
        self.name, self._pending = name, None
        if name is not None:  # the first bad triangle, found on the device
            self._first = wp.full(1, NO_BAD_TRIANGLE, dtype=wp.int32, device=self.device)
            # on the CPU, where launches are done when they return, read in place; on CUDA
            # a check left on the device is copied to a pinned buffer (made then), with an event
            self._values = self._first.numpy() if self.device.is_cpu else None
            self._host = self._event = None

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
        return workspace.get((cls, *sizes, *options.values()), lambda: cls(*sizes, **options, device=workspace.device))

    def bound(self, key: tuple, make):
        """What ``make()`` builds of the memory ``key`` names (a caller's Warp views of its
        tensors, say), made once per memory in this object's bindings. The caller keeps
        the memory alive while it uses them."""
        return self._bindings.bound(key, make)

    def _flat(self, a: wp.array | None, dtype):
        """Contiguous ``a``'s memory as a flat array of ``dtype`` (a launch argument), or for
        None an empty array (an optional argument not given)."""
        if a is not None:
            return View(a, dtype, (a.size // getattr(dtype, "_length_", 1),))
        if dtype not in self._empty:
            self._empty[dtype] = wp.empty(0, dtype=dtype, device=self.device)
        return self._empty[dtype]

    def check(self, previous: bool = True) -> None:
        """Reads the triangle check that the last forward left on the device (one with
        ``check`` off): ValueError if a vertex index was out of range (waits for the
        device where the check has not finished)."""
        if self._pending is None:
            return
        (count, of, left), self._pending = self._pending, None
        if self.device.is_cpu:
            first = int(self._values[0])
        elif left:
            if not self.device.is_capturing:  # (a wait would break a graph capture)
                wp.synchronize_event(self._event)
            first = int(self._host.numpy()[0])
        else:  # a checked forward's one wait (numpy() copies on the null stream)
            wp.synchronize_stream(self.device.stream)
            first = int(self._first.numpy()[0])
        if first != NO_BAD_TRIANGLE:
            raise ValueError(
                f"{self.name}: triangle {first} of tri has a vertex index outside [0, {count}) ({of} has {count} "
                "vertices); such triangles are left out (not drawn, interpolated as 0). Fix tri, or pass the "
                "vertices it indexes" + (" (found in the previous call on this object, read now)" if previous else ""))

    def _checked(self, key: tuple, tri: View, count: int, of: str, check: bool | None, body) -> bool:
        """A forward's device work: after reading the check an earlier forward left, the
        check of ``tri`` ((F,) vec3i) against ``count`` vertices (those of the input
        ``of``), then ``body()``, both run through the bindings by ``key`` (with the
        check's own arguments added). Returns whether the forward reads the check before
        returning (``check``; None: on the CPU, where it is free)."""
        self.check()
        check = self.device.is_cpu if check is None else check
        if self.device.is_cpu:
            self._values[0] = NO_BAD_TRIANGLE
        else:
            self._first.fill_(NO_BAD_TRIANGLE)

        def checked():
            self._launches.launch(first_bad_triangle, tri.shape[0], [tri, count, self._first])
            body()

        self._bindings.run((*key, tri.array.ptr, tri.shape[0], count), checked)
        left = not (check or self.device.is_cpu)
        if left:
            if self._event is None:
                self._host, self._event = wp.empty(1, dtype=wp.int32, device="cpu", pinned=True), wp.Event(self.device)
            wp.copy(self._host, self._first)
            if not self.device.is_capturing:
                self.device.stream.record_event(self._event)
        self._pending = count, of, left
        return check


def array(value, name: str, ndims, last: int | None = None, device=None, dtype=wp.float32) -> wp.array:
    """Checks a contiguous wp.array of ``dtype`` with one of ``ndims`` dimensions (and last
    axis ``last`` if given) on ``device``; raises TypeError/ValueError naming what came."""
    return check_array(value, name, dtype, ndims, None, device, last)


def exact(value, name: str, shape: tuple, device) -> wp.array:
    """Checks a contiguous float32 wp.array of ``shape`` on ``device``."""
    return check_array(value, name, wp.float32, len(shape), shape, device)


def given(value, name: str, shape: tuple, device) -> wp.array | None:
    """:func:`exact` for an optional array (a cotangent): None stays None."""
    return None if value is None else exact(value, name, shape, device)


def output(value, name: str, shape: tuple, device, zero: bool = False) -> wp.array:
    """The caller's float32 array ``value`` checked to be ``shape`` on ``device`` (written,
    or added into), or a new one: uninitialised, or with ``zero`` zeroed."""
    if value is None:
        return (wp.zeros if zero else wp.empty)(shape, dtype=wp.float32, device=device)
    return exact(value, name, shape, device)


def triangles(tri, device) -> View:
    """Checks an int32 [F, 3] triangle array on ``device``; returns it as (F,) vec3i."""
    tri = array(tri, "tri", 2, 3, device, wp.int32)
    return View(tri, wp.vec3i, tri.shape[:1])


def positions(pos, device=None) -> tuple[View, int]:
    """(view, instanced) of float32 clip-space positions: [B, V, 4] as (B, V) vec4 (one
    set per image, instanced 1) or [V, 4] as (1, V) (shared by every image, instanced 0)."""
    pos = array(pos, "pos", (2, 3), 4, device)
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


def ptr(a) -> int:
    """The pointer of an optional array (0: none) for a bindings key."""
    return 0 if a is None else a.ptr


def grad_of(a: wp.array | None) -> wp.array | None:
    """``a.grad`` for an input that requires it, else None (its gradient is not wanted)."""
    return a.grad if a is not None and a.requires_grad else None
