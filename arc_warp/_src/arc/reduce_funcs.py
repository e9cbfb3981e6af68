"""ARC accumulators: add per-lane values into an array, reducing in the warp first.

``accumulator(dtype, mode)`` returns a ``@wp.func`` ::

    add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int)

that adds ``value`` into ``dest[index]`` for every lane whose ``valid`` is true.
Modes (compile-time specialisations of one body):

``atomic``
    One atomic add per lane: per component, as Warp's generated adjoints do, except that
    vectors go out as float4 / float2 atomics on sm_90 and later (:func:`lane_atomic_add`).
``warp``
    Always reduce in the warp (gsplat's approach). The valid lanes are reduced in
    rounds, one per distinct index, lowest lane's index first; a warp whose lanes
    share one index (the common case in a tiled rasteriser) takes one round: a
    recursive-halving reduce-scatter sums the K values over the warp and K
    different lanes issue the K component atomics.
``serial``
    Like ``warp``, but each round's lanes come from ``match_any`` on the index
    (ARC-SW serialised), computed once for the whole warp.
``arc``
    Adaptive: one ballot counts the valid lanes, and a warp with fewer than
    ``threshold`` of them issues raw atomics, which are cheaper when few lanes
    are active. Otherwise lanes whose target is shared by fewer than
    ``threshold`` valid lanes (counted with match-any) still add with raw
    atomics, and the others take the rounds of ``warp``; under ``uniform_index``
    the one target is the warp's and no match-any runs. ``threshold`` comes from
    :func:`arc_warp.resolve_threshold` (calibrated per GPU).
``floor``
    Benchmark-only: reduces nothing and adds nothing. It keeps ``value`` alive so
    a kernel built with it costs what the same kernel would cost with free
    gradient accumulation.

Every raw (per-lane) add of every mode goes through :func:`lane_atomic_add`.

Convergence: every function here is safe to call from any subset of a warp's
lanes. :func:`warp_plan` (and so :func:`accumulator`) returns ``False`` unless the
whole warp executes the call together (:func:`~.intrinsics.warp_converged`, one
``__activemask()`` compare), so a ragged launch ``dim``, an early ``return`` or a
divergent call site gives raw atomics, never a wrong sum; only the speed depends on
convergence. The reducer itself must be reached only by the warps whose plan is
``True``, with no divergence between the plan and the reducer.

:data:`MODES` also lists ``deterministic``, which no per-lane accumulator can be
(atomics add in any order): ``scatter_add`` and the rasteriser backward implement it
for a whole launch, by sorting and summing in a fixed order.
"""

import functools

import warp as wp

from .intrinsics import (
    ballot,
    cpu_warp_emulation,
    emulation_block_max,
    lane_id,
    lowest_lane,
    match_any,
    popc,
    reduce_scatter,
    shfl_int,
    warp_converged,
)
from .vector_atomics import vector_atomic_add

ACCUMULATOR_MODES = ("atomic", "warp", "serial", "arc", "floor")
"""Modes of :func:`accumulator`, :func:`warp_plan` and :func:`warp_reducer` (``floor``: benchmarks only)."""

MODES = ACCUMULATOR_MODES + ("deterministic",)
"""Reduction modes of ``scatter_add`` and ``RenderSettings.reduce``: the accumulator modes,
and ``deterministic`` (bit-identical sums from run to run, summed in a fixed order)."""

_PER_LANE_MODES = ("atomic", "floor")
"""Modes that never reduce in the warp: each valid lane adds (or, for floor, drops) its value."""

# A value no real gradient takes: `floor` stores only if a component equals it,
# which never happens but stops the compiler from deleting the computation.
_FLOOR_SENTINEL = 3.0e38


def vector_length(dtype) -> int:
    """Number of float32 components of an accumulator dtype; raises for anything else."""
    if dtype is wp.float32 or dtype is float:
        return 1
    if wp.types.type_is_vector(dtype) and dtype._wp_scalar_type_ is wp.float32:
        return int(dtype._length_)
    raise TypeError(
        f"accumulator dtype must be wp.float32 or a float32 vector (wp.vec2, wp.vec3, wp.vec4, "
        f"wp.types.vector(K, wp.float32)); got {dtype!r}"
    )


def _type_tag(dtype) -> str:
    """Short name of an accumulator dtype for generated function names: ``f32`` or ``v<K>``."""
    return f"v{vector_length(dtype)}" if wp.types.type_is_vector(dtype) else "f32"


def check_mode(mode: str, accumulating: bool = True) -> str:
    """Returns ``mode`` if it is one of :data:`ACCUMULATOR_MODES` (``accumulating``) or
    :data:`MODES`, else raises ``ValueError``."""
    if accumulating and mode == "deterministic":
        raise ValueError(
            "reduce mode 'deterministic' orders a whole launch's sums, which a per-lane accumulator "
            "cannot do; use arc_warp.scatter_add(..., mode='deterministic') or "
            "RenderSettings(reduce='deterministic'), or pick one of " + str(ACCUMULATOR_MODES)
        )
    if mode not in MODES:
        raise ValueError(f"reduce mode must be one of {MODES}; got {mode!r}")
    return mode


@functools.cache
def _component_ops(dtype):
    """Typed helpers for one dtype: (to_vec, component_add, VecK)."""
    vec_k = wp.types.vector(vector_length(dtype), wp.float32)

    # One stub name for every dtype: Warp resolves them as overloads by the type of dest.
    @wp.func_native("wp::atomic_add(((float*)wp::address(dest, index)) + comp, value);")
    def component_add(dest: wp.array(dtype=dtype), index: int, comp: int, value: float): ...

    def to_vec(value: dtype):
        return vec_k(value)

    to_vec = wp.func(to_vec, name=f"arc_to_vec_{_type_tag(dtype)}", module="unique")
    return to_vec, component_add, vec_k


@functools.cache
def lane_atomic_add(dtype):
    """``add(dest, index, value)``: one lane's atomic ``dest[index] += value``.

    ``wp.atomic_add`` for ``wp.float32``; for a vector of ``K >= 2`` floats,
    :func:`~.vector_atomics.vector_atomic_add` (float4 / float2 atomics on sm_90 and
    later, by the element's alignment; scalar atomics before). Every per-lane add of
    this module goes through it.
    """
    if vector_length(dtype) >= 2:
        return vector_atomic_add(dtype)

    def add(dest: wp.array(dtype=dtype), index: int, value: dtype):
        wp.atomic_add(dest, index, value)

    return wp.func(add, name=f"arc_lane_atomic_add_{_type_tag(dtype)}", module="unique")


def lane_adder(dtype, mode: str):
    """``add(dest, index, value, valid, threshold)``: the per-lane add of ``mode``.

    What a kernel calls where a warp's plan is ``False`` (see :func:`warp_plan`):
    :func:`lane_atomic_add` for every mode but ``floor``, which adds nothing.
    """
    return _lane_add(dtype, "floor" if check_mode(mode) == "floor" else "atomic")


@functools.cache
def _lane_add(dtype, kind: str):
    to_vec, _, _ = _component_ops(dtype)
    atomic_add = lane_atomic_add(dtype)

    def add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int):
        if wp.static(kind == "atomic"):
            if valid:
                atomic_add(dest, index, value)
        else:
            v = to_vec(value)
            if valid and v[0] == wp.static(_FLOOR_SENTINEL):
                dest[index] = value

    return wp.func(add, name=f"arc_lane_add_{kind}_{_type_tag(dtype)}", module="unique")


@functools.cache
def warp_plan(mode: str = "arc"):
    """Returns the ``@wp.func`` ``plan(valid: bool, threshold: int) -> bool`` of ``mode``.

    ``True`` means the warp reduces: every lane, valid or not, then calls the
    reducer of :func:`warp_reducer`, with no branch between the two that could split
    the warp. ``False`` means each valid lane adds its value atomically
    (:func:`lane_atomic_add`: ``wp.atomic_add``, or float4 / float2 atomics for vectors on
    sm_90 and later).
    ``arc`` reduces when at least ``threshold`` lanes are valid, ``warp`` and
    ``serial`` when any lane is, ``atomic`` and ``floor`` never.

    Convergence guard: the plan is ``False`` unless all 32 lanes execute the call
    together (one ``__activemask()`` compare, :func:`~.intrinsics.warp_converged`).
    A launch ``dim`` that is not a multiple of 32, lanes that returned early or a
    divergent call site therefore give per-lane atomics: the sum is always right,
    and full warps (the common case) keep the fast path. A CPU warp of one lane
    never reduces; in CPU warp emulation the plan is ``True`` in every warp of a
    block whose lanes are all live and ``False`` in the whole block otherwise
    (emulated collectives sync the block). Otherwise the decision is one ballot
    and one population count.

    Planning before computing the values lets a kernel compute them inside the
    branch that adds them, which keeps sparse warps as cheap as plain atomics::

        if plan_fn(valid, threshold):
            reduce_fn(dest, i, gradient(...), valid, threshold)  # every lane computes
        elif valid:
            wp.atomic_add(dest, i, gradient(...))

    Computing in every lane of a reducing warp is free on SIMT hardware (the warp
    issues those instructions anyway), and no register set has to merge the values
    of valid and invalid lanes after a branch. :func:`accumulator` is the simpler
    form for values computed before the call.
    """
    check_mode(mode)
    arc = mode == "arc"

    def plan(valid: bool, threshold: int) -> bool:
        if wp.static(mode in _PER_LANE_MODES):
            return False
        if not warp_converged():
            return False
        if cpu_warp_emulation():
            return True
        n = popc(ballot(-1, valid))
        if wp.static(arc):
            return n >= threshold
        return n > 0

    return wp.func(plan, name=f"arc_plan_{mode}", module="unique")


@functools.cache
def warp_reducer(dtype, mode: str = "arc", uniform_index: bool = False):
    """Returns the ``@wp.func`` ``reduce(dest, index, value, valid, threshold)`` for ``dtype``.

    Adds ``value`` of the lanes whose ``valid`` is true into ``dest[index]`` by
    reducing in the warp; call it from every lane of a warp whose plan is ``True``
    (see :func:`warp_plan`), with the same ``valid`` and ``threshold``, and only
    there: its collectives assume the full, converged warp that the plan checked. Arguments as
    for :func:`accumulator`. ``value`` of invalid lanes is ignored. For ``atomic``
    and ``floor``, whose plan is never ``True``, it is the per-lane add of that mode.
    """
    check_mode(mode)
    k = vector_length(dtype)
    if k > 32:
        raise ValueError(f"accumulators handle at most 32 components; got {k}")
    if mode in _PER_LANE_MODES:
        # Never planned, but callable, so one kernel body serves every mode.
        return lane_adder(dtype, mode)
    to_vec, component_add, vec_k = _component_ops(dtype)
    atomic_add = lane_atomic_add(dtype)
    reduce_scatter_k, owned_component = reduce_scatter(k)
    arc = mode == "arc"

    def reduce(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int):
        # One round per distinct index among the reducing lanes, lowest lane's index
        # first. Under uniform_index (the rasteriser's case) that is one round, and
        # no match-any runs.
        mask = int(-1)  # the plan ran on a full, converged warp
        emulate = cpu_warp_emulation()
        lane = lane_id()
        pending = ballot(mask, valid)
        if pending == 0 and not emulate:
            # no lane adds (a planned warp's unused taps): the whole warp leaves together,
            # before the match-any (emulated collectives sync the block: no early exit there)
            return
        peers = 0
        if wp.static(mode == "serial" or (arc and not uniform_index)) or emulate:
            peers = match_any(mask, index) & pending
        reducing = valid
        if wp.static(arc and not uniform_index) or (wp.static(arc) and emulate):
            # A target shared by fewer than T valid lanes gets raw atomics. Under
            # uniform_index the one target is the warp's, which the plan counted
            # (emulation plans no count, so it counts here).
            reducing = valid and popc(peers) >= threshold
            if valid and not reducing:
                atomic_add(dest, index, value)
            pending = ballot(mask, reducing)
        # One index per warp needs one round; otherwise at most one per lane.
        rounds = wp.static(1 if uniform_index else 32)
        if emulate and wp.static(not uniform_index):
            # Emulated collectives sync the whole block: every warp runs the same rounds.
            rounds = emulation_block_max(popc(ballot(mask, reducing and lowest_lane(peers) == lane)))
        for _r in range(rounds):
            if pending == 0 and not emulate:
                break
            key = index
            member = reducing
            members = pending
            if wp.static(mode == "serial"):
                # ARC-SW serialised: the leader's match-any group is the round.
                leader = lowest_lane(pending)
                key = shfl_int(mask, index, leader)
                members = shfl_int(mask, peers, leader)
                member = ((members >> lane) & 1) != 0
            elif wp.static(not uniform_index):
                key = shfl_int(mask, index, lowest_lane(pending))
                member = ((pending >> lane) & 1) != 0 and index == key
                members = ballot(mask, member)
            part = vec_k()
            if member:
                part = to_vec(value)
            total = reduce_scatter_k(mask, part)
            comp = owned_component(lane)
            if members != 0 and comp >= 0:
                component_add(dest, key, comp, total)
            pending = pending & ~members

    tag = f"{mode}_{_type_tag(dtype)}{'_u' if uniform_index else ''}"
    return wp.func(reduce, name=f"arc_reduce_{tag}", module="unique")


KEYED_SCREEN_RUNS = wp.constant(4)
"""Runs of consecutive lanes a key's lanes may form for :func:`keyed_plan`'s screen to be exact:
the rows of the 8 x 4 pixel patch a warp covers in the mesh kernels' tiled launches."""


@functools.cache
def keyed_plan(mode: str = "arc"):
    """Returns the ``@wp.func`` ``plan(key: int, valid: bool, threshold: int) -> bool``:
    :func:`warp_plan` for kernels whose lanes aim at different targets, decided once for
    several adds.

    A thread that makes several adds per call (a pixel's texel taps, its triangle's three
    vertices) plans once with ``key``, one target representative of its adds (the first
    tap's texel, the triangle). Under ``arc`` the warp reduces only if some ``key`` is
    shared by at least ``threshold`` valid lanes (one match-any); otherwise every add of
    the warp goes out as a per-lane atomic, with no collective in between, which is as
    cheap as ``atomic`` mode. Pass the (warp-uniform) result to the adds of
    :func:`planned_accumulator`. Other modes plan as :func:`warp_plan`; the convergence
    guard is the same.

    A screen runs before the match-any, which costs more than the rest of the plan: the
    warp plans on only if at least ``threshold - 4`` lanes hold the key of the lane after
    them and ``threshold - 8`` that of the lane two after. A key held by ``g`` lanes lying
    in at most 4 runs of consecutive lanes gives at least ``g - 4`` and ``g - 8`` of them,
    so the screen keeps every warp that can reduce when each key's lanes form at most 4
    runs: a convex footprint (a texel cell, a triangle) in the 8 x 4 pixel patch of a
    tiled launch (:func:`arc_warp._src.mesh.funcs.tile_pixel`), or a run of a 1D launch.
    Elsewhere it may send a warp's adds as atomics where the match-any would have
    reduced them; the sums are the same either way.
    """
    check_mode(mode)
    counted = warp_plan(mode)

    def plan(key: int, valid: bool, threshold: int) -> bool:
        if not counted(valid, threshold):
            return False
        if wp.static(mode != "arc"):
            return True
        if cpu_warp_emulation():  # emulated collectives sync the block: no per-warp decision
            return True
        mask = int(-1)  # counted() ran on a full, converged warp
        lane = lane_id()
        next1 = shfl_int(mask, key, wp.min(lane + 1, 31))
        next2 = shfl_int(mask, key, wp.min(lane + 2, 31))
        if popc(ballot(mask, lane < 31 and next1 == key)) < threshold - KEYED_SCREEN_RUNS:
            return False
        if popc(ballot(mask, lane < 30 and next2 == key)) < threshold - 2 * KEYED_SCREEN_RUNS:
            return False
        peers = match_any(mask, key) & ballot(mask, valid)
        return ballot(mask, valid and popc(peers) >= threshold) != 0

    return wp.func(plan, name=f"arc_keyed_plan_{mode}", module="unique")


@functools.cache
def planned_accumulator(dtype, mode: str = "arc", uniform_index: bool = False):
    """Returns the ``@wp.func`` ``add(dest, index, value, valid, threshold, planned: bool)``:
    :func:`accumulator` with the warp's plan passed in (``planned``, from
    :func:`warp_plan` or :func:`keyed_plan`, the same in every lane of the warp). A
    planned warp reduces (every lane must call, valid or not, as for
    :func:`warp_reducer`); otherwise each valid lane adds with :func:`lane_atomic_add`.
    Arguments otherwise as for :func:`accumulator`, whose adds are this one's with the
    plan made per call."""
    check_mode(mode)
    reduce_fn = warp_reducer(dtype, mode, uniform_index)  # validates dtype
    atomic_add = lane_atomic_add(dtype)

    def add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int, planned: bool):
        if wp.static(mode in _PER_LANE_MODES):
            reduce_fn(dest, index, value, valid, threshold)
        elif planned:
            reduce_fn(dest, index, value, valid, threshold)
        elif valid:
            atomic_add(dest, index, value)

    tag = f"{mode}_{_type_tag(dtype)}{'_u' if uniform_index else ''}"
    return wp.func(add, name=f"arc_planned_add_{tag}", module="unique")


@functools.cache
def accumulator(dtype, mode: str = "arc", uniform_index: bool = False):
    """Returns the ``@wp.func`` ``add(dest, index, value, valid, threshold)`` for ``dtype``.

    Args:
        dtype: ``wp.float32``, ``wp.vec2``, ``wp.vec3``, ``wp.vec4`` or any
            ``wp.types.vector(K, wp.float32)`` (for example the 9 per-splat
            gradients of 3DGS packed in one vector), ``K <= 32``.
        mode: one of :data:`ACCUMULATOR_MODES`.
        uniform_index: the caller guarantees that all lanes of a warp pass the same
            ``index`` (as in a tile rasteriser, where a block walks one primitive at a
            time). Skips the per-call check for mixed indices; results are undefined
            if the promise is broken.

    The returned function has the signature
    ``add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int)``;
    ``threshold`` matters only for ``arc``. It runs :func:`warp_plan` (which checks
    that the warp is full and converged) and then the reducer of :func:`warp_reducer`
    or per-lane atomics, so any subset of a warp's lanes may call it. Cached per
    (dtype, mode, uniform_index).
    """
    check_mode(mode)
    plan_fn = warp_plan(mode)
    planned_add = planned_accumulator(dtype, mode, uniform_index)  # validates dtype

    def add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int):
        # the plan is False unless the warp is full and converged
        planned_add(dest, index, value, valid, threshold, plan_fn(valid, threshold))

    tag = f"{mode}_{_type_tag(dtype)}{'_u' if uniform_index else ''}"
    return wp.func(add, name=f"arc_add_{tag}", module="unique")
