"""Prepared calls of the mesh ops: the checked, packed device work of one call, kept per
workspace by everything it depends on except the caller's pointers, and replayed.

A call with a workspace and its outputs given (what the torch drop-in does) is checked,
viewed and packed once per *signature*: the op, the shape, strides, dtype and device of
every array argument, the options, and the workspace's threshold and allocation count
(which fix its scratch buffers). A repeated signature rewrites only the data pointers
that moved (the caller's arrays may be new memory each call) and runs the steps: no
validation, no Warp views, no argument packing.
"""

from __future__ import annotations

import collections
import functools
import weakref

import numpy as np
import warp as wp

from arc_warp._src.splat.workspace import Workspace

PLANS_PER_WORKSPACE = 64  # signatures kept per workspace (least recently used dropped first)

_SCALARS = frozenset((type(None), bool, int, float, str))
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Workspace -> _Cache


class _Unkeyed(Exception):
    """An argument whose value cannot be part of a signature (the call is planned afresh)."""


class Plan:
    """The device work of one call, in order: prepared launches and host steps (fills,
    marks), run by :meth:`run`. Built by an op's checks (all before any step runs).

    ``reusable``: the plan may be cached (a workspace that replays, outputs given); a
    builder whose work depends on more than the signature clears it. The builder sets
    ``result`` (the op's outputs at build time) and ``mode`` (the accumulation mode its
    tape backward uses). ``workspace`` is the call's during the build only: plans are
    cached by workspace, so a plan must not keep its workspace alive."""

    def __init__(self, workspace, reusable: bool):
        self.workspace = workspace
        self.reusable = reusable
        self.result = None
        self.mode = None
        self._steps: list = []
        self._packed: list = []  # (wp.Launch, args) of reusable launches, until bound
        self._keep: list = []  # arrays other than the slots that packed arguments point to
        self._binds: list = []  # per array slot: the packed array_t structs holding its pointer
        self._ptrs: list = []  # per array slot: the pointer the structs hold now

    def launch(self, kernel, dim, args: list, device, block_dim: int | None = None) -> None:
        """Queue ``wp.launch(kernel, dim, inputs=args)`` (off the tape); packed once when reusable."""
        if not self.reusable:
            self._steps.append(functools.partial(wp.launch, kernel, dim=dim, inputs=args, device=device,
                                                 block_dim=block_dim, record_tape=False))
            return
        cmd = wp.launch(kernel, dim=dim, inputs=args, device=device, block_dim=block_dim, record_cmd=True,
                        record_tape=False)
        if cmd is None:
            return  # Warp records no command for an empty launch
        if type(cmd) is not wp.Launch:
            self.reusable = False  # e.g. a deterministic-mode launch: its parameters live elsewhere
        cmd.fwd_args = None  # kept by Warp only for APIC capture; would pin this call's arrays
        self._packed.append((cmd, args))
        self._steps.append(cmd.launch)

    def step(self, fn) -> None:
        """Queue a host-side step (a fill, a mark) run in order with the launches."""
        self._steps.append(fn)

    def run(self) -> None:
        for fn in self._steps:
            fn()

    def bind(self, ptrs: list) -> bool:
        """After building with array slots at ``ptrs``: gives every packed argument that views
        a slot's memory a private struct whose pointer :meth:`rebind` rewrites; the other
        arrays (scratch, constants) stay referenced. False when two non-empty slots share
        memory (which struct belongs to which slot is then unknown): not cacheable."""
        slot_of = {}
        for i, p in enumerate(ptrs):
            if p:
                if p in slot_of:
                    return False
                slot_of[p] = i
        self._binds = [[] for _ in ptrs]
        self._ptrs = list(ptrs)
        for cmd, args in self._packed:
            for i, a in enumerate(args):
                if not isinstance(a, wp.array):
                    continue
                slot = slot_of.get(a.ptr) if a.size else None
                if slot is None:
                    self._keep.append(a)  # its packed pointer must stay valid while the plan lives
                    continue
                struct = type(cmd.params[i + 1]).from_buffer_copy(cmd.params[i + 1])  # the array's own is shared
                cmd.set_param_at_index_from_ctype(i, struct)
                self._binds[slot].append(struct)
        self._packed = []
        return True

    def rebind(self, ptrs: list) -> None:
        """Point the packed arguments at this call's slots (only those that moved)."""
        old = self._ptrs
        for i, p in enumerate(ptrs):
            if p != old[i]:
                for struct in self._binds[i]:
                    struct.data = p
                old[i] = p


class _Cache:
    """A workspace's plans by signature, valid for one allocation count."""

    def __init__(self):
        self.allocations = -1
        self.plans: collections.OrderedDict = collections.OrderedDict()


def _option(value):
    """``value`` as a hashable key part that tells apart what compares equal across types
    (1, 1.0 and True), or raises _Unkeyed."""
    t = type(value)
    if t in _SCALARS:
        return t, value
    if t is tuple or t is list:
        types = tuple(map(type, value))
        if _SCALARS.issuperset(types):
            return t, tuple(value), types
        return t, tuple(map(_option, value))
    if t is np.ndarray:
        return t, value.dtype.str, value.shape, value.tobytes()
    raise _Unkeyed


def _signature(op: str, arrays: tuple, options: tuple, workspace) -> tuple[tuple, list]:
    """(key, pointers) of a call; raises _Unkeyed for an argument that is not keyable."""
    parts, ptrs = [], []
    for a in arrays:
        if a is None:
            parts.append(None)
        elif type(a) is wp.array:
            parts.append((a.shape, a.strides, a.dtype, a.device.alias))
            ptrs.append(a.ptr)
        else:
            raise _Unkeyed
    return (op, tuple(parts), _option(options), workspace.keyed_threshold), ptrs


def pair(out) -> tuple:
    """The outputs of an ``out=(a, b)`` argument for :func:`prepared` (``(None,)``, which
    plans afresh, for anything but a pair)."""
    return tuple(out) if type(out) in (tuple, list) and len(out) == 2 else (None,)


def prepared(workspace, op: str, arrays: tuple, outputs: tuple, options: tuple, build) -> tuple[Plan, bool]:
    """(plan, reused) of a call: ``build(plan)`` checks the arguments and queues the work
    (raising before any of it runs), or, with a ``workspace`` (an ``arc_warp.Workspace``
    that replays) that has a plan of the same signature, that plan pointed at this call's
    arrays. ``arrays`` are the array arguments read (None for absent ones), ``outputs``
    the arrays written and returned (None: a new one, so the call is planned afresh),
    ``options`` every other value the work depends on. An argument that is neither a
    plain wp.array nor a keyable value also plans afresh (the build then says what is
    wrong with it)."""
    cache = key = None
    if isinstance(workspace, Workspace) and workspace.replay and all(o is not None for o in outputs):
        try:
            key, ptrs = _signature(op, arrays + outputs, options, workspace)
        except _Unkeyed:
            key = None
        if key is not None:
            cache = _plans.get(workspace)
            if cache is None:
                cache = _plans[workspace] = _Cache()
            if cache.allocations != workspace.allocations:  # scratch buffers moved
                cache.plans.clear()
                cache.allocations = workspace.allocations
            plan = cache.plans.get(key)
            if plan is not None:
                cache.plans.move_to_end(key)
                plan.rebind(ptrs)
                return plan, True
    plan = Plan(workspace, key is not None)
    build(plan)
    plan.workspace = None
    if plan.reusable and workspace.allocations == cache.allocations and plan.bind(ptrs):
        cache.plans[key] = plan
        if len(cache.plans) > PLANS_PER_WORKSPACE:
            cache.plans.popitem(last=False)
    return plan, False
