"""What the mesh op objects share: the base class :class:`MeshOp`, launch sizes, argument
checks and tape recording."""

from __future__ import annotations

import warp as wp

from arc_warp._src.arc.calibrate import kernel_mode, resolve_threshold
from arc_warp._src.arc.reduce_funcs import check_mode
from arc_warp._src.launches import Bindings, Launches, View
from arc_warp._src.mesh.util_kernels import first_bad_triangle, publish_first
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
    """(K, chunks): ``n`` float32 components are accumulated as ``chunks`` vectors of K, the
    largest divisor of ``n`` up to :data:`MAX_CHUNK`, so a [..., n] gradient array is
    exactly a flat array of K-vectors (no scratch buffer); (1, 0) for ``n`` = 0."""
    k = max((d for d in range(1, min(n, MAX_CHUNK) + 1) if n % d == 0), default=1)
    return k, n // k


class MeshOp:
    """What every mesh op object holds: its device, the accumulation mode and ARC
    threshold of its backward, its prepared launches and, for an op that reads triangles,
    the device check of their indices (``arc_warp.mesh``'s notes: when it is read).

    Each call's device work runs through the object's one
    :class:`~arc_warp._src.launches.Bindings`, keyed by the call's kind and the pointers of
    its arrays (with the shapes and values its launches depend on that the object's sizes
    do not fix): the second call on some memory records a plan, later ones replay it. A
    caller may bind its own views of that memory there (:meth:`bound`, as the torch
    drop-in does).

    Args: ``reduce``, the backward's accumulation mode (``atomic`` / ``warp`` / ``serial`` /
    ``arc``; ``floor`` for benchmarks); ``threshold``, the ARC threshold (only ``arc``
    reads it; None: the device's keyed one, as the mesh backwards plan per pixel with
    ``keyed_plan``; at 33, which never reduces, ``arc`` is compiled as ``atomic``);
    ``device`` (None: the current one); ``record``: prepare the launches for reuse (False
    for an object used for one call).
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
        self._empty: dict = {}  # dtype: the empty array of an optional argument not given; shape: zeros
        self.name, self._pending = name, None
        if name is not None:  # the first bad triangle, found on the device, published to host memory
            self._first = wp.full(1, NO_BAD_TRIANGLE, dtype=wp.int32, device=self.device)
            # on CUDA pinned, which a kernel writes through unified addressing (the same pointer)
            seen = wp.full(1, NO_BAD_TRIANGLE, dtype=wp.int32, device="cpu", pinned=self.device.is_cuda)
            self._seen = seen if self.device.is_cpu else wp.array(ptr=seen.ptr, dtype=wp.int32, shape=(1,),
                                                                   device=self.device)
            self._values, self._seen_host = seen.numpy(), seen  # read in place; the view above does not hold it
            self._event = None if self.device.is_cpu else wp.Event(self.device)

    @classmethod
    def of(cls, workspace: Workspace | None, device, *sizes, **options):
        """The object of one call: ``workspace``'s for these sizes and options (made on first
        use; ``threshold`` None: the workspace's keyed one), or a new one preparing nothing."""
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
        """What ``make()`` builds of the memory ``key`` names (Warp views, say), made once per
        memory in this object's bindings. The caller keeps the memory alive while it uses them."""
        return self._bindings.bound(key, make)

    def _flat(self, a: wp.array | None, dtype):
        """Contiguous ``a``'s memory as a flat array of ``dtype`` (a launch argument), or for
        None an empty array (an optional argument not given)."""
        if a is not None:
            return View(a, dtype, (a.size // getattr(dtype, "_length_", 1),))
        if dtype not in self._empty:
            self._empty[dtype] = wp.empty(0, dtype=dtype, device=self.device)
        return self._empty[dtype]

    def _zeros(self, shape: tuple) -> wp.array:
        """A float32 array of zeros (a cotangent not given), made once per shape."""
        if shape not in self._empty:
            self._empty[shape] = wp.zeros(shape, dtype=wp.float32, device=self.device)
        return self._empty[shape]

    def check(self, previous: bool = True) -> None:
        """Reads the triangle check the last forward left on the device: ValueError if a
        vertex index was out of range (waits for the device where it has not finished)."""
        if self._pending is None:
            return
        (count, of, left), self._pending = self._pending, None
        if left:
            if not self.device.is_capturing:  # (a wait would break a graph capture)
                wp.synchronize_event(self._event)
        elif self.device.is_cuda:  # a checked forward's one wait
            wp.synchronize_stream(self.device.stream)
        first = int(self._values[0])
        if first != NO_BAD_TRIANGLE:
            raise ValueError(
                f"{self.name}: triangle {first} of tri has a vertex index outside [0, {count}) ({of} has {count} "
                "vertices); such triangles are left out (not drawn, interpolated as 0). Fix tri, or pass the "
                "vertices it indexes" + (" (found in the previous call on this object, read now)" if previous else ""))

    def _checked(self, key: tuple, tri: View, count: int, of: str, check: bool | None, body) -> bool:
        """A forward's device work, through the bindings by ``key``: after reading the check
        an earlier forward left, the check of ``tri`` ((F,) vec3i) against the ``count``
        vertices of the input ``of``, then ``body()``. Returns whether the forward reads the
        check before returning (``check``; None: on the CPU, where it is free)."""
        self.check()
        check = self.device.is_cpu if check is None else check

        def checked():
            self._launches.launch(first_bad_triangle, tri.shape[0], [tri, count, self._first])
            self._launches.launch(publish_first, 1, [self._first, self._seen, NO_BAD_TRIANGLE])
            body()

        self._bindings.run((*key, tri.array.ptr, tri.shape[0], count), checked)
        left = not (check or self.device.is_cpu)
        if left and not self.device.is_capturing:
            self.device.stream.record_event(self._event)
        self._pending = count, of, left
        return check


def array(value, name: str, ndims, last: int | None = None, device=None, dtype=wp.float32) -> wp.array:
    """:func:`check_array` of a contiguous ``dtype`` array of ``ndims`` dimensions (last axis ``last``)."""
    return check_array(value, name, dtype, ndims, None, device, last)


def exact(value, name: str, shape: tuple, device) -> wp.array:
    """Checks a contiguous float32 wp.array of ``shape`` on ``device``."""
    return check_array(value, name, wp.float32, len(shape), shape, device)


def given(value, name: str, shape: tuple, device) -> wp.array | None:
    """:func:`exact` for an optional array (a cotangent): None stays None."""
    return None if value is None else exact(value, name, shape, device)


def output(value, name: str, shape: tuple, device, zero: bool = False) -> wp.array:
    """The caller's float32 array ``value`` checked by :func:`exact`, or a new one (zeroed
    with ``zero``)."""
    if value is None:
        return (wp.zeros if zero else wp.empty)(shape, dtype=wp.float32, device=device)
    return exact(value, name, shape, device)


def triangles(tri, device) -> View:
    """Checks an int32 [F, 3] triangle array on ``device``; returns it as (F,) vec3i."""
    tri = array(tri, "tri", 2, 3, device, wp.int32)
    return View(tri, wp.vec3i, tri.shape[:1])


def positions(pos, device=None) -> tuple[View, int]:
    """(view, instanced) of float32 clip-space positions: [B, V, 4] as (B, V) vec4 (instanced
    1) or [V, 4] as (1, V) (shared by every image, instanced 0)."""
    pos = array(pos, "pos", (2, 3), 4, device)
    return View(pos, wp.vec4, pos.shape[:2] if pos.ndim == 3 else (1, pos.shape[0])), int(pos.ndim == 3)


def record(inputs: list, outputs: list, backward) -> None:
    """Records ``backward`` on the active tape if an input requires grad; the outputs then
    require grad too, so downstream kernels write their cotangents into their ``.grad``."""
    tape = active_tape()
    if tape is None or not any(a is not None and a.requires_grad for a in inputs):
        return
    for out in outputs:
        out.requires_grad = True
    tape.record_func(backward, [a for a in (*outputs, *inputs) if a is not None and a.requires_grad])


def grad_of(a: wp.array | None) -> wp.array | None:
    """``a.grad`` for an input that requires it, else None (its gradient is not wanted)."""
    return a.grad if a is not None and a.requires_grad else None
