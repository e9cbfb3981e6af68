"""Prepared device work: kernel launches recorded once and run again (:class:`Launches`;
``wp.launch`` checks and packs every argument each time, about 25 us of host time for a
dozen arguments, a recorded ``wp.Launch`` runs again in a few), and whole calls kept as
plans (:class:`Plan`) by the memory they run on (:class:`Bindings`), so that a call
repeated on the same memory (a training loop's steady state) does not even run its Python."""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import warp as wp

_REPACK = object()  # the signature of an argument that is always repacked (structs, vectors)

BINDINGS = 64  # entries a Bindings keeps: views and plans of a few training steps' memory


def ptr(a: wp.array | None) -> int:
    """An optional array's pointer for a key (0: none)."""
    return 0 if a is None else a.ptr


class View(NamedTuple):
    """A launch argument: contiguous ``array``'s memory as a ``shape`` array of ``dtype``,
    made a Warp array only when it is packed."""

    array: wp.array
    dtype: type
    shape: tuple


def made(arg):
    """A launch argument as ``wp.launch`` takes it: a :class:`View` made a (non-owning) Warp
    array, the caller keeping its array alive through the launch."""
    if type(arg) is View:
        return wp.array(ptr=arg.array.ptr, dtype=arg.dtype, shape=arg.shape, device=arg.array.device)
    return arg


def signature(arg):
    """What must be unchanged for a packed launch argument to be reused."""
    if type(arg) is View:
        return (arg.array.ptr, arg.dtype, arg.shape)
    if isinstance(arg, wp.array):
        return (arg.ptr, arg.shape, arg.strides)
    if arg is None or isinstance(arg, (bool, int, float)):
        return arg
    return _REPACK


class Launches:
    """The prepared launches of one object on ``device`` (its current stream), by launch
    site. ``record`` False launches through ``wp.launch`` every time: an object used for one
    call (a render without a workspace) would pay for recording and gain nothing."""

    def __init__(self, device, record: bool = True):
        self.device = wp.get_device(device)
        self.record = record
        # (kernel, key) -> [wp.Launch, dim, argument signatures, previous (signature, ctype)s]
        self._sites: dict = {}
        self._steps: list | None = None  # the steps of the plan being recorded (recorded)

    def launch(self, kernel, dim, args: list, block_dim: int | None = None, key=None) -> None:
        """``wp.launch(kernel, dim, inputs=args, block_dim=block_dim)`` on the device's
        current stream, off any tape, repacking only the arguments whose pointer, shape,
        strides or value changed (or taking the packing before the last one: a loop's
        outputs alternate between two buffers). ``key`` names the site where one kernel is
        launched at several places of a call (per camera, say)."""
        if dim == 0:
            return  # Warp records no command for an empty launch
        key = (kernel, key)
        site = self._sites.get(key) if self.record and self._steps is None else None
        if site is None:
            cmd = wp.launch(kernel, dim=dim, inputs=[made(a) for a in args], device=self.device, block_dim=block_dim,
                            record_cmd=self.record, record_tape=False)
            if cmd is None:  # not recording: launched
                return
            cmd.fwd_args = None  # kept by Warp only for APIC capture; it would pin the arrays
            if self._steps is not None:  # a plan's launch of its own: its arguments never change
                self._steps.append(cmd.launch)
            else:
                self._sites[key] = [cmd, dim, [signature(a) for a in args], [None] * len(args)]
        else:
            cmd, old_dim, signatures, previous = site
            if dim != old_dim:
                cmd.set_dim(dim)
                site[1] = dim
            for i, arg in enumerate(args):
                sig = signature(arg)
                if sig is _REPACK or sig != signatures[i]:
                    if type(sig) is not tuple:  # a value, or always repacked
                        cmd.set_param_at_index(i, made(arg))
                    else:  # an array: the packing before the last one, or a new one
                        last, before = (signatures[i], cmd.params[i + 1]), previous[i]
                        if before is not None and before[0] == sig:
                            cmd.set_param_at_index_from_ctype(i, before[1])
                        else:
                            cmd.set_param_at_index(i, made(arg))
                        previous[i] = last
                    signatures[i] = sig
        cmd.launch()

    def call(self, fn, *args, **kwargs) -> None:
        """``fn(*args, **kwargs)``: device work that is not a kernel launch (a fill, a copy,
        a sort, an event), made part of the plan being recorded."""
        fn(*args, **kwargs)
        if self._steps is not None:
            self._steps.append(functools.partial(fn, *args, **kwargs))

    def recorded(self, body) -> list:
        """``body()``, its device work queued as usual and also kept as the steps of a plan."""
        self._steps = steps = []
        try:
            body()
        finally:
            self._steps = None
        return steps


class Plan:
    """A call's recorded device work, run again on the same memory: step by step on the CPU;
    on CUDA captured into a graph when it first repeats (on the caller's capture stream:
    torch's legacy default stream cannot capture; relaxed, as a garbage collection during
    the capture may free CUDA memory), then launched whole."""

    __slots__ = ("steps", "graph", "device")

    def __init__(self, steps: list, device):
        self.steps, self.device, self.graph = steps, device, None

    def run(self, capture_stream: wp.Stream | None = None) -> None:
        """The steps again; with a ``capture_stream`` (CUDA) as one graph launch."""
        if capture_stream is None:
            for step in self.steps:
                step()
            return
        if self.graph is None:  # the steps launch on the device's current stream: the capture's, here
            with wp.ScopedStream(capture_stream, sync_enter=False, sync_exit=False), \
                    wp.ScopedCapture(self.device, stream=capture_stream, force_module_load=False,
                                     capture_mode=wp.CaptureMode.RELAXED) as capture:
                for step in self.steps:
                    step()
            self.graph = capture.graph
        wp.capture_launch(self.graph)


class LRU:
    """Values by key, made on first use (:meth:`get`) and kept until more than ``limit`` are
    held: then the least recently used one is dropped."""

    def __init__(self, limit: int):
        self.limit = limit
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def values(self):
        """The values held, least recently used first."""
        return self._entries.values()

    def get(self, key: tuple, make):
        """The value of ``key``, made by ``make()`` if not held."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = make()
            if len(self._entries) > self.limit:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        return entry


class Bindings(LRU):
    """The one place where an object (a renderer, a mesh op) keeps its calls' pointers: values
    made of their memory (:meth:`bound`: Warp views, say) and the plans of calls on it
    (:meth:`run`), keyed by a tuple naming the memory (pointers, and the shapes and values the
    value or plan depends on); a few training steps' worth (torch's caching allocator hands
    the same memory back), kept alive by the caller while it uses them. ``launches``: the
    owner's :class:`Launches`, which records plans."""

    def __init__(self, launches: Launches, limit: int = BINDINGS):
        super().__init__(limit)
        self._launches = launches

    # what make() builds of the memory key names, made once (a Warp view costs about 4 us of
    # host time; launches that take the same one repack nothing)
    bound = LRU.get

    def run(self, key: tuple, body, capture_stream: wp.Stream | None = None) -> None:
        """``body()``, the device work of a call on the memory ``key`` names (everything its
        launches depend on): run as it is the first time, recorded into a :class:`Plan` the
        second, replayed from it after (``capture_stream``: :meth:`Plan.run`'s); always run
        as it is without recording launches (``Launches(record=False)``)."""
        if not self._launches.record:
            body()
            return
        plan = self._entries.get(key)
        if plan is None:  # seen once: remembered, not recorded (most keys of a one-off call never repeat)
            self.bound(key, lambda: False)
            body()
        elif plan is False:  # the launches queued meanwhile also append their steps
            self._entries[key] = Plan(self._launches.recorded(body), self._launches.device)
        else:
            self._entries.move_to_end(key)
            plan.run(capture_stream)
