"""ARC accumulators: add per-lane values into an array, reducing in the warp first.

``accumulator(dtype, mode)`` returns a ``@wp.func`` ::

    add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int)

that adds ``value`` into ``dest[index]`` for every lane whose ``valid`` is true.
Modes (compile-time specialisations of one body):

``atomic``
    One atomic per lane per component: what Warp's generated adjoints do.
``warp``
    Always reduce in the warp. When all valid lanes share one index (the common
    case in a tiled rasterizer) one recursive-halving reduce-scatter sums the K
    values over the warp and K different lanes issue the K component atomics.
    Mixed indices take the grouped path of ``serial``.
``serial``
    Group lanes by index with match-any and reduce each group in its own round
    of the reduce-scatter (one round per distinct index).
``arc``
    Adaptive: the valid lanes count themselves inside their own branch (the
    population of the active mask); fewer than ``threshold`` issue raw atomics
    there, with no collective at all, which is what sparse warps want. Otherwise
    only the lanes whose index is shared by at least ``threshold`` valid lanes
    are reduced. ``threshold`` comes from :func:`arc_warp.resolve_threshold`
    (calibrated per GPU).
``floor``
    Benchmark-only: reduces nothing and adds nothing. It keeps ``value`` alive so
    a kernel built with it costs what the same kernel would cost with free
    gradient accumulation.

Every lane of the warp must reach the call (no early ``return`` before it). On
the GPU a warp that is not fully converged at the call uses raw atomics, so the
sum is always right; only the speed depends on convergence.
"""

import functools

import warp as wp

from .intrinsics import (
    active_lane_count,
    active_mask,
    ballot,
    cpu_warp_emulation,
    emulation_block_max,
    lane_id,
    lowest_lane,
    match_any,
    popc,
    reduce_scatter,
    shfl_int,
    warp_width,
)

MODES = ("atomic", "warp", "serial", "arc", "floor")
"""Reduction modes accepted by :func:`accumulator` (``floor`` is for benchmarks only)."""

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


def check_mode(mode: str) -> str:
    """Returns ``mode`` if it is one of :data:`MODES`, else raises ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"reduce mode must be one of {MODES}; got {mode!r}")
    return mode


@functools.cache
def _component_ops(dtype):
    """Typed helpers for one dtype: (to_vec, component_add, VecK)."""
    k = vector_length(dtype)
    vec_k = wp.types.vector(k, wp.float32)
    tname = "f32" if k == 1 and not wp.types.type_is_vector(dtype) else f"v{k}"

    # One stub name for every dtype: Warp resolves them as overloads by the type of dest.
    @wp.func_native("wp::atomic_add(((float*)wp::address(dest, index)) + comp, value);")
    def component_add(dest: wp.array(dtype=dtype), index: int, comp: int, value: float): ...

    def to_vec(value: dtype):
        return vec_k(value)

    to_vec = wp.func(to_vec, name=f"arc_to_vec_{tname}", module="unique")
    return to_vec, component_add, vec_k


@functools.cache
def accumulator(dtype, mode: str = "arc", uniform_index: bool = False):
    """Returns the ``@wp.func`` ``add(dest, index, value, valid, threshold)`` for ``dtype``.

    Args:
        dtype: ``wp.float32``, ``wp.vec2``, ``wp.vec3``, ``wp.vec4`` or any
            ``wp.types.vector(K, wp.float32)`` (for example the 9 per-splat
            gradients of 3DGS packed in one vector), ``K <= 32``.
        mode: one of :data:`MODES`.
        uniform_index: the caller guarantees that all lanes of a warp pass the same
            ``index`` (as in a tile rasteriser, where a block walks one primitive at a
            time). Skips the per-call check for mixed indices; results are undefined
            if the promise is broken.

    The returned function has the signature
    ``add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int)``;
    ``threshold`` matters only for ``arc``. Cached per (dtype, mode, uniform_index).
    """
    check_mode(mode)
    k = vector_length(dtype)
    if k > 32:
        raise ValueError(f"accumulators handle at most 32 components; got {k}")
    to_vec, component_add, vec_k = _component_ops(dtype)
    reduce_scatter_k, owned_component = reduce_scatter(k)
    arc = mode == "arc"

    def add(dest: wp.array(dtype=dtype), index: int, value: dtype, valid: bool, threshold: int):
        if wp.static(mode == "atomic"):
            if valid:
                wp.atomic_add(dest, index, value)
        elif wp.static(mode == "floor"):
            v = to_vec(value)
            if valid and v[0] == wp.static(_FLOOR_SENTINEL):
                dest[index] = value
        else:
            # CPU emulation syncs the whole block: there, every collective runs
            # whatever the branch, so all warps of a block meet the same barriers.
            emulate = cpu_warp_emulation()
            dense = valid
            if wp.static(arc):
                # Decide inside the branch, where the active mask is the set of valid
                # lanes: a sparse warp then costs one popc more than plain atomics.
                if valid and not emulate:
                    if active_lane_count() < threshold:
                        wp.atomic_add(dest, index, value)
                        dense = False
            mask = active_mask()
            if mask != -1 or warp_width() != 32:
                # Not a converged 32-lane warp (or a CPU warp of one lane): shuffles
                # would read absent lanes, so every lane adds for itself.
                if dense:
                    wp.atomic_add(dest, index, value)
                return
            vmask = ballot(mask, dense)
            if vmask == 0 and not emulate:
                return
            lane = lane_id()
            x = vec_k()
            if dense:
                x = to_vec(value)
            uniform = wp.static(uniform_index)
            key = index
            if wp.static(mode != "serial" and not uniform_index):
                key = shfl_int(mask, index, lowest_lane(vmask))
                strays = ballot(mask, dense and index != key)
                uniform = strays == 0
            # One index for the whole warp (the rasteriser's case): reduce-scatter x as is.
            # On the GPU the dense lanes of arc already number at least T.
            direct = uniform and vmask != 0 and (wp.static(not arc) or not emulate or popc(vmask) >= threshold)
            if direct or emulate:
                total = reduce_scatter_k(mask, x)
                comp = owned_component(lane)
                if direct and comp >= 0:
                    component_add(dest, key, comp, total)
            if uniform and not direct and dense:
                wp.atomic_add(dest, index, value)
            # Mixed indices: reduce each index shared by enough lanes in its own round.
            if wp.static(not uniform_index):
                if not uniform or emulate:
                    peers = match_any(mask, index) & vmask
                    big = dense and not uniform and (wp.static(not arc) or popc(peers) >= threshold)
                    if dense and not uniform and not big:
                        wp.atomic_add(dest, index, value)
                    pending = ballot(mask, big)
                    rounds = popc(ballot(mask, big and lowest_lane(peers) == lane))
                    if emulate:
                        rounds = emulation_block_max(rounds)
                    for _r in range(rounds):
                        key = shfl_int(mask, index, lowest_lane(pending))
                        member = ((pending >> lane) & 1) != 0 and index == key
                        members = ballot(mask, member)
                        part = vec_k()
                        if member:
                            part = x
                        total = reduce_scatter_k(mask, part)
                        comp = owned_component(lane)
                        if members != 0 and comp >= 0:
                            component_add(dest, key, comp, total)
                        pending = pending & ~members

    tname = f"v{k}" if wp.types.type_is_vector(dtype) else "f32"
    suffix = f"{mode}_{tname}{'_u' if uniform_index else ''}"
    return wp.func(add, name=f"arc_add_{suffix}", module="unique")
